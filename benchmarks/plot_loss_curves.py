"""Loss curves of runs with the same global batch on different GPU counts (benchmarks/scaling.py).

The 1-GPU and the N-GPU runs of benchmarks/scaling.py see the same micro-batches (it keeps
``grad_accum * world`` constant, and the loop draws batch ``(step * accum + k) * world + rank``,
a pure function of its index — CONTRACTS §3.3), so their curves may differ only by reduction
order and bf16 rounding. This script plots the ``train/loss`` lines that rank 0 wrote to each
run's ``metrics.jsonl`` and prints the largest relative difference from the first curve.

    python benchmarks/plot_loss_curves.py --run 1gpu=runs/a/metrics.jsonl \\
        --run 2gpu=runs/b/metrics.jsonl --out benchmarks/results/loss-1v2.png
    python benchmarks/plot_loss_curves.py --results benchmarks/results/scaling-h200.json \\
        --out-dir benchmarks/results            # one PNG per (preset, encoding, zero stage)
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path


def load_losses(path: Path) -> dict[int, float]:
    """``{step: train/loss}`` from a metrics.jsonl (lines without a train loss are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"metrics file {str(path)!r} does not exist")
    out: dict[int, float] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "train/loss" in row:
            out[int(row["step"])] = float(row["train/loss"])
    if not out:
        raise ValueError(f"{path}: no train/loss lines")
    return out


def max_rel_diff(ref: Mapping[int, float], other: Mapping[int, float]) -> dict[str, float]:
    """Largest ``|other - ref| / |ref|`` over the steps both curves have, and at which step.

    Raises ValueError when the curves share no step (different runs were paired by mistake).
    """
    common = sorted(set(ref) & set(other))
    if not common:
        raise ValueError(f"the loss curves share no step (ref steps {min(ref)}..{max(ref)}, "
                         f"other {min(other)}..{max(other)})")
    worst_step, worst = common[0], -1.0
    for s in common:
        d = abs(other[s] - ref[s]) / max(abs(ref[s]), 1e-12)
        if not math.isfinite(d):
            raise ValueError(f"non-finite loss at step {s}: ref {ref[s]!r}, other {other[s]!r}")
        if d > worst:
            worst_step, worst = s, d
    return {"max_rel_diff": worst, "at_step": float(worst_step), "steps_compared": float(len(common))}


def plot(curves: Mapping[str, Mapping[int, float]], out_png: Path, *, title: str) -> Path:
    """One PNG: every curve's loss by step (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for i, (label, losses) in enumerate(curves.items()):
        steps = sorted(losses)
        # the reference wide and solid, the others dashed on top: identical curves stay visible
        ax.plot(steps, [losses[s] for s in steps], marker="." if i else "o", linewidth=3.0 if i == 0 else 1.2,
                linestyle="-" if i == 0 else "--", alpha=0.6 if i == 0 else 1.0, label=label)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("train loss [nats/token]")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def compare(runs: Mapping[str, Path | Mapping[int, float]], out_png: Path | None, *,
            title: str) -> dict[str, dict[str, float]]:
    """Load the runs (a metrics.jsonl path or ``{step: loss}``; the first is the reference),
    plot them, return each one's max rel diff from the reference."""
    if len(runs) < 2:
        raise ValueError(f"compare needs at least two runs, got {list(runs)}")
    curves = {label: load_losses(r) if isinstance(r, (str, Path)) else {int(k): float(v) for k, v in r.items()}
              for label, r in runs.items()}
    ref_label = next(iter(curves))
    diffs = {label: max_rel_diff(curves[ref_label], c) for label, c in curves.items() if label != ref_label}
    if out_png is not None:
        plot(curves, out_png, title=title)
    return diffs


def groups_from_results(results: Mapping) -> dict[str, dict[str, Path | Mapping[int, float]]]:
    """From a scaling JSON: ``{"owt-124m-rope-z2": {"1 GPU": losses, "2 GPUs": ...}}`` with the
    losses embedded in the JSON (``case["losses"]``) or else the case's metrics.jsonl path."""
    groups: dict[str, dict[str, Path | Mapping[int, float]]] = {}
    for case in sorted(results["cases"], key=lambda c: c["world"]):
        if case.get("error"):
            continue
        key = f"{case['preset']}-{case['encoding']}-z{case['zero_stage']}"
        unit = "GPU" if results["device"] == "cuda" else "worker"
        label = f"{case['world']} {unit}{'s' if case['world'] > 1 else ''}"
        groups.setdefault(key, {})[label] = case.get("losses") or Path(case["metrics_path"])
    return {k: v for k, v in groups.items() if len(v) > 1}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="append", default=[], metavar="LABEL=METRICS_JSONL",
                   help="a run to plot (the first is the reference)")
    p.add_argument("--out", type=Path, help="PNG for the --run curves")
    p.add_argument("--results", type=Path, help="a benchmarks/scaling.py JSON: plot every group")
    p.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    report: dict[str, dict] = {}
    if args.run:
        runs = {}
        for item in args.run:
            label, sep, path = item.partition("=")
            if not sep:
                raise ValueError(f"--run expects LABEL=PATH, got {item!r}")
            runs[label] = Path(path)
        report["runs"] = compare(runs, args.out, title=" vs ".join(runs))
    if args.results:
        results = json.loads(args.results.read_text())
        stem = args.results.stem
        for key, runs in groups_from_results(results).items():
            png = args.out_dir / f"{stem}-loss-{key}.png"
            report[key] = compare(runs, png, title=f"{key}: same global batch, {results.get('card', '')}")
            report[key]["png"] = str(png)  # type: ignore[assignment]
    if not report:
        p.error("give --run LABEL=PATH (at least two) or --results FILE")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
