"""Summarise an Nsight Compute raw-page CSV (`ncu --import R.ncu-rep --page raw --csv`) of the
fused attention kernels: duration, issue activity, pipe utilisation, warp stall reasons
per issued instruction, spills. Prints a markdown table, one column per profiled kernel launch.

With --source, the CSV (or .csv.gz) is a source page of one kernel (`ncu --import R.ncu-rep --page
source --csv --print-source sass`): where the sampled warps stood, as shares of all warp-state
samples by reason (with the opcodes that hold most of each) and the hottest instructions.

Usage:
    python benchmarks/ncu_summary.py benchmarks/results/ncu/pope-16k.csv
    python benchmarks/ncu_summary.py --source benchmarks/results/ncu/tapa-gluon-16k-source.csv.gz
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip

ROWS = [
    ("duration (ms)", "gpu__time_duration.sum"),
    ("registers / thread", "launch__registers_per_thread"),
    ("warps per scheduler", "smsp__warps_active.avg.per_cycle_active"),
    ("issue slots busy (%)", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    ("tensor pipe (%)", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
    ("XU / MUFU pipe (%)", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
    ("FMA pipe (%)", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("ALU pipe (%)", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
    ("LSU pipe (%)", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active"),
    ("local (spill) requests", "smsp__sass_inst_executed_op_local_ld.sum"),
]
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
STALLS = ["wait", "barrier", "mio_throttle", "long_scoreboard", "short_scoreboard", "not_selected",
          "dispatch_stall", "math_pipe_throttle", "gmma"]


def summarise(path: str) -> str:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head, data = rows[0], rows[2:]  # row 1 holds the units
    col = {name: i for i, name in enumerate(head)}
    kernels = [r[col["Kernel Name"]].split("(")[0].strip() for r in data]
    out = ["| metric | " + " | ".join(kernels) + " |", "|---|" + "---:|" * len(kernels)]
    wanted = ROWS + [(f"stall: {s} (per issue)", STALL.format(s)) for s in STALLS]
    for label, metric in wanted:
        if metric in col:
            out.append(f"| {label} | " + " | ".join(r[col[metric]] for r in data) + " |")
    return "\n".join(out) + "\n"


SAMPLES = "Warp Stall Sampling (All Samples)"


def _opcode(source: str) -> str:
    """The SASS opcode of a source-page row ("@!P0 BRA 0x..." -> "BRA", "HGMMA.64x64x16..." -> "HGMMA")."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def source_stalls(path: str, top: int = 12) -> str:
    """Markdown: the share of all warp-state samples per stall reason (`stall_selected` is the
    issuing warp) with its three leading opcodes, then the `top` instructions by samples."""
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        rows = list(csv.reader(f))
    head, data = rows[1], rows[2:]  # row 0 names the kernel
    col = {name: i for i, name in enumerate(head)}

    def value(row, name):
        return float(row[col[name]] or 0)

    total = sum(value(r, SAMPLES) for r in data)
    reasons = [n for n in head if n.startswith("stall_") and not n.endswith("(Not Issued)")]
    by_op = {n: collections.Counter() for n in reasons}
    for r in data:
        for n in reasons:
            by_op[n][_opcode(r[col["Source"]])] += value(r, n)
    share = {n: sum(by_op[n].values()) / total * 100 for n in reasons}
    out = [f"{rows[0][1]}: {total:.0f} warp-state samples", "", "| reason | % of samples | leading opcodes (%) |",
           "|---|---:|---|"]
    for n in sorted(reasons, key=share.get, reverse=True)[:top]:
        ops = ", ".join(f"{op} {c / total * 100:.1f}" for op, c in by_op[n].most_common(3))
        out.append(f"| {n.removeprefix('stall_')} | {share[n]:.1f} | {ops} |")
    out += ["", "| address | instruction | % of samples |", "|---|---|---:|"]
    for r in sorted(data, key=lambda r: value(r, SAMPLES), reverse=True)[:top]:
        out.append(f"| {r[col['Address']]} | `{' '.join(r[col['Source']].split())[:60]}` | "
                   f"{value(r, SAMPLES) / total * 100:.2f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+")
    p.add_argument("--source", action="store_true", help="the CSVs are source pages (per-instruction samples)")
    args = p.parse_args(argv)
    for path in args.csv:
        print(f"## {path}\n\n{source_stalls(path) if args.source else summarise(path)}")


if __name__ == "__main__":
    main()
