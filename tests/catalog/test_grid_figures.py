"""Figures of any grid from the catalog or an export: ppl vs context length with the training
lengths read from the stages above (pretraining, continued pretraining) or given as marks, NIAH
heat maps, TrueType fonts in the PDFs, and ``phaselab figures --from-export``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
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


# A grid pretrained at 64, trained further at 256 (continued pretraining), evaluated zero-shot and
# after, with a passkey grid after it that no model solves (every value 0.0).
LC_LENGTHS = (64, 128, 256, 512)
LC_DEPTHS = (0.0, 0.5, 1.0)


def _stage(store: CatalogStore, cid: int, label: str, kind: str, config: dict, upstream: str | None) -> str:
    """A stage as the controller records it: its upstream in the cache key and as an edge."""
    from phaselab.catalog.store.rows import StageSpec

    sid = h(label)
    parts = {"kind": kind, "upstream": {"checkpoint": upstream} if upstream else {}}
    store.upsert_stage(StageSpec(stage_hash=sid, kind=kind, name=label.split("-")[0], config=config,
                                 cache_key_parts={"parts": parts, "code_modules": {}}))
    store.link_cell_stage(cid, sid, role=label.split("-")[0])
    if upstream:
        store.add_edge(upstream, sid, "evaluates" if kind == "eval" else "finetunes")
    return sid


def _lc_grid(store: CatalogStore) -> None:
    gid = store.upsert_grid(name="lc", grid_hash=h("lc"), yaml_submitted="", yaml_resolved="")
    for pe in ("rope", "tapa"):
        for seed in (0, 1):
            cid, tag = cell(store, gid, {"pe": pe, "seed": seed}), f"{pe}-{seed}"
            pre = _stage(store, cid, f"pretrain-{tag}", "pretrain", {"model": {"block_size": 64}}, None)
            cpt = _stage(store, cid, f"cpt-{tag}", "cpt", {"data": {"block_size": 256},
                                                            "extend": {"block_size": 256, "rule": "none"}}, pre)
            for sid in (pre, cpt):
                run_stage(store, sid, [MetricRecord(name="loss", value=2.0, split="valid")])
            for role, up, base in (("ppl_zero_shot", pre, 4.0), ("ppl_cpt", cpt, 3.0)):
                sid = _stage(store, cid, f"{role}-{tag}", "eval", {"eval": {"suite": "ppl-by-length"}}, up)
                run_stage(store, sid, [MetricRecord(name="ppl", value=base + i + seed / 10, context_len=L)
                                       for i, L in enumerate(LC_LENGTHS)])
            sid = _stage(store, cid, f"niah_cpt-{tag}", "eval", {"eval": {"suite": "niah"}}, cpt)
            run_stage(store, sid, [MetricRecord(name="niah_acc", value=0.0, context_len=L, depth=d)
                                   for L in (128, 256) for d in LC_DEPTHS])


def _lc_export(store: CatalogStore, tmp_path: Path) -> Path:
    from phaselab.catalog.reports.export import export_grid

    _lc_grid(store)
    export_grid(store, "lc", "parquet", tmp_path / "export")
    return tmp_path / "export"


def _evals(rows: list[dict], role: str | None = None) -> list[str]:
    return sorted({r["stage_hash"] for r in rows if r["name"] == "ppl" and role in (None, r["role"])})


def test_length_marks_read_the_pretraining_and_the_continued_length(sqlite_store: CatalogStore,
                                                                    tmp_path: Path) -> None:
    """Walking up from the evaluations: the cpt stage's length and the pretrained model's, from
    the catalog's edges and, alike, from an export's recorded upstreams."""
    export = _lc_export(sqlite_store, tmp_path)
    both = {64: "pretraining length 64", 256: "continued pretraining length 256"}
    for source in (sqlite_store, gf.read_export(export, "lc")):
        rows, _ = gf._grid_rows(source, "lc")
        assert gf.length_marks(source, _evals(rows)) == both
        assert gf.default_marks(source, _evals(rows)) == (None, both)
        # zero-shot models only: one training length, drawn as before ("train length 64")
        assert gf.default_marks(source, _evals(rows, "ppl_zero_shot")) == (64, None)
    assert gf.length_marks(sqlite_store, []) == {}


def _vertical(ax: Any) -> dict[float, tuple[str, str]]:
    """{x: (label, linestyle)} of the axes' vertical lines."""
    return {float(ln.get_xdata()[0]): (ln.get_label(), ln.get_linestyle()) for ln in ax.get_lines()
            if len(set(ln.get_xdata())) == 1 and len(ln.get_xdata()) == 2}


