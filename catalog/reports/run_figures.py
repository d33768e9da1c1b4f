"""Figures of one stage's records, logged to its MLflow run (``figures/``) when it finishes.

MLflow draws the ``.../by_ctx`` series itself, one chart per metric; these figures put a run's
whole evaluation on one page, as a paper would:

- :func:`length_figure`: every metric evaluated at several context lengths, one line per (task,
  split, depth), on a log-2 axis ticked at the evaluated lengths (perplexity on a log y axis);
- :func:`task_figure`: a metric over several tasks (lm-eval accuracies) as horizontal bars,
  with the standard error as error bars where the evaluator gave one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from phaselab.catalog.reports.plotstyle import STYLES, log2_lengths, metric_label, pyplot, save
from phaselab.catalog.tracking import MetricRecord


def _series_label(r: MetricRecord) -> str:
    parts = [p for p in (r.task, r.split) if p]
    if r.depth is not None:
        parts.append(f"depth {100 * r.depth:.0f}%")
    return ", ".join(parts) or r.name


def length_figure(records: Sequence[MetricRecord], name: str, path_base: Path) -> list[Path]:
    """``name`` against context length, one line per series; [] if it has fewer than 2 lengths."""
    lines: dict[str, dict[int, float]] = {}
    unit = ""
    for r in records:
        if r.name == name and r.context_len is not None:
            lines.setdefault(_series_label(r), {})[int(r.context_len)] = float(r.value)
            unit = r.unit or unit
    xs = sorted({x for pts in lines.values() for x in pts})
    if len(xs) < 2:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for i, (label, pts) in enumerate(sorted(lines.items())):
        style, marker = STYLES[i % len(STYLES)]
        steps = sorted(pts)
        ax.plot(steps, [pts[s] for s in steps], linestyle=style, marker=marker, label=label)
    log2_lengths(ax, xs)
    if name in ("ppl", "nll_ppl") and all(v > 0 for pts in lines.values() for v in pts.values()):
        ax.set_yscale("log")
    ax.set_xlabel("context length [tokens]")
    ax.set_ylabel(metric_label(name, unit))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path_base, ("png",))


def task_figure(records: Sequence[MetricRecord], name: str, path_base: Path) -> list[Path]:
    """``name`` per task as bars; [] with fewer than 2 tasks."""
    by_task = {r.task: r for r in records if r.name == name and r.task and r.context_len is None}
    if len(by_task) < 2:
        return []
    tasks = sorted(by_task)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 1.0 + 0.28 * len(tasks)))
    errs = [by_task[t].stderr or 0.0 for t in tasks]
    ax.barh(tasks, [by_task[t].value for t in tasks], xerr=errs if any(errs) else None, color="0.55",
            edgecolor="black", linewidth=0.5)
    ax.invert_yaxis()
    ax.set_xlabel(metric_label(name, by_task[tasks[0]].unit))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return save(fig, path_base, ("png",))


def run_figures(records: Iterable[MetricRecord], folder: Path) -> list[Path]:
    """Every figure the records support, as ``folder/<name>_vs_ctx.png`` and ``<name>_by_task.png``."""
    records = list(records)
    names = sorted({r.name for r in records})
    out: list[Path] = []
    for name in names:
        stem = name.replace("/", "_")
        out += length_figure(records, name, Path(folder) / f"{stem}_vs_ctx")
        out += task_figure(records, name, Path(folder) / f"{stem}_by_task")
    return out
