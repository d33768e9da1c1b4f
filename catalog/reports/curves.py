"""Learning-curve figures: one line per cell group (its axes without the seed), the seed mean as
the line and the seeds' min..max as a band, one panel per metric.

The points are the per-step metrics every training stage logs (``metrics.jsonl`` lines, or the
``curves.jsonl.gz`` that ``deploy/gpu/run_grid.sh`` packs: one JSON object per stage and step with
``stage_hash``); ``axes_of`` maps a stage hash (or its prefix) to the cell's axes, as the catalog
export's metric rows carry them (``axes_json``).

    paths = plot_learning_curves(points, axes_of, Path("docs/results/pope_jsb/learning_curves"),
                                 metrics=("train/loss", "valid/loss"))

PDFs embed TrueType fonts (no Type 3), lines differ by style and marker as well as colour.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ("-", "v"), ("--", "P"))
_LABELS = {"train/loss": "training loss [nats/token]", "valid/loss": "validation loss [nats/token]",
           "valid/acc": "validation accuracy", "test/loss": "test loss [nats/token]"}


def group_label(axes: Mapping[str, Any], drop: Iterable[str] = ()) -> tuple[str, Any]:
    """(the cell's axes without ``seed`` (and ``drop``) as ``k=v, ...``, its seed)."""
    rest = {k: v for k, v in axes.items() if k != "seed" and k not in drop}
    text = ", ".join(f"{k}={v if not isinstance(v, dict) else json.dumps(v, sort_keys=True)}"
                     for k, v in sorted(rest.items()))
    return text or "all", axes.get("seed")


def _lookup(axes_of: Mapping[str, Mapping[str, Any]], stage_hash: str) -> Mapping[str, Any] | None:
    if stage_hash in axes_of:
        return axes_of[stage_hash]
    hits = [v for k, v in axes_of.items() if stage_hash.startswith(k) or k.startswith(stage_hash)]
    return hits[0] if len(hits) == 1 else None


def series(points: Iterable[Mapping[str, Any]], axes_of: Mapping[str, Mapping[str, Any]], metric: str
           ) -> dict[str, dict[Any, dict[int, float]]]:
    """{group: {seed: {step: value}}} of ``metric``; a group is the cell's axes without the seed, and
    without the axes every cell shares (the stage name leads it when the points come from several
    stages; the first value of a step wins, as in the metrics replay)."""
    points = list(points)
    out: dict[str, dict[Any, dict[int, float]]] = {}
    drop = _named_elsewhere(axes_of.values()) | _shared(axes_of.values())
    several_stages = len({p["stage"] for p in points if p.get("stage")}) > 1
    for p in points:
        value = p.get(metric)
        axes = _lookup(axes_of, str(p.get("stage_hash", "")))
        if value is None or axes is None or not math.isfinite(float(value)):
            continue
        group, seed = group_label(axes, drop)
        if several_stages and p.get("stage"):   # a cell's fine-tunes log their own curves
            group = f"{p['stage']}: {group}"
        out.setdefault(group, {}).setdefault(seed, {}).setdefault(int(p["step"]), float(value))
    return out


def _named_elsewhere(cells: Iterable[Mapping[str, Any]]) -> set[str]:
    """Axes with structured values (a zip's ``pe: {kind: rope, ...}`` beside ``variant: rope``)
    left out of the labels when the other axes still tell every cell apart; else none."""
    cells = list(cells)
    structured = {k for axes in cells for k, v in axes.items() if isinstance(v, (dict, list))}
    full = {group_label(axes)[0] for axes in cells}
    short = {group_label(axes, structured)[0] for axes in cells}
    return structured if structured and len(short) == len(full) and "all" not in short else set()


def _shared(cells: Iterable[Mapping[str, Any]]) -> set[str]:
    """Axes with one value in every cell (a zip's ``block: 48`` in each of its cells): they tell no
    line apart, so they stay out of the labels, unless the cells are one cell (its label names it)."""
    cells = list(cells)
    if len({group_label(axes)[0] for axes in cells}) < 2:
        return set()
    keys = set().union(*(axes.keys() for axes in cells)) - {"seed"}
    return {k for k in keys if all(k in axes for axes in cells)
            and len({json.dumps(axes[k], sort_keys=True, default=str) for axes in cells}) == 1}


def _band(by_seed: Mapping[Any, Mapping[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    steps = sorted(set().union(*(s.keys() for s in by_seed.values())))
    xs, mean, lo, hi = [], [], [], []
    for step in steps:
        vals = [s[step] for s in by_seed.values() if step in s]
        xs.append(step)
        mean.append(statistics.fmean(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return xs, mean, lo, hi


def plot_learning_curves(points: Sequence[Mapping[str, Any]], axes_of: Mapping[str, Mapping[str, Any]],
                         path_base: Path, *, metrics: Sequence[str] = ("train/loss", "valid/loss"),
                         title: str | None = None, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """Draw one panel per metric; returns the written paths (``path_base.<fmt>``). A metric no
    stage logged is left out; ValueError if none was logged."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    matplotlib.rcParams["pdf.fonttype"] = 42   # TrueType in the PDF
    import matplotlib.pyplot as plt

    panels = [(m, series(points, axes_of, m)) for m in metrics]
    panels = [(m, s) for m, s in panels if s]
    if not panels:
        raise ValueError(f"no points for any of {list(metrics)}")
    fig, axs = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    # a group keeps its colour, line style and marker in every panel, and has one legend entry
    order = {g: i for i, g in enumerate(sorted(set().union(*(groups for _, groups in panels))))}
    legend: dict[str, Any] = {}
    for ax, (metric, groups) in zip(axs[0], panels):
        for group, by_seed in sorted(groups.items()):
            i = order[group]
            xs, mean, lo, hi = _band(by_seed)
            style, marker = _STYLES[i % len(_STYLES)]
            every = max(1, len(xs) // 12)
            (line,) = ax.plot(xs, mean, linestyle=style, marker=marker, markevery=every, markersize=4,
                              color=f"C{i % 10}", label=f"{group} (n={len(by_seed)})")
            legend.setdefault(group, line)
            if len(by_seed) > 1:
                ax.fill_between(xs, lo, hi, alpha=0.2, color=f"C{i % 10}")
        ax.set_xlabel("optimiser step")
        ax.set_ylabel(_LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
    # one legend for all panels, below them: inside a panel it covers the curves
    lines = [legend[g] for g in sorted(legend, key=order.get)]
    ncol = len(lines) if len(lines) <= 4 else 3
    fig.legend(lines, [line.get_label() for line in lines], loc="lower center", ncol=ncol, fontsize=8,
               frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.045 * math.ceil(len(lines) / ncol) + 0.02, 1, 1))
    from phaselab.catalog.reports.plotstyle import save

    return save(fig, path_base, formats)


# accuracies a run must reach to count as off a ~10 % plateau, halfway, and nearly solved
ACC_THRESHOLDS = (0.2, 0.5, 0.8)


def crossings(points: Iterable[Mapping[str, Any]], axes_of: Mapping[str, Mapping[str, Any]], metric: str,
              thresholds: Sequence[float]) -> list[dict[str, Any]]:
    """When each run left a plateau: one row per (group, seed) with the first logged step at which
    ``metric`` reached each threshold (None: never), its last step and last value. For a metric that
    must fall (a loss), pass thresholds as negative numbers: the row then reads -metric."""
    rows = []
    for group, by_seed in sorted(series(points, axes_of, metric).items()):
        for seed, by_step in sorted(by_seed.items(), key=lambda kv: str(kv[0])):
            steps = sorted(by_step)
            row: dict[str, Any] = {"group": group, "seed": seed, "last_step": steps[-1],
                                   "last": by_step[steps[-1]]}
            for t in thresholds:
                sign = -1.0 if t < 0 else 1.0
                row[f">={t:g}"] = next((s for s in steps if sign * by_step[s] >= t), None)
            rows.append(row)
    return rows


def crossings_markdown(rows: Sequence[Mapping[str, Any]], metric: str) -> str:
    """The rows of `crossings` as a Markdown table (steps in thousands where >= 1000)."""
    if not rows:
        return f"no points of {metric}\n"
    cols = [c for c in rows[0] if c not in ("group", "seed", "last_step", "last")]

    def step(s: Any) -> str:
        return "never" if s is None else (f"{s / 1000:g}k" if s >= 1000 else str(s))

    head = ["group", "seed", *(f"first step {metric} {c}" for c in cols), "last step", f"last {metric}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in rows:
        cells = [str(r["group"]), str(r["seed"]), *(step(r[c]) for c in cols), step(r["last_step"]),
                 f"{r['last']:.4g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_points(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a ``curves.jsonl.gz`` (or plain ``.jsonl``) file."""
    import gzip

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
