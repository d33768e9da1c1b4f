"""Cross-cell figures from the catalog: perplexity vs context length per encoding, like
PoPE's Figure 2 and TAPA's Tables 1–2 drawn as curves.

A figure reuses a table spec (one definition of rows, columns, metric and seed aggregation): each
row of the built table is a line, its numeric columns are the x axis, the seed mean is the line
and ± one sample std a band; holes are gaps (never interpolated), and a cell with missing seeds
is drawn with a hollow marker. Per-stage figures (NIAH heat maps, frequency usage) are drawn by
the eval stages themselves (``workloads.evals.plots``) and stored as artifacts.

matplotlib is imported inside functions (Agg backend, no display).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaselab.catalog.reports.tables.spec import BuiltTable, TableSpec, build

if TYPE_CHECKING:
    from phaselab.catalog.store.api import CatalogStore

# Tables whose columns are context lengths (drawn as curves by render_figures).
CURVE_TABLES = ("pope_pg19_extrapolation", "tapa_table1", "tapa_table2", "tapa_table3", "quickstart_ppl",
                "extrapolation_small_ppl", "tapa_long_context_small")
# Per-table drawing options for render_figures (plot_curves keywords) over its defaults: a
# log-2 length axis, a line style and marker per row, the models' training length marked.
CURVE_OPTIONS: dict[str, dict[str, object]] = {
    "extrapolation_small_ppl": {"train_len": 256},
    # its rows mix pretrained models (512) and models after continued pretraining (2048)
    "tapa_long_context_small": {"train_len": None, "marks": {512: "pretraining length 512",
                                                             2048: "continued pretraining length 2048"}},
}
# More legend entries than this go right of the axes (``legend="auto"``): inside they hide lines.
LEGEND_INSIDE_MAX = 8
_METRIC_LABELS = {"ppl": "perplexity", "nll": "NLL [nats/token]", "acc": "accuracy"}
# Line styles and markers cycled per row when ``styled`` (lines stay apart in greyscale print).
_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ("-", "v"), ("--", "P"), ("-.", "X"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    matplotlib.rcParams["pdf.fonttype"] = 42   # TrueType fonts in PDFs (no Type 3)
    import matplotlib.pyplot as plt

    return plt


def plot_curves(t: BuiltTable, path_base: Path, *, logy: bool = True, train_len: int | None = None,
                formats: Iterable[str] = ("png", "pdf"), logx: bool = False, styled: bool = False,
                marks: Mapping[int, str] | None = None, legend: str = "auto") -> list[Path]:
    """Draw ``t`` (numeric columns) as one line per row; writes ``path_base.<fmt>`` for each
    format and returns the paths. Raises ValueError if a column value is not a number.
    See :func:`curves_figure` for the options."""
    plt = _pyplot()
    fig, _ = curves_figure(t, logy=logy, train_len=train_len, logx=logx, styled=styled, marks=marks,
                           legend=legend)
    paths = []
    for fmt in formats:
        path = Path(path_base).with_suffix(f".{fmt}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150)
        paths.append(path)
    plt.close(fig)
    return paths


def curves_figure(t: BuiltTable, *, logy: bool = True, train_len: int | None = None, logx: bool = False,
                  styled: bool = False, marks: Mapping[int, str] | None = None,
                  legend: str = "auto") -> tuple[Any, Any]:
    """The (figure, axes) of :func:`plot_curves`, not saved (the caller closes it).

    ``logx``: log-2 x axis ticked at the columns; ``styled``: a line style and marker per row;
    ``train_len``: a dashed grey line "train length N"; ``marks``: {length: label}, one grey
    vertical line per length with its label in the legend (a length in both keeps the mark's
    label); ``legend``: ``inside`` (the best corner), ``outside`` (right of the axes, the figure
    widened) or ``auto`` (outside past :data:`LEGEND_INSIDE_MAX` entries, where it would hide lines)."""
    if legend not in ("auto", "inside", "outside"):
        raise ValueError(f"legend must be auto, inside or outside, got {legend!r}")
    spec = t.spec
    xs = list(spec.cols.values)
    if not all(isinstance(x, (int, float)) for x in xs):
        raise ValueError(f"table {spec.name}: columns {xs!r} are not numeric; cannot draw curves")
    marks = dict(marks or {})
    if train_len is not None and train_len not in marks:
        marks = {train_len: f"train length {train_len}", **marks}
    entries = sum(any(t.cells.get((rk, x)) is not None for x in xs) for rk in t.row_keys) + len(marks)
    outside = legend == "outside" or (legend == "auto" and entries > LEGEND_INSIDE_MAX)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.0 if outside else 6.4, 4.0))
    _draw_rows(ax, t, xs, styled)
    draw_marks(ax, marks)
    _style_axes(ax, t, xs, logy=logy, logx=logx, styled=styled)
    if outside:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, ax


def _draw_rows(ax: Any, t: BuiltTable, xs: list, styled: bool) -> None:
    """One line per row with values: seed mean, ± std band, hollow markers where seeds are missing."""
    spec = t.spec
    for i, rk in enumerate(t.row_keys):
        stats = [t.cells.get((rk, x)) for x in xs]
        if all(s is None for s in stats):
            continue
        ys = [float("nan") if s is None else s.mean for s in stats]
        label = " ".join(d.label(v) for d, v in zip(spec.rows, rk, strict=True))
        linestyle, marker = _STYLES[i % len(_STYLES)] if styled else ("-", "o")
        (line,) = ax.plot(xs, ys, marker=marker, linestyle=linestyle, label=label)
        lo = [float("nan") if s is None or s.std is None else s.mean - s.std for s in stats]
        hi = [float("nan") if s is None or s.std is None else s.mean + s.std for s in stats]
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        partial = [(x, s.mean) for x, s in zip(xs, stats, strict=True) if s is not None and s.n < s.expected]
        if partial:
            ax.scatter(*zip(*partial, strict=True), s=60, facecolors="white", edgecolors=line.get_color(),
                       zorder=3)


def draw_marks(ax: Any, marks: Mapping[int, str]) -> list[Any]:
    """A grey vertical line per length of ``marks`` (in length order), labelled for the legend;
    the first dashed, the next dotted, then dash-dotted, so two marks stay apart in greyscale."""
    styles = ("--", ":", "-.")
    return [ax.axvline(length, color="grey", linestyle=styles[i % len(styles)], linewidth=1, label=label)
            for i, (length, label) in enumerate(sorted(marks.items()))]


def _style_axes(ax: Any, t: BuiltTable, xs: list, *, logy: bool, logx: bool, styled: bool) -> None:
    """Scales, ticks, labels, title and grid of :func:`curves_figure`."""
    spec = t.spec
    finite = [s.mean for rk in t.row_keys for s in (t.cells.get((rk, x)) for x in xs) if s is not None and s.mean > 0]
    logy = logy and bool(finite) and max(finite) / min(finite) >= 10   # a log axis within a decade has no labels
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_locator(_null_locator())   # only the evaluated lengths are ticked
    if styled and logy:   # plain numbers (12, 20, 60) instead of 1.2 x 10^1 on the log axis
        from matplotlib.ticker import FuncFormatter, ScalarFormatter

        ax.yaxis.set_major_formatter(ScalarFormatter())
        # minor ticks labelled at 2x and 5x a power of ten only: every one would overlap
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    ax.set_xlabel(spec.cols.title or spec.cols.field.removeprefix("axes."))
    ax.set_ylabel(_METRIC_LABELS.get(spec.metric, spec.metric))
    ax.set_title(spec.title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def _null_locator():
    from matplotlib.ticker import NullLocator

    return NullLocator()


def render_figures(store: CatalogStore, out_dir: Path, *, names: Iterable[str] = CURVE_TABLES) -> list[Path]:
    """Draw every curve table whose grid is in the catalog into ``out_dir``; returns the files."""
    from phaselab.catalog.reports.tables import get_spec, shipped_dataset
    from phaselab.catalog.reports.tables.dataset import from_store

    written: list[Path] = []
    for name in names:
        spec = get_spec(name)
        rows = [r for g in spec.grids if store.reads.get_grid(g) is not None for r in store.reads.metrics_frame(grid=g)]
        if not rows:
            continue
        built = build(spec, rows)
        built.spec = _labelled(from_store(store, spec, [g["id"] for g in map(store.reads.get_grid, spec.grids) if g],
                                          built.inputs, shipped_dataset(name)))
        options: dict[str, object] = {"logx": True, "styled": True, "train_len": _train_len(store, built),
                                      **CURVE_OPTIONS.get(name, {})}
        written += plot_curves(built, Path(out_dir) / name, **options)
    return written


def _labelled(spec: TableSpec) -> TableSpec:
    """``spec`` with the labels ``phaselab figures`` uses (``plotstyle``): the length axis with its
    unit, encodings by their papers' names."""
    from dataclasses import replace

    from phaselab.catalog.reports.plotstyle import field_label, value_label

    rows = tuple(replace(d, labels={v: d.labels.get(v, value_label(d.field, v)) for v in d.values})
                 for d in spec.rows)
    return replace(spec, rows=rows, cols=replace(spec.cols, title=field_label(spec.cols.field)))


def _train_len(store: CatalogStore, built: BuiltTable) -> int | None:
    """The training length of the table's models, when they share one (else None)."""
    from phaselab.catalog.store.walks import train_lengths

    lengths = train_lengths(store, sorted(built.inputs))
    return lengths[0] if len(lengths) == 1 else None
