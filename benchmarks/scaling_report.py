"""Scaling study (benchmarks/scaling.py): efficiencies, loss-curve checks, the table and the results files
(``OUT.json`` with every number, ``OUT.md`` for people), and the merge of several runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

from scaling_cases import Bench

ROOT = Path(__file__).resolve().parents[1]


def add_efficiency(rows: list[dict]) -> list[dict]:
    """Efficiency 1 -> N for every case that has a 1-worker partner."""
    base = {(r["preset"], r["encoding"], r["zero_stage"]): r for r in rows
            if r["world"] == 1 and not r["error"]}
    out = []
    for r in rows:
        b = base.get((r["preset"], r["encoding"], r["zero_stage"]))
        if r["world"] > 1 and b is not None and not r["error"]:
            eff = r["tokens_per_s"] / (r["world"] * b["tokens_per_s"])
            r["efficiency_vs_1"] = eff
            out.append({"preset": r["preset"], "encoding": r["encoding"], "zero_stage": r["zero_stage"],
                        "from": 1, "to": r["world"], "efficiency": eff})
    return out


def loss_curve_checks(results: dict, out_dir: Path, stem: str) -> dict:
    from plot_loss_curves import compare, groups_from_results

    checks = {}
    for key, runs in groups_from_results(results).items():
        png = out_dir / f"{stem}-loss-{key}.png"
        diffs = compare(runs, png, title=f"{key}: same global batch ({results['card']})")
        checks[key] = {"png": str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png),
                       **{label: d for label, d in diffs.items()}}
    return checks


def card(device: str) -> str:
    if device == "cuda":
        try:
            names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=10, check=True).stdout.split("\n")
            names = [n for n in names if n.strip()]
            return f"{len(names)} x {names[0]}" if names else "cuda (no nvidia-smi names)"
        except (OSError, subprocess.SubprocessError):
            return "cuda (nvidia-smi unavailable)"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _fmt(v, spec: str = ".3g") -> str:
    return "—" if v is None else format(v, spec)


COLUMNS = ("preset", "PE", "ZeRO", "workers", "micro x accum", "tokens/s/worker", "eff 1->N",
           "step ms", "peak alloc GiB", "peak smi GiB", "ckpt save s", "loss first->last")


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for r in results["cases"]:
        if r.get("error"):
            rows.append([r["preset"], r["encoding"], str(r["zero_stage"]), str(r["world"]), "", "FAILED",
                         "", "", "", "", "", r["error"][:60]])
            continue
        rows.append([r["preset"], r["encoding"], str(r["zero_stage"]), str(r["world"]),
                     f"{r['micro_batch']} x {r['grad_accum']}", f"{r['tokens_per_s_per_gpu']:,.0f}",
                     _fmt(r.get("efficiency_vs_1"), ".1%"), f"{r['step_ms_median']:.1f}",
                     _fmt(r.get("peak_mem_gib_alloc"), ".2f"), _fmt(r.get("peak_mem_gib_max_gpu"), ".1f"),
                     _fmt(r.get("ckpt_save_s"), ".2f"),
                     f"{r['first_loss']:.3f} -> {r['final_loss']:.3f}"])
    return rows


def print_table(results: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text without rich
        print(" | ".join(COLUMNS))
        for row in table_rows(results):
            print(" | ".join(row))
        return
    t = Table(title=f"{results['title']} — {results['card']}")
    for c in COLUMNS:
        t.add_column(c)
    for row in table_rows(results):
        t.add_row(*row)
    Console().print(t)


def markdown(results: dict) -> str:
    lines = [f"# {results['title']}", "", f"- Card: {results['card']}", f"- Date: {results['date']}",
             f"- Command: `{results['command']}`", f"- Software: {results['software']}",
             f"- Setup: {results['setup']}", ""]
    lines += [f"> {n}" for n in results["notes"]] + [""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    if results["resume"]:
        lines += ["", "## Kill and resume (same world size)", "",
                  ("| preset | PE | ZeRO | workers | killed after | resumed from step | ckpt load s "
                   "| restore s (est.) | max rel. loss diff vs uninterrupted | error |"),
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["resume"]:
            err = r.get("kill_error") or r.get("resume_error") or ""
            lines.append(f"| {r['preset']} | {r['encoding']} | {r['zero_stage']} | {r['world']} | "
                         f"{r['killed_after_step']} | {r.get('resumed_first_step', '—')} | "
                         f"{_fmt(r.get('ckpt_load_s'), '.2f')} | {_fmt(r.get('restore_s_est'), '.2f')} | "
                         f"{_fmt(r.get('vs_uninterrupted_max_rel_diff'), '.2e')} | {err[:80]} |")
    if results["loss_curves"]:
        lines += ["", "## Loss curves, same global batch (reference: 1 worker)", ""]
        for key, chk in results["loss_curves"].items():
            parts = [f"{label}: max rel. diff {d['max_rel_diff']:.2e} at step {int(d['at_step'])}"
                     for label, d in chk.items() if label != "png"]
            plot = f" ![{key}]({Path(chk['png']).name})" if chk.get("png") else ""
            lines.append(f"- {key}: {'; '.join(parts)}{plot}")
    if results["missing"]:
        lines += ["", "## Not measured", ""] + [f"- {m}" for m in results["missing"]]
    return "\n".join(lines) + "\n"


def _software() -> str:
    import importlib.metadata as md

    parts = [f"python {platform.python_version()}"]
    for pkg in ("torch", "ray", "deepspeed", "triton"):
        try:
            parts.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(parts)


def describe(args: argparse.Namespace, bench: Bench, command: str) -> dict:
    """Everything in the results file except the per-case numbers."""
    cpu = args.device == "cpu"
    return {
        "title": "Scaling, CPU SMOKE (not H200 results)" if cpu else "Scaling: DeepSpeed ZeRO on Ray Train V2",
        "device": args.device, "card": card(args.device),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command, "software": _software(),
        "setup": (f"global batch {bench.batch_size} x {bench.block_size} tokens, micro-batch "
                  f"{bench.micro_batch}, grad_accum = {bench.max_world}/world, {bench.steps} steps, "
                  f"first {bench.warmup_steps} steps and step {bench.ckpt_at + 1} (after the mid-run "
                  f"checkpoint) excluded, {'fp32/gloo' if cpu else 'bf16/NCCL'}, "
                  f"data: Tiny Shakespeare ({'char' if cpu else 'GPT-2 BPE'})"),
        "bench": dataclasses.asdict(bench),
        "notes": ([("CPU smoke: tiny model, fp32, gloo, Ray workers sharing a 2-core machine with other "
                    "jobs. These numbers check the measuring machinery; they say NOTHING about GPU "
                    "scaling (the 2 workers compete for the same cores).")] if cpu else [])
                 + ["tokens/s per worker = global tokens/s / world (rank 0's wall clock, log_every=1).",
                    ("ckpt save s = `ckpt/save_s` the loop logs at the mid-run checkpoint: rank 0's wall "
                     "time of the blocking save (DeepSpeed shards, consolidated model.pt, barrier, "
                     "ray.train.report with async upload); the step after it is excluded from tokens/s."),
                    ("ckpt load s = `ckpt/load_s` the resumed fit logs: rank 0's wall time from Ray's "
                     "checkpoint folder to the restored engine and RNG state. restore s (est.) = time to "
                     "the first train line of the resumed fit minus that of the killed fit (same spec "
                     "and world, started just before): adds Ray start-up jitter (seconds on a loaded CPU)."),
                    ("peak alloc GiB = max of `train/peak_mem_gib` (torch.cuda.max_memory_allocated on "
                     "rank 0, tensors only); peak smi GiB = nvidia-smi memory.used, max over GPUs "
                     "(adds the CUDA context and the allocator cache).")],
        "missing": ([("Peak memory on CPU: torch keeps no allocator peak there and nvidia-smi has "
                      "nothing to poll, so both memory columns stay empty.")] if cpu else []),
    }


def write_results(results: dict, out: Path, *, plots: bool) -> None:
    """Efficiency and loss-curve checks from the cases, then ``out``.json and ``out``.md."""
    from plot_loss_curves import groups_from_results, max_rel_diff

    results["efficiency"] = add_efficiency(results["cases"])
    if plots:
        results["loss_curves"] = loss_curve_checks(results, out.parent, out.name)
    else:  # the numbers without the PNGs (device runs: at most 8 files come back)
        results["loss_curves"] = {}
        for key, runs in groups_from_results(results).items():
            labels = list(runs)
            results["loss_curves"][key] = {"png": "", **{
                lab: max_rel_diff({int(k): v for k, v in runs[labels[0]].items()},
                                  {int(k): v for k, v in runs[lab].items()}) for lab in labels[1:]}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(results))


def merge(files: Sequence[Path], out: Path, *, plots: bool) -> dict:
    """Several result files of one study (one per GPU run) -> one; later cases replace
    earlier ones with the same (preset, encoding, zero, world)."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    merged = {k: v for k, v in docs[0].items() if k not in ("cases", "resume", "efficiency", "loss_curves")}
    cases: dict[tuple, dict] = {}
    resume: dict[tuple, dict] = {}
    for d in docs:
        if d["device"] != merged["device"] or d["setup"] != merged["setup"]:
            raise ValueError(f"cannot merge results of different setups: {d['setup']!r} vs {merged['setup']!r}")
        for r in d["cases"]:
            cases[(r["preset"], r["encoding"], r["zero_stage"], r["world"])] = r
        for r in d["resume"]:
            resume[(r["preset"], r["encoding"], r["zero_stage"], r["world"])] = r
    merged["command"] = " ; ".join(d["command"] for d in docs)
    merged["date"] = ", ".join(sorted({d["date"] for d in docs}))
    merged["cases"], merged["resume"] = list(cases.values()), list(resume.values())
    write_results(merged, out, plots=plots)
    return merged
