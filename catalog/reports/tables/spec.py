"""Declarative paper tables: spec → build (aggregate over seeds) → render md | latex | csv.

DESIGN §5.6: tables come from the catalog, never from the MLflow UI (which cannot aggregate over
seeds). A :class:`TableSpec` binds rows and columns to fields of ``CatalogStore.metrics_frame``
rows: ``axes.<name>`` for a grid axis (``axes.pe``, ``axes.size``, ``axes.seed``, ...) or a
metric field (``context_len``, ``task``, ``split``, ``stage_kind``, ``role``, ...).

Aggregation: per (row, column) the values of every seed found → mean ± sample std (ddof=1),
with n. A cell with no value is a **hole** (``—``); a cell with fewer seeds than expected says so
(``(n=2/3)``); nothing is silently dropped, and the footnote names the seeds used where they are
not the spec's. Two values for the same (row, column, seed) are an
error naming both stages: the spec must filter more tightly (``where``).

Rendering: the best mean per column (within ``bold_group`` if set) is bold; the published numbers
(``reference``) follow as "(paper)" rows; a provenance footnote lists the grid hash, the Alembic
revision, the build time and the (12-character) hashes of every stage that contributed.

Worked example: values 94.1, 95.0 for seeds 0, 1 and no seed 2 render as
``94.55 ± 0.64 (n=2/3)``.

Checkpoint selection: a cell whose stages evaluated the best-validation checkpoint (eval
``select: best_valid``; their ``select/step`` and ``select/best_valid/<metric>`` rows) is marked
``†``, and the footnote names the criterion and the selected step of every seed; unmarked cells
evaluated the final checkpoint.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

HOLE_MD = "—"
HOLE_TEX = "--"
SELECTED = "†"                           # the cell's value is at the best-validation checkpoint
BEST_VALID = "select/best_valid/"        # + criterion metric (workloads.evals.api.selection_records)


@dataclass(frozen=True, kw_only=True)
class Dim:
    """One table axis: ``field`` of the metrics rows, its values in display order (the expected
    set: a value with no data is a hole), display labels and a header title."""

    field: str
    values: tuple[Any, ...]
    labels: Mapping[Any, str] = field(default_factory=dict)
    title: str = ""
    # the fields a tuple value combines (a generic table's several column fields): CSV writes one
    # column per part
    parts: tuple[str, ...] = ()

    def label(self, value: Any) -> str:
        return self.labels.get(value, str(value))


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """A paper table as data (see the module docstring)."""

    name: str
    title: str
    grid: str
    rows: tuple[Dim, ...]
    # more grids whose rows join the table (e.g. one grid per dataset for the music table)
    extra_grids: tuple[str, ...] = ()
    # explicit row keys instead of the product of the row dims' values (e.g. the YaRN fine-tune
    # row exists only for RoPE)
    row_keys: tuple[tuple[Any, ...], ...] | None = None
    cols: Dim
    metric: str
    better: Literal["min", "max"]
    where: Mapping[str, Any] = field(default_factory=dict)
    # column value -> several values of cols.field averaged per seed (e.g. CBT = mean(CN, NE))
    combine: Mapping[Any, tuple[Any, ...]] = field(default_factory=dict)
    seed_field: str = "axes.seed"
    seeds: tuple[Any, ...] = (0, 1, 2)
    scale: float = 1.0
    decimals: int = 2
    summary_col: str | None = None
    bold_group: str | None = None
    # row key -> column -> published value, or (mean, std) where the paper gives error bars
    reference: Mapping[tuple[Any, ...], Mapping[Any, float | tuple[float, float]]] = field(
        default_factory=dict)
    reference_source: str = ""
    caption: str = ""
    # more rows: the same rows and columns from another metric, as (metric, where, label), shown
    # "<row> (<label>)" when any has a value (e.g. the minimum test NLL over evaluations)
    also: tuple[tuple[str, Mapping[str, Any], str], ...] = ()

    def __post_init__(self) -> None:
        if self.better not in ("min", "max"):
            raise ValueError(f"table {self.name}: better must be 'min' or 'max', got {self.better!r}")
        if not self.rows:
            raise ValueError(f"table {self.name}: needs at least one row dimension")
        if self.bold_group is not None and self.bold_group not in [d.field for d in self.rows]:
            raise ValueError(f"table {self.name}: bold_group {self.bold_group!r} is not a row field")
        for key in self.row_keys or ():
            if len(key) != len(self.rows) or \
                    any(v not in d.values for d, v in zip(self.rows, key, strict=False)):
                raise ValueError(f"table {self.name}: row key {key!r} does not match the row dims")

    @property
    def grids(self) -> tuple[str, ...]:
        return (self.grid, *self.extra_grids)


@dataclass(frozen=True)
class CellStat:
    mean: float
    std: float | None
    n: int
    expected: int
    stages: tuple[str, ...]


@dataclass
class BuiltTable:
    spec: TableSpec
    row_keys: list[tuple[Any, ...]]
    cells: dict[tuple[tuple[Any, ...], Any], CellStat]
    summary: dict[tuple[Any, ...], float | None]
    inputs: dict[str, str]                 # stage_hash -> "attempts|finished_at|state"
    grid_hash: str = ""
    revision: str = ""
    # (row key, column) -> (criterion, selected step per seed in seed order) of best_valid cells
    selection: dict[tuple[tuple[Any, ...], Any], tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    also: list[tuple[str, BuiltTable]] = field(default_factory=list)   # (label, its rows) with values
    # what ran, over the input stages: field of catalog.store.fingerprint.what_ran -> distinct values
    ran: dict[str, tuple[str, ...]] = field(default_factory=dict)
    seeds_used: tuple[Any, ...] = ()       # every seed that gave a value, in str order

    def best(self) -> set[tuple[tuple[Any, ...], Any]]:
        """(row key, column) of the bold cells: best mean per column within its bold group."""
        spec, out = self.spec, set()
        gi = None if spec.bold_group is None else [d.field for d in spec.rows].index(spec.bold_group)
        pick = min if spec.better == "min" else max
        for col in spec.cols.values:
            groups: dict[Any, list[tuple[float, tuple[Any, ...]]]] = {}
            for rk in self.row_keys:
                stat = self.cells.get((rk, col))
                if stat is not None and not math.isnan(stat.mean):
                    groups.setdefault(None if gi is None else rk[gi], []).append((stat.mean, rk))
            for members in groups.values():
                top = pick(m for m, _ in members)
                out.update((rk, col) for m, rk in members if m == top)
        return out


def get_field(row: Mapping[str, Any], name: str) -> Any:
    if name.startswith("axes."):
        return (row.get("axes") or {}).get(name[5:])
    if name not in row:
        raise ValueError(f"unknown table field {name!r}; use 'axes.<axis>' or one of {sorted(row)}")
    return row[name]


def _stage_stamp(row: Mapping[str, Any]) -> str:
    fin = row.get("finished_at")
    return f"{row.get('attempts')}|{fin.isoformat() if fin is not None else ''}|{row.get('state')}"


def _matching(spec: TableSpec, rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    col_values = set(spec.cols.values) | {v for vs in spec.combine.values() for v in vs}
    keep = []
    for r in rows:
        if r.get("name") != spec.metric or get_field(r, spec.cols.field) not in col_values:
            continue
        if any(get_field(r, k) != v for k, v in spec.where.items()):
            continue
        if all(get_field(r, d.field) in d.values for d in spec.rows):
            keep.append(r)
    return keep


def build(spec: TableSpec, rows: Sequence[Mapping[str, Any]], *, grid_hash: str = "",
          revision: str = "") -> BuiltTable:
    """Aggregate ``metrics_frame`` rows into a table (raises ValueError on ambiguous values)."""
    per_seed: dict[tuple[tuple[Any, ...], Any, Any], tuple[float, str]] = {}
    inputs: dict[str, str] = {}
    for r in _matching(spec, rows):
        rk = tuple(get_field(r, d.field) for d in spec.rows)
        key = (rk, get_field(r, spec.cols.field), get_field(r, spec.seed_field))
        if key in per_seed and per_seed[key][1] != r["stage_hash"]:
            raise ValueError(f"table {spec.name}: two values for row {rk} column {key[1]!r} seed {key[2]!r} "
                             f"(stages {per_seed[key][1][:12]} and {r['stage_hash'][:12]}); "
                             "narrow the spec's `where`")
        if key in per_seed:
            raise ValueError(f"table {spec.name}: stage {r['stage_hash'][:12]} has two {spec.metric!r} "
                             f"values for row {rk} column {key[1]!r}; narrow the spec's `where`")
        per_seed[key] = (float(r["value"]) * spec.scale, r["stage_hash"])
        inputs[r["stage_hash"]] = _stage_stamp(r)
    row_keys = _row_keys(spec)
    cells = {}
    for rk in row_keys:
        for col in spec.cols.values:
            stat = _cell(spec, per_seed, rk, col)
            if stat is not None:
                cells[(rk, col)] = stat
    summary = {}
    if spec.summary_col:
        for rk in row_keys:
            means = [cells[(rk, c)].mean for c in spec.cols.values if (rk, c) in cells]
            summary[rk] = statistics.fmean(means) if len(means) == len(spec.cols.values) else None
    also = []
    for metric, where, label in spec.also:
        sub = build(replace(spec, metric=metric, where=where, also=(), summary_col=None), rows)
        if sub.cells:
            also.append((label, sub))
            inputs |= sub.inputs
    seeds_used = tuple(sorted({s for (_, _, s) in per_seed}, key=str))
    return BuiltTable(spec, row_keys, cells, summary, inputs, grid_hash, revision,
                      _selection(spec, rows, per_seed), also, seeds_used=seeds_used)


def _selection(spec: TableSpec, rows: Sequence[Mapping[str, Any]], per_seed: Mapping
               ) -> dict[tuple[tuple[Any, ...], Any], tuple[str, tuple[int, ...]]]:
    """Best-validation cells: (row key, column) -> (criterion, selected steps by seed)."""
    by_stage: dict[str, tuple[str, int]] = {}
    for r in rows:
        name = r.get("name") or ""
        if name.startswith(BEST_VALID) and r.get("step") is not None:
            by_stage[r["stage_hash"]] = (name[len(BEST_VALID):], int(r["step"]))
    found: dict[tuple[tuple[Any, ...], Any], dict[Any, tuple[str, int]]] = {}
    for (rk, col, seed), (_, stage) in per_seed.items():
        if stage in by_stage:   # a combined column (CBT = mean of CN, NE) is one cell
            cell = next((c for c in spec.cols.values if col in spec.combine.get(c, (c,))), col)
            found.setdefault((rk, cell), {})[seed] = by_stage[stage]
    out = {}
    for key, seeds in found.items():
        picks = [seeds[s] for s in sorted(seeds, key=str)]
        out[key] = (", ".join(sorted({c for c, _ in picks})), tuple(step for _, step in picks))
    return out


def _row_keys(spec: TableSpec) -> list[tuple[Any, ...]]:
    if spec.row_keys is not None:
        return list(spec.row_keys)
    keys: list[tuple[Any, ...]] = [()]
    for d in spec.rows:
        keys = [k + (v,) for k in keys for v in d.values]
    return keys


def _cell(spec: TableSpec, per_seed: Mapping, rk: tuple[Any, ...], col: Any) -> CellStat | None:
    parts = spec.combine.get(col, (col,))
    seeds = sorted({s for (r, c, s) in per_seed if r == rk and c in parts}, key=str)
    values, stages = [], []
    for s in seeds:
        got = [per_seed.get((rk, p, s)) for p in parts]
        if any(g is None for g in got):  # a combined column needs every part for that seed
            continue
        values.append(statistics.fmean(v for v, _ in got))
        stages.extend(h for _, h in got)
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    return CellStat(statistics.fmean(values), std, len(values), len(spec.seeds), tuple(sorted(set(stages))))


# -- rendering ----------------------------------------------------------------------------------
def format_stat(stat: CellStat | None, decimals: int, *, pm: str = " ± ", hole: str = HOLE_MD) -> str:
    if stat is None:
        return hole
    text = f"{stat.mean:.{decimals}f}"
    if stat.std is not None:
        text += f"{pm}{stat.std:.{decimals}f}"
    if stat.n < stat.expected:
        text += f" (n={stat.n}/{stat.expected})"
    return text


def _ref_text(value: float | tuple[float, float] | None, decimals: int, pm: str, hole: str) -> str:
    if value is None:
        return hole
    if isinstance(value, tuple):
        return f"{value[0]:.{decimals}f}{pm}{value[1]:.{decimals}f}"
    return f"{value:.{decimals}f}"


def footnote(t: BuiltTable, built_at: datetime, *, code: str = "`") -> str:
    spec = t.spec
    hashes = sorted(h[:12] for h in t.inputs)
    over = "{" + ", ".join(map(str, spec.seeds)) + "}"
    if t.seeds_used and set(t.seeds_used) != set(spec.seeds):
        over = "{" + ", ".join(map(str, t.seeds_used)) + f"}} (the spec expects {over})"
    names = ", ".join(f"{code}{g}{code}" for g in spec.grids)
    source = f"Source: phaselab catalog, grid{'s' if spec.extra_grids else ''} {names}"
    parts = [source + (f" (hash {t.grid_hash})" if t.grid_hash else ""),
             f"Alembic revision {t.revision or '?'}", f"built {built_at.isoformat(timespec='seconds')}",
             f"mean ± sample std over seeds {over}; {HOLE_MD} = no result; (n=k/N) = seeds missing"]
    if spec.reference:
        parts.append(f"(paper) rows: {spec.reference_source}; (gap to paper) = 100 (ours - paper) / paper")
    if t.selection:
        parts.append(_selection_note(t))
    if t.ran:
        parts.append("ran with " + ", ".join(f"{k} {' / '.join(v)}" for k, v in t.ran.items()))
    parts.append(f"stages ({len(hashes)}): " + (", ".join(hashes) if hashes else "none"))
    return "; ".join(parts) + "."


def _selection_note(t: BuiltTable) -> str:
    spec = t.spec
    criteria = sorted({c for c, _ in t.selection.values()})
    cells = []
    for rk in t.row_keys:
        for col in spec.cols.values:
            if (rk, col) in t.selection:
                where = "/".join([*(d.label(v) for d, v in zip(spec.rows, rk, strict=True)), spec.cols.label(col)])
                cells.append(f"{where} {', '.join(map(str, t.selection[(rk, col)][1]))}")
    return (f"{SELECTED} = at the best-validation checkpoint (select: best_valid on "
            f"{', '.join(criteria)}), selected steps by seed: {'; '.join(cells)}; "
            "unmarked = final checkpoint")


def _table_cells(t: BuiltTable, *, bold: tuple[str, str], pm: str, hole: str,
                 mark: str = SELECTED) -> list[list[str]]:
    spec, best = t.spec, t.best()
    lines = []
    for rk in t.row_keys:
        line = [d.label(v) for d, v in zip(spec.rows, rk, strict=True)]
        for col in spec.cols.values:
            text = format_stat(t.cells.get((rk, col)), spec.decimals, pm=pm, hole=hole)
            text = f"{bold[0]}{text}{bold[1]}" if (rk, col) in best else text
            line.append(text + (mark if (rk, col) in t.selection else ""))
        if spec.summary_col:
            s = t.summary.get(rk)
            line.append(hole if s is None else f"{s:.{spec.decimals}f}")
        lines.append(line)
    return lines


def _also_cells(t: BuiltTable, *, pm: str, hole: str) -> list[list[str]]:
    lines = []
    for label, sub in t.also:
        for rk in sub.row_keys:
            labels = [d.label(v) for d, v in zip(t.spec.rows, rk, strict=True)]
            labels[-1] += f" ({label})"
            cells = [format_stat(sub.cells.get((rk, c)), t.spec.decimals, pm=pm, hole=hole) for c in t.spec.cols.values]
            lines.append(labels + cells + ([hole] if t.spec.summary_col else []))
    return lines


def _reference_cells(t: BuiltTable, *, pm: str, hole: str) -> list[list[str]]:
    spec, lines = t.spec, []
    for rk in t.row_keys:
        ref = spec.reference.get(rk)
        if ref is None:
            continue
        labels = [d.label(v) for d, v in zip(spec.rows, rk, strict=True)]
        labels[-1] += " (paper)"
        vals = [ref.get(c) for c in spec.cols.values]
        line = labels + [_ref_text(v, spec.decimals, pm, hole) for v in vals]
        if spec.summary_col:
            line.append(_ref_text(ref.get(spec.summary_col), spec.decimals, pm, hole))
        lines.append(line)
    return lines


def _gap_cells(t: BuiltTable, *, hole: str, pct: str = "%") -> list[list[str]]:
    """One "(gap to paper)" row per row that has paper numbers and a result of ours:
    100 * (ours - paper) / paper for each column where both exist."""
    spec, lines = t.spec, []
    for rk in t.row_keys:
        ref = spec.reference.get(rk)
        if ref is None or not any((rk, c) in t.cells for c in spec.cols.values):
            continue
        labels = [d.label(v) for d, v in zip(spec.rows, rk, strict=True)]
        labels[-1] += " (gap to paper)"
        vals = []
        for c in spec.cols.values:
            paper, ours = ref.get(c), t.cells.get((rk, c))
            paper = paper[0] if isinstance(paper, tuple) else paper
            vals.append(hole if paper in (None, 0) or ours is None
                        else f"{100 * (ours.mean - paper) / abs(paper):+.1f} {pct}")
        lines.append(labels + vals + ([hole] if spec.summary_col else []))
    return lines


def _header(spec: TableSpec) -> list[str]:
    head = [d.title or d.field.removeprefix("axes.") for d in spec.rows]
    head += [spec.cols.label(c) for c in spec.cols.values]
    return head + ([spec.summary_col] if spec.summary_col else [])


def render_markdown(t: BuiltTable, built_at: datetime) -> str:
    head = _header(t.spec)
    out = [f"### {t.spec.title}", ""]
    if t.spec.caption:
        out += [t.spec.caption, ""]
    out.append("| " + " | ".join(head) + " |")
    n_labels = len(t.spec.rows)
    out.append("|" + "|".join("---" for _ in range(n_labels)) + "|"
               + "|".join("---:" for _ in head[n_labels:]) + "|")
    for line in _table_cells(t, bold=("**", "**"), pm=" ± ", hole=HOLE_MD) + \
            _also_cells(t, pm=" ± ", hole=HOLE_MD) + _reference_cells(t, pm=" ± ", hole=HOLE_MD) + \
            _gap_cells(t, hole=HOLE_MD):
        out.append("| " + " | ".join(line) + " |")
    out += ["", f"<sub>{footnote(t, built_at)}</sub>", ""]
    return "\n".join(out)


_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "—": "--",
                "±": r"$\pm$", "δ": r"$\delta$", SELECTED: r"$^\dagger$"}


def tex_escape(text: str) -> str:
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in text)


def render_latex(t: BuiltTable, built_at: datetime) -> str:
    spec = t.spec
    head = _header(spec)
    ncols = len(head) - len(spec.rows)
    body = _table_cells(t, bold=("\\textbf{", "}"), pm=" $\\pm$ ", hole=HOLE_TEX, mark=r"$^\dagger$")
    refs = _reference_cells(t, pm=" $\\pm$ ", hole=HOLE_TEX) + _gap_cells(t, hole=HOLE_TEX, pct=r"\%")

    def row(cells: list[str], n_label: int) -> str:
        return " & ".join([tex_escape(c) for c in cells[:n_label]] + cells[n_label:]) + r" \\"

    out = [f"% phaselab table {spec.name} (generated; do not edit)", r"\begin{table}[t]", r"\centering",
           rf"\caption{{{tex_escape(spec.title)}}}", rf"\label{{tab:{spec.name}}}",
           r"\begin{tabular}{" + "l" * len(spec.rows) + "r" * ncols + "}", r"\toprule",
           " & ".join(tex_escape(h) for h in head) + r" \\", r"\midrule"]
    out += [row(c, len(spec.rows)) for c in body]
    also = _also_cells(t, pm=" $\\pm$ ", hole=HOLE_TEX)
    if also:
        out.append(r"\midrule")
        out += [row(c, len(spec.rows)) for c in also]
    if refs:
        out.append(r"\midrule")
        out += [row(c, len(spec.rows)) for c in refs]
    note = tex_escape(footnote(t, built_at, code=""))
    out += [r"\bottomrule", r"\end{tabular}", r"\par\smallskip{\footnotesize " + note + "}",
            r"\end{table}", ""]
    return "\n".join(out)


def render_csv(t: BuiltTable) -> str:
    """Long CSV: one line per (row, column) with mean, std, n, expected, bold, stage hashes."""
    import csv
    import io

    spec, best, buf = t.spec, t.best(), io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    parts = spec.cols.parts
    w.writerow([d.field for d in spec.rows]
               + [*(parts or [spec.cols.field]), "mean", "std", "n", "expected", "best", "stages"])
    for rk in t.row_keys:
        for col in spec.cols.values:
            s = t.cells.get((rk, col))
            w.writerow([*rk, *(col if parts else [col]), "" if s is None else repr(s.mean),
                        "" if s is None or s.std is None else repr(s.std),
                        0 if s is None else s.n, len(spec.seeds), int((rk, col) in best),
                        "" if s is None else " ".join(s.stages)])
    return buf.getvalue()


def render(t: BuiltTable, fmt: str, built_at: datetime) -> str:
    if fmt == "md":
        return render_markdown(t, built_at)
    if fmt == "latex":
        return render_latex(t, built_at)
    if fmt == "csv":
        return render_csv(t)
    raise ValueError(f"table format must be md, latex or csv, got {fmt!r}")
