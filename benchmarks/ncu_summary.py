"""Summarise an Nsight Compute raw-page CSV (`ncu --import R.ncu-rep --page raw --csv`) of the
fused attention kernels: duration, issue activity, pipe utilisation, warp stall reasons
per issued instruction, spills. Prints a markdown table, one column per profiled kernel launch.

Usage:
    python benchmarks/ncu_summary.py benchmarks/results/ncu/pope-16k.csv
"""

from __future__ import annotations

import argparse
import csv

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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+")
    args = p.parse_args(argv)
    for path in args.csv:
        print(f"## {path}\n\n{summarise(path)}")


if __name__ == "__main__":
    main()
