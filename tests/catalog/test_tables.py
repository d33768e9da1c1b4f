"""Paper tables from a hand-built catalog: golden files for every spec (with holes and missing
seeds), hand-checked aggregation numbers, and ``--check-stale`` (DESIGN §5.6)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from catalog_testlib import add_stage, h, run_stage

from phaselab.catalog.reports.tables import (
    TABLES,
    check_stale,
    get_spec,
    render_all,
    render_from_export,
    render_table,
)
from phaselab.catalog.reports.tables.spec import Dim, TableSpec, build
from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking import MetricRecord

GOLDEN = Path(__file__).parent / "golden"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
UPDATE = os.environ.get("PHASELAB_UPDATE_GOLDEN") == "1"


def _metric_field_values(spec: TableSpec, col: Any) -> list[dict[str, Any]]:
    """MetricRecord fields for one column of a spec whose columns are a metric field."""
    parts = spec.combine.get(col, (col,))
    return [{spec.cols.field: p} for p in parts]


def populate(store: CatalogStore, spec: TableSpec) -> None:
    """A synthetic catalog for ``spec``: every row × column × seed, except the last row's last
    column (a hole) and the first cell's last seed (a missing seed). Values are a deterministic
    function of (row, column, seed); one extra metric per stage must be filtered out by ``where``.
    With ``extra_grids``, column i lives in grid i mod (number of grids)."""
    gids = [store.upsert_grid(name=g, grid_hash=h(g), yaml_submitted="", yaml_resolved="")
            for g in spec.grids]
    row_keys = build(spec, []).row_keys
    col_is_axis = spec.cols.field.startswith("axes.")
    where = {k: v for k, v in spec.where.items() if not k.startswith("axes.")}
    per_col = col_is_axis or len(gids) > 1
    for ri, rk in enumerate(row_keys):
        dims = dict(zip((d.field for d in spec.rows), rk, strict=True))
        role = dims.pop("role", "eval")
        for seed in spec.seeds:
            axes = {f[5:]: v for f, v in dims.items()} | {"seed": seed}
            for cols in ([[c] for c in spec.cols.values] if per_col else [list(spec.cols.values)]):
                records = []
                for ci, col in ((spec.cols.values.index(c), c) for c in cols):
                    if ri == len(row_keys) - 1 and ci == len(spec.cols.values) - 1:
                        continue                                          # hole
                    if ri == 0 and ci == 0 and seed == spec.seeds[-1] and len(spec.seeds) > 1:
                        continue                                          # missing seed
                    base = (1.0 + 0.5 * ri + 0.25 * ci + 0.125 * spec.seeds.index(seed)) / spec.scale
                    extra = [{}] if col_is_axis else _metric_field_values(spec, col)
                    for j, fields in enumerate(extra):
                        value = base + 0.0625 * j / spec.scale
                        records.append(MetricRecord(name=spec.metric, value=value, **where, **fields))
                records.append(MetricRecord(name=spec.metric, value=999.0, split="noise"))
                cell_axes = axes | ({spec.cols.field[5:]: cols[0]} if col_is_axis else {})
                key = ",".join(f"{k}={cell_axes[k]}" for k in sorted(cell_axes))
                gid = gids[spec.cols.values.index(cols[0]) % len(gids)]
                cid = store.upsert_cell(grid_id=gid, cell_key=key, axes=cell_axes)
                label = f"{spec.grid}/{key}/{role}/{gid}"
                run_stage(store, add_stage(store, cid, label, role=role), records)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_golden(sqlite_store: CatalogStore, name: str) -> None:
    store = sqlite_store
    spec = get_spec(name)
    populate(store, spec)
    for fmt, ext in (("md", "md"), ("latex", "tex"), ("csv", "csv")):
        text = render_table(store, spec, fmt, now=NOW, record=False).text
        path = GOLDEN / f"{name}.{ext}"
        if UPDATE:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        assert text == path.read_text(), f"{path} differs; inspect, then PHASELAB_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", ["pope_indirect_indexing", "pope_music_nll", "extrapolation_small_ppl"])
def test_table_from_an_export_equals_the_catalog_table(sqlite_store: CatalogStore, tmp_path: Path,
                                                       name: str) -> None:
    """``phaselab tables NAME --from-export DIR`` (the committed docs/results exports) renders
    what the catalog that wrote the export renders, holes and missing seeds included."""
    from phaselab.catalog.reports.export import export_grid

    spec = get_spec(name)
    populate(sqlite_store, spec)
    for grid in spec.grids:
        export_grid(sqlite_store, grid, "parquet", tmp_path / "export")
    want = render_table(sqlite_store, spec, "md", now=NOW, record=False).text
    got = render_from_export(spec, tmp_path / "export", "md", now=NOW).text
    assert got == want and "—" in got
    missing = render_from_export(spec, tmp_path / "nothing", "md", now=NOW)
    assert missing.text is None and "no export" in missing.skipped


def _ii_spec(**kw: Any) -> TableSpec:
    return TableSpec(name="t", title="T", grid="g", metric="acc", better="max", scale=100.0,
                     rows=(Dim(field="axes.pe", values=("rope", "pope", "alibi"), labels={"pope": "PoPE"}),),
                     cols=Dim(field="task", values=("ii",)), **kw)


def _rows(values: dict[tuple[str, int], float]) -> list[dict[str, Any]]:
    return [{"name": "acc", "task": "ii", "value": v, "axes": {"pe": pe, "seed": s},
             "stage_hash": h(f"{pe}{s}"), "attempts": 1, "finished_at": NOW, "state": "SUCCEEDED"}
            for (pe, s), v in values.items()]


def test_aggregation_numbers_bold_holes_and_missing_seeds() -> None:
    from phaselab.catalog.reports.tables.spec import render_markdown

    t = build(_ii_spec(), _rows({("rope", 0): 0.10, ("rope", 1): 0.12, ("rope", 2): 0.14,
                                 ("pope", 0): 0.941, ("pope", 1): 0.95}))
    rope, pope = t.cells[(("rope",), "ii")], t.cells[(("pope",), "ii")]
    assert (round(rope.mean, 10), round(rope.std, 10), rope.n) == (12.0, 2.0, 3)   # sample std, ddof=1
    assert (round(pope.mean, 10), pope.n, pope.expected) == (94.55, 2, 3)
    assert abs(pope.std - 0.6363961030678927) < 1e-12
    assert (("alibi",), "ii") not in t.cells
    md = render_markdown(t, NOW)
    assert "| rope | 12.00 ± 2.00 |" in md
    assert "| PoPE | **94.55 ± 0.64 (n=2/3)** |" in md
    assert "| alibi | — |" in md


def test_footnote_names_the_seeds_used_where_they_are_not_the_specs() -> None:
    from phaselab.catalog.reports.tables.spec import render_markdown

    five = build(_ii_spec(), _rows({("pope", s): v for s, v in enumerate((0.8, 0.3, 0.9, 0.7, 0.9))}))
    assert five.cells[(("pope",), "ii")].n == 5
    assert "over seeds {0, 1, 2, 3, 4} (the spec expects {0, 1, 2});" in render_markdown(five, NOW)
    three = build(_ii_spec(), _rows({("pope", s): 0.9 for s in (0, 1, 2)}))
    assert "over seeds {0, 1, 2};" in render_markdown(three, NOW)


def test_footnote_says_what_the_trained_model_ran_with(sqlite_store: CatalogStore) -> None:
    """An evaluation's number is its trained model's too: the record of the training stage above
    an input stage reaches the footnote (here the eval stages recorded nothing themselves)."""
    store = sqlite_store
    spec = get_spec("pope_indirect_indexing")
    populate(store, spec)
    first = min(build(spec, store.reads.metrics_frame(grid=spec.grid)).inputs)
    trained = add_stage(store, store.reads.cells_for_stage(first)[0]["cell_id"], "train-above", kind="pretrain")
    store.add_edge(trained, first, "evaluates")
    env = {"git_sha": "0" * 40, "deterministic": False,
           "provenance": {"attention": {"impls": {"pope": ["cudnn"]}}, "precision": "bf16",
                          "compile": True, "cuda_graphs": True, "device": "NVIDIA H200"}}
    store.transition(trained, "READY", expected={"PLANNED"})
    assert store.claim(trained, "test-controller")
    store.finalize_success(trained, metrics=[], artifacts=[], env=env, backend="triton", mlflow_run_id=None)
    text = render_table(store, spec, "md", now=NOW, record=False).text
    assert "ran with attn_impl pope=cudnn, deterministic false, precision bf16, graph_mode compile+cuda_graphs" in text


def test_gap_to_paper_row_per_result_with_a_paper_number() -> None:
    from phaselab.catalog.reports.tables.spec import render_latex, render_markdown

    spec = _ii_spec(reference={("rope",): {"ii": (10.0, 1.0)}, ("alibi",): {"ii": 20.0}})
    t = build(spec, _rows({("rope", 0): 0.12, ("rope", 1): 0.12, ("rope", 2): 0.12, ("pope", 0): 0.9}))
    md = render_markdown(t, NOW)
    assert "| rope (gap to paper) | +20.0 % |" in md      # 100 (12 - 10) / 10
    assert "alibi (gap to paper)" not in md and "PoPE (gap to paper)" not in md   # no result / no paper
    assert r"rope (gap to paper) & +20.0 \% \\" in render_latex(t, NOW)


def test_ambiguous_values_are_an_error() -> None:
    rows = _rows({("rope", 0): 0.1})
    rows.append({**rows[0], "stage_hash": h("other")})
    with pytest.raises(ValueError, match="two values"):
        build(_ii_spec(), rows)


def test_render_all_skips_missing_grids_and_check_stale(store: CatalogStore, tmp_path: Path) -> None:
    spec = get_spec("pope_indirect_indexing")
    populate(store, spec)
    out = render_all(store, "md", out_dir=tmp_path, now=NOW)
    done = {r.name for r in out if r.text is not None}
    assert done == {"pope_indirect_indexing"}
    assert all("not in the catalog" in r.skipped for r in out if r.text is None)
    assert (tmp_path / "pope_indirect_indexing.md").read_text().startswith("### Indirect Indexing")
    assert check_stale(store) == {"pope_indirect_indexing": []}

    rerun = h("pope_indirect_indexing/seed=1,variant=pope/eval/1")   # re-runs with a new value
    assert store.transition(rerun, "READY", expected={"SUCCEEDED"})
    assert store.claim(rerun, "c")
    report = check_stale(store)["pope_indirect_indexing"]
    assert report == [f"input stage {rerun[:12]} no longer contributes (re-running or removed)"]
    store.finalize_success(rerun, metrics=[MetricRecord(name="acc", value=0.9, split="test",
                                                        task="indirect_indexing")],
                           artifacts=[], env={}, backend=None, mlflow_run_id=None)
    (reason,) = check_stale(store)["pope_indirect_indexing"]
    assert reason.startswith(f"input stage {rerun[:12]} changed: 1|") and "-> 2|" in reason

    gid = store.reads.get_grid("pope_indirect_indexing")["id"]       # a new seed finishes
    cid = store.upsert_cell(grid_id=gid, cell_key="seed=3,variant=rope", axes={"variant": "rope", "seed": 3})
    new = add_stage(store, cid, "late-seed")
    run_stage(store, new, [MetricRecord(name="acc", value=0.2, split="test", task="indirect_indexing")])
    assert f"new input stage {new[:12]}" in check_stale(store)["pope_indirect_indexing"]
    render_all(store, "md", names=["pope_indirect_indexing"], now=NOW)
    assert check_stale(store) == {"pope_indirect_indexing": []}


@pytest.mark.parametrize("name", ["pope_pg19_extrapolation", "tapa_table1", "tapa_table2", "tapa_table3",
                                  "quickstart_ppl", "tapa_long_context_small"])
def test_figures_render_png_and_pdf(sqlite_store: CatalogStore, tmp_path: Path, name: str) -> None:
    from matplotlib.image import imread

    from phaselab.catalog.reports.figures import CURVE_TABLES, plot_curves, render_figures

    assert name in CURVE_TABLES  # every curve table has its case here
    populate(sqlite_store, get_spec(name))
    paths = render_figures(sqlite_store, tmp_path, names=[name])
    assert sorted(p.name for p in paths) == [f"{name}.pdf", f"{name}.png"]
    assert paths[1].read_bytes()[:4] == b"%PDF"
    img = imread(paths[0])
    assert img.shape[0] > 300 and img.shape[1] > 500 and img[..., :3].std() > 0.05   # not blank
    with pytest.raises(ValueError, match="not numeric"):
        plot_curves(build(get_spec("pope_downstream"), []), tmp_path / "x")


def test_footnote_says_what_ran(sqlite_store: CatalogStore) -> None:
    """The table's footnote names the kernel implementation, determinism, precision, graph mode
    and device its input stages recorded (DESIGN §4); stages that recorded nothing add nothing."""
    store = sqlite_store
    spec = get_spec("pope_indirect_indexing")
    populate(store, spec)
    before = render_table(store, spec, "md", now=NOW, record=False).text
    assert "ran with" not in before
    hashes = sorted(build(spec, store.reads.metrics_frame(grid=spec.grid)).inputs)
    for i, h_ in enumerate(hashes[:2]):
        env = {"git_sha": "0" * 40, "deterministic": i == 0,
               "provenance": {"attention": {"impls": {"pope": ["cudnn"]}}, "precision": "bf16",
                              "compile": True, "cuda_graphs": False, "device": "NVIDIA H200"}}
        store.transition(h_, "READY", expected={"SUCCEEDED"})
        assert store.claim(h_, "test-controller")
        store.finalize_success(h_, metrics=store.reads.metrics_for_stage(h_), artifacts=[], env=env,
                               backend="triton", mlflow_run_id=None)
    text = render_table(store, spec, "md", now=NOW, record=False).text
    assert ("ran with attn_impl pope=cudnn, deterministic false / true, precision bf16, "
            "graph_mode compile, device NVIDIA H200;") in text
