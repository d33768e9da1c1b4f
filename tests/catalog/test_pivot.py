"""Generic tables of any grid (``phaselab tables GRID --metric --rows --cols``): mean ± std over
seeds, holes for cells without a value, missing seeds flagged, markdown/LaTeX/CSV, and CSV lines
that stay whole when piped."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from catalog_testlib import add_stage, cell, h, run_stage
from typer.testing import CliRunner

from phaselab.catalog.reports.tables import Pivot, render_pivot
from phaselab.catalog.store.api import CatalogStore
from phaselab.catalog.tracking import MetricRecord

LRS = (0.001, 0.003)


def _grid(store: CatalogStore) -> None:
    """An lr × pe × seed sweep no table module knows; (lr=0.003, pe=pope) has no result at all,
    (lr=0.001, pe=rope) lacks seed 2, and the ppl at 128 is missing for pope."""
    gid = store.upsert_grid(name="lr_sweep", grid_hash=h("lr_sweep"), yaml_submitted="", yaml_resolved="")
    for lr in LRS:
        for pe in ("rope", "pope"):
            for seed in (0, 1, 2):
                cid = cell(store, gid, {"lr": lr, "pe": pe, "seed": seed})
                sid = add_stage(store, cid, f"ppl-{lr}-{pe}-{seed}", role="ppl")
                if (lr, pe) == (0.003, "pope") or ((lr, pe, seed) == (0.001, "rope", 2)):
                    continue
                lengths = (64,) if pe == "pope" else (64, 128)
                run_stage(store, sid, [MetricRecord(name="ppl", value=value(lr, pe, seed, L), context_len=L,
                                                    split="valid") for L in lengths]
                          + [MetricRecord(name="acc", value=0.5, split="valid")])


def value(lr: float, pe: str, seed: int, length: int) -> float:
    return 10.0 + 100 * lr + (2.0 if pe == "rope" else 0.0) + 0.5 * seed + length / 64


def test_pivot_over_axes_with_holes_and_missing_seeds(sqlite_store: CatalogStore) -> None:
    _grid(sqlite_store)
    pivot = Pivot(grid="lr_sweep", metric="ppl", rows=("lr", "pe"), cols=("context_len",))
    md = render_pivot(sqlite_store, pivot, "md").text
    lines = {ln.split("|")[1].strip() + "/" + ln.split("|")[2].strip(): [c.strip() for c in ln.split("|")[3:-1]]
             for ln in md.splitlines() if ln.startswith("| 0.")}
    rope = [value(0.001, "rope", s, 64) for s in (0, 1)]
    assert lines["0.001/rope"][0] == f"{statistics.fmean(rope):.2f} ± {statistics.stdev(rope):.2f} (n=2/3)"
    pope = [value(0.001, "pope", s, 64) for s in (0, 1, 2)]
    assert lines["0.001/pope"] == [f"**{statistics.fmean(pope):.2f} ± {statistics.stdev(pope):.2f}**", "—"]
    assert lines["0.003/pope"] == ["—", "—"]                        # a cell of the grid with no result
    assert md.splitlines()[2] == "| lr | pe | 64 | 128 |"
    tex = render_pivot(sqlite_store, pivot, "latex").text
    assert r"\pm" in tex and "--" in tex

    csv = render_pivot(sqlite_store, pivot, "csv").text.splitlines()
    assert csv[0] == "axes.lr,axes.pe,context_len,mean,std,n,expected,best,stages"
    assert csv[1].startswith(f"0.001,rope,64,{statistics.fmean(rope)!r},{statistics.stdev(rope)!r},2,3,0,")


def test_pivot_errors_name_what_exists(sqlite_store: CatalogStore) -> None:
    _grid(sqlite_store)
    with pytest.raises(ValueError, match=r"no 'pll' values; its metrics: acc, ppl"):
        render_pivot(sqlite_store, Pivot(grid="lr_sweep", metric="pll", rows=("pe",), cols=("context_len",)), "md")
    with pytest.raises(ValueError, match=r"unknown table field 'size'.*lr, pe, seed"):
        render_pivot(sqlite_store, Pivot(grid="lr_sweep", metric="ppl", rows=("size",), cols=("context_len",)), "md")
    with pytest.raises(ValueError, match="two values"):   # lr averaged away: two stages per (pe, ctx, seed)
        render_pivot(sqlite_store, Pivot(grid="lr_sweep", metric="ppl", rows=("pe",), cols=("context_len",)), "md")


def test_cli_pivot_csv_is_not_wrapped_when_piped(tmp_path: Path) -> None:
    from phaselab.orchestrator.cli.main import app

    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    store = CatalogStore(url)
    store.upgrade()
    _grid(store)
    res = CliRunner().invoke(app, ["tables", "lr_sweep", "--metric", "ppl", "--rows", "lr,pe", "--cols",
                                   "context_len,split", "--where", "split=valid", "--format", "csv", "--catalog", url])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "axes.lr,axes.pe,context_len,split,mean,std,n,expected,best,stages"
    assert len(lines) == 1 + 4 * 2 and all(len(ln.split(",")) == 10 for ln in lines)
    assert max(len(ln) for ln in lines) > 80                       # long lines came out whole
    res = CliRunner().invoke(app, ["tables", "lr_sweep", "other", "--metric", "ppl", "--rows", "pe",
                                   "--cols", "context_len", "--catalog", url])
    assert res.exit_code == 1 and "pivots one grid" in res.output
    store.dispose()


def test_pivot_from_an_export_equals_the_catalog_pivot_on_the_cells_that_ran(sqlite_store: CatalogStore,
                                                                            tmp_path: Path) -> None:
    """``phaselab tables GRID --metric M --from-export DIR``: the same numbers as the catalog's
    pivot; a cell that never ran has no row in an export, so it is absent instead of a hole."""
    from phaselab.catalog.reports.export import export_grid
    from phaselab.catalog.reports.tables import render_pivot_from_export

    _grid(sqlite_store)
    export_grid(sqlite_store, "lr_sweep", "parquet", tmp_path / "export")
    pivot = Pivot(grid="lr_sweep", metric="ppl", rows=("lr", "pe"), cols=("context_len",))
    body = lambda text: [ln for ln in text.splitlines() if ln.startswith("|")]
    want = body(render_pivot(sqlite_store, pivot, "md").text)
    got = body(render_pivot_from_export(pivot, tmp_path / "export", "md").text)
    assert got == [ln for ln in want if not ln.startswith("| 0.003 | pope |")]
    assert any("(n=2/3)" in ln for ln in got)
    with pytest.raises(ValueError, match="no export of grid 'lr_sweep'"):
        render_pivot_from_export(pivot, tmp_path / "nothing", "md")
    runner = CliRunner()
    from phaselab.orchestrator.cli.main import app

    res = runner.invoke(app, ["tables", "lr_sweep", "--metric", "ppl", "--rows", "lr,pe", "--cols", "context_len",
                              "--from-export", str(tmp_path / "export")])
    assert res.exit_code == 0, res.output
    assert body(res.output) == got