def test_plot_curves_marks_further_lengths_beside_the_training_length(sqlite_store: CatalogStore) -> None:
    from phaselab.catalog.reports.figures import LEGEND_INSIDE_MAX, curves_figure
    from phaselab.catalog.reports.tables.spec import build

    _lc_grid(sqlite_store)
    spec, rows = gf._length_spec(sqlite_store, Pivot(grid="lc", metric="ppl", rows=("pe", "role"), cols=()))
    t = build(spec, rows)
    plt = gf.pyplot()
    fig, ax = curves_figure(t, logx=True, styled=True, train_len=64,
                            marks={256: "continued pretraining length 256", 64: "pretraining length 64"})
    assert _vertical(ax) == {64.0: ("pretraining length 64", "--"), 256.0: ("continued pretraining length 256", ":")}
    legend = [x.get_text() for x in ax.get_legend().get_texts()]
    assert legend[-2:] == ["pretraining length 64", "continued pretraining length 256"]
    assert len(legend) == 4 + 2 and tuple(fig.get_size_inches()) == (6.4, 4.0)   # inside: 6 entries
    plt.close(fig)
    fig, ax = curves_figure(t, train_len=64)   # the one-length form, as before
    assert _vertical(ax) == {64.0: ("train length 64", "--")}
    plt.close(fig)
    many = {64 * (i + 1): f"mark {i}" for i in range(LEGEND_INSIDE_MAX)}
    fig, ax = curves_figure(t, marks=many)   # 4 lines + 8 marks: the legend goes right of the axes
    assert len(_vertical(ax)) == LEGEND_INSIDE_MAX and fig.get_size_inches()[0] == 9.0
    assert ax.get_legend().get_bbox_to_anchor().x0 > ax.get_window_extent().x1
    plt.close(fig)
    with pytest.raises(ValueError, match="legend must be auto, inside or outside"):
        curves_figure(t, legend="left")


def test_parse_marks_rejects_bad_input_clearly() -> None:
    from phaselab.orchestrator.cli.reports import parse_marks

    assert parse_marks(None) is None and parse_marks([]) is None
    assert parse_marks(["512=pretraining length 512", " 2048 = continued pretraining 2048 "]) == {
        512: "pretraining length 512", 2048: "continued pretraining 2048"}
    for bad in ("512", "=x", "abc=x", "0=zero", "-5=neg", "1.5=half", "512=", "512=  "):
        with pytest.raises(ValueError, match=r"--mark takes LENGTH=LABEL .* got " + re.escape(repr(bad))):
            parse_marks([bad])
    with pytest.raises(ValueError, match="length 512 is marked twice"):
        parse_marks(["512=a", "512=b"])


def test_figure_name_stays_in_the_output_folder() -> None:
    from phaselab.orchestrator.cli.reports import figure_name

    assert figure_name(None, "lc", "niah") == "lc_niah"
    assert figure_name("ppl_by_length", "lc", "length") == "ppl_by_length"
    for bad in ("../x", "a/b", "/etc/x", ".hidden", "", "a b"):
        with pytest.raises(ValueError, match=r"--name takes a file name without folders"):
            figure_name(bad, "lc", "length")


def _figures(export: Path, out: Path, *args: str) -> Any:
    """``phaselab figures lc --from-export EXPORT --out OUT --json ARGS`` through the real CLI."""
    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    return CliRunner().invoke(app, ["figures", "lc", "--from-export", str(export), "--out", str(out), "--json",
                                    *args])


