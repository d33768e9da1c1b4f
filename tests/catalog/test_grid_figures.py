"""Figures of any grid from the catalog: ppl vs context length with the training length read
from the trained upstream, NIAH heat maps, TrueType fonts in the PDFs."""

from __future__ import annotations

from pathlib import Path

from catalog_testlib import add_stage, cell, h, run_stage
from test_pivot import _grid

from phaselab.catalog.reports import grid_figures as gf
from phaselab.catalog.reports.tables import Pivot
from phaselab.catalog.store import walks
from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking import MetricRecord


def _truetype_only(pdf: Path) -> bool:
    data = pdf.read_bytes()
    return b"/FontFile2" in data and b"/Type3" not in data


def test_length_curves_mark_the_training_length(sqlite_store: CatalogStore, tmp_path: Path) -> None:
    _grid(sqlite_store)
    evals = [r["stage_hash"] for r in sqlite_store.reads.metrics_frame(grid="lr_sweep")]
    assert walks.train_lengths(sqlite_store, evals) == []            # no trained upstream recorded
    cid = sqlite_store.reads.cells_for_stage(evals[0])[0]["cell_id"]
    pre = add_stage(sqlite_store, cid, "pretrain-64", kind="pretrain", config={"model": {"block_size": 64}})
    sqlite_store.add_edge(pre, evals[0], "evaluates")
    assert walks.train_lengths(sqlite_store, evals[:1]) == [64]
    paths = gf.length_curves(sqlite_store, Pivot(grid="lr_sweep", metric="ppl", rows=("lr", "pe"), cols=()),
                             tmp_path / "ppl")
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 5000 for p in paths)
    assert _truetype_only(paths[1])


def test_niah_heatmaps_one_panel_per_row(sqlite_store: CatalogStore, tmp_path: Path) -> None:
    gid = sqlite_store.upsert_grid(name="niah", grid_hash=h("niah"), yaml_submitted="", yaml_resolved="")
    for pe in ("rope", "tapa"):
        sid = add_stage(sqlite_store, cell(sqlite_store, gid, {"pe": pe, "seed": 0}), f"niah-{pe}")
        run_stage(sqlite_store, sid, [MetricRecord(name="niah_acc", value=1.0 - d * (pe == "rope"), context_len=L,
                                                   depth=d) for L in (64, 128) for d in (0.0, 0.5, 1.0)])
    paths = gf.niah_heatmaps(sqlite_store, Pivot(grid="niah", metric="niah_acc", rows=("pe",), cols=()),
                             tmp_path / "niah")
    assert len(paths) == 2 and _truetype_only(paths[1])


def test_table_figures_read_like_grid_figures() -> None:
    """``phaselab tables --out`` draws with the labels of ``phaselab figures``: the length axis
    with its unit, encodings by their papers' names (plus a log-2 axis and styled lines)."""
    from phaselab.catalog.reports.figures import _labelled
    from phaselab.catalog.reports.tables import get_spec

    spec = _labelled(get_spec("quickstart_ppl"))
    assert spec.cols.title == "context length [tokens]"
    pe = next(d for d in spec.rows if d.field == "axes.pe")
    assert [pe.label(v) for v in pe.values] == [{"rope": "RoPE", "pope": "PoPE", "tapa": "TAPA"}[v] for v in pe.values]


def test_learning_curves_of_an_accuracy_task_add_accuracy_and_crossings(sqlite_store: CatalogStore,
                                                                        tmp_path: Path) -> None:
    """A grid whose runs log validation accuracy gets its panel and, beside the figure, the first
    step each run reached 20 / 50 / 80 % (when it left a plateau)."""
    import json

    gid = sqlite_store.upsert_grid(name="ii", grid_hash=h("ii"), yaml_submitted="", yaml_resolved="")
    acc = {0: (0.1, 0.3, 0.9), 1: (0.1, 0.1, 0.25)}
    for seed, values in acc.items():
        sid = add_stage(sqlite_store, cell(sqlite_store, gid, {"pe": "pope", "seed": seed}), f"train-{seed}",
                        kind="pretrain")
        run_stage(sqlite_store, sid, [MetricRecord(name="acc", value=values[-1], split="valid")])
        folder = tmp_path / "runs" / sid
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(
            json.dumps({"step": 1000 * (i + 1), "train/loss": 3.0 - i, "valid/loss": 3.0 - i, "valid/acc": a}) + "\n"
            for i, a in enumerate(values)))
    paths = gf.learning_curves(sqlite_store, "ii", tmp_path / "runs", tmp_path / "ii_curves")
    assert [p.name for p in paths] == ["ii_curves.png", "ii_curves.pdf", "ii_curves_crossings.md"]
    table = paths[2].read_text()
    assert "| train-0: pe=pope | 0 | 2k | 3k | 3k | 3k | 0.9 |" in table, table   # stages named apart here
    assert "| train-1: pe=pope | 1 | 3k | never | never | 3k | 0.25 |" in table, table