def test_figures_cli_length_from_an_export(sqlite_store: CatalogStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``phaselab figures GRID --from-export DIR``: both lengths marked, read from the export's
    stages; --mark and --train-len replace them."""
    from phaselab.catalog.reports import figures

    export, drawn, draw_marks = _lc_export(sqlite_store, tmp_path), [], figures.draw_marks

    def record_marks(ax: Any, marks: dict) -> list:
        drawn.append(dict(marks))
        return draw_marks(ax, marks)

    monkeypatch.setattr(figures, "draw_marks", record_marks)
    res = _figures(export, tmp_path / "fig", "--rows", "pe,role", "--name", "ppl", "--title", "lc: ppl")
    assert res.exit_code == 0, res.output
    assert [Path(p).name for p in json.loads(res.output)["figures"]] == ["ppl.png", "ppl.pdf"]
    assert drawn.pop() == {64: "pretraining length 64", 256: "continued pretraining length 256"}
    res = _figures(export, tmp_path / "fig", "--rows", "pe,role", "--mark", "128=half", "--train-len", "64")
    assert res.exit_code == 0, res.output
    assert drawn.pop() == {64: "train length 64", 128: "half"}
    assert (tmp_path / "fig" / "lc_length.png").stat().st_size > 5000


def test_figures_cli_niah_from_an_export(sqlite_store: CatalogStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NIAH heat maps of an all-zero export: one panel per stage, titled so that they read
    apart, on the fixed 0..1 scale (one colour, no error)."""
    export, panels, niah_panel = _lc_export(sqlite_store, tmp_path), [], gf._niah_panel

    def record_panel(ax: Any, grid: dict, label: str) -> Any:
        panels.append((label, niah_panel(ax, grid, label)))
        return panels[-1][1]

    monkeypatch.setattr(gf, "_niah_panel", record_panel)
    res = _figures(export, tmp_path / "fig", "--kind", "niah", "--where", "pe=rope")
    assert res.exit_code == 0, res.output
    assert [Path(p).name for p in json.loads(res.output)["figures"]] == ["lc_niah.png", "lc_niah.pdf"]
    assert all((tmp_path / "fig" / name).stat().st_size > 5000 for name in ("lc_niah.png", "lc_niah.pdf"))
    res = _figures(export, tmp_path / "fig", "--kind", "niah", "--rows", "role")   # the pe is added
    assert res.exit_code == 0, res.output
    labels = [label for label, _ in panels]   # the first call's one panel, then the second's two
    assert labels == ["RoPE", "niah_cpt, RoPE", "niah_cpt, TAPA"], labels
    for _, im in panels:
        assert im.get_clim() == (0.0, 1.0) and im.get_array().shape == (len(LC_DEPTHS), 2)
        assert float(im.get_array().max()) == 0.0
    catalog = gf.niah_groups(sqlite_store, Pivot(grid="lc", metric="niah_acc", rows=("pe",), cols=()))
    assert gf.niah_groups(gf.read_export(export, "lc"), Pivot(grid="lc", metric="niah_acc", rows=("pe",),
                                                              cols=())) == catalog
    assert list(catalog) == ["RoPE", "TAPA"] and catalog["RoPE"][(128, 0.5)] == [0.0, 0.0]


def test_figures_cli_rejects_bad_input_with_its_reason(sqlite_store: CatalogStore, tmp_path: Path) -> None:
    export = _lc_export(sqlite_store, tmp_path)
    for args, reason in ((("--mark", "x=y"), "--mark takes LENGTH=LABEL"),
                         (("--train-len", "0"), "--train-len must be a positive length"),
                         (("--kind", "niah", "--where", "pe=alibi"), "no 'niah_acc' values"),
                         (("--kind", "bars"), "--kind must be length, curves or niah")):
        res = _figures(export, tmp_path / "fig", *args)
        assert res.exit_code == 1 and reason in json.loads(res.output)["error"], res.output
    res = _figures(tmp_path / "none", tmp_path / "fig")
    assert res.exit_code == 1 and "--from-export: no folder" in json.loads(res.output)["error"]
    res = _figures(tmp_path, tmp_path / "fig")   # a folder without the grid's export
    assert res.exit_code == 1 and "no export of grid 'lc'" in json.loads(res.output)["error"]
