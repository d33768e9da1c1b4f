"""Learning curves from ``metrics.jsonl`` points (docs/results figures): grouping by cell without
the seed, labels that name a zip's structured axis by its scalar companion, and the figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaselab.catalog.reports.curves import crossings, crossings_markdown, plot_learning_curves, series

ZIP = {"a1": {"variant": "rope", "pe": {"kind": "rope"}, "seed": 0},
       "a2": {"variant": "rope", "pe": {"kind": "rope"}, "seed": 1},
       "b1": {"variant": "pope", "pe": {"kind": "pope"}, "seed": 0}}


def _points(axes_of: dict) -> list[dict]:
    return [{"stage_hash": h, "step": step, "valid/loss": 3.0 - 0.1 * step - (0.05 if axes["seed"] else 0.0)}
            for h, axes in axes_of.items() for step in (1, 2, 3)]


def test_series_groups_seeds_and_labels_by_the_scalar_axis():
    got = series(_points(ZIP), ZIP, "valid/loss")
    assert sorted(got) == ["variant=pope", "variant=rope"]
    assert sorted(got["variant=rope"]) == [0, 1]
    assert got["variant=rope"][1] == {1: pytest.approx(2.85), 2: pytest.approx(2.75), 3: pytest.approx(2.65)}


def test_structured_axes_stay_in_the_label_when_they_tell_cells_apart():
    product = {"a": {"pe": "rope", "jsb": {"policy": "split"}, "seed": 0},
               "b": {"pe": "rope", "jsb": {"policy": "truncate"}, "seed": 0}}
    got = series(_points(product), product, "valid/loss")
    assert sorted(got) == ['jsb={"policy": "split"}', 'jsb={"policy": "truncate"}']   # pe: shared
    only = {"a": {"pe": {"kind": "rope"}, "seed": 0}, "b": {"pe": {"kind": "rope"}, "seed": 1}}
    assert list(series(_points(only), only, "valid/loss")) == ['pe={"kind": "rope"}']   # one cell: named


def test_labels_leave_out_what_every_cell_shares_and_name_stages_only_when_several():
    zip_ = {"s": {"variant": "short", "block": 48, "delta": "uniform", "seed": 1},
            "z": {"variant": "zero", "block": 48, "delta": "zero", "seed": 1}}
    points = [p | {"stage": "train"} for p in _points(zip_)]
    assert sorted(series(points, zip_, "valid/loss")) == ["delta=uniform, variant=short", "delta=zero, variant=zero"]
    points += [{"stage_hash": "s", "stage": "ft", "step": 1, "valid/loss": 1.0}]
    assert sorted(series(points, zip_, "valid/loss")) == ["ft: delta=uniform, variant=short",
                                                          "train: delta=uniform, variant=short",
                                                          "train: delta=zero, variant=zero"]


def test_plot_writes_the_figure_and_refuses_an_empty_one(tmp_path: Path):
    paths = plot_learning_curves(_points(ZIP), ZIP, tmp_path / "curves", metrics=("train/loss", "valid/loss"),
                                 formats=("png",))
    assert [p.name for p in paths] == ["curves.png"] and paths[0].stat().st_size > 10_000
    with pytest.raises(ValueError, match="no points"):
        plot_learning_curves(_points(ZIP), ZIP, tmp_path / "none", metrics=("test/loss",))


def test_crossings_give_the_first_step_at_each_threshold_per_seed():
    axes_of = {"a0": {"pe": "pope", "seed": 0}, "a1": {"pe": "pope", "seed": 1}}
    acc = {"a0": [(1000, 0.10), (2000, 0.25), (3000, 0.60), (4000, 0.85)],
           "a1": [(1000, 0.09), (2000, 0.11), (3000, 0.21), (4000, 0.33)]}
    points = [{"stage_hash": h, "step": s, "valid/acc": v} for h, rows in acc.items() for s, v in rows]
    rows = crossings(points, axes_of, "valid/acc", (0.2, 0.5, 0.8))
    assert [(r["seed"], r[">=0.2"], r[">=0.5"], r[">=0.8"], r["last"]) for r in rows] == [
        (0, 2000, 3000, 4000, 0.85), (1, 3000, None, None, 0.33)]
    table = crossings_markdown(rows, "valid/acc")
    assert "| pe=pope | 1 | 3k | never | never | 4k | 0.33 |" in table, table
    # a falling metric: thresholds as negatives read -loss
    loss = [{"stage_hash": "a0", "step": s, "valid/loss": v} for s, v in ((10, 3.0), (20, 1.5), (30, 0.9))]
    assert crossings(loss, axes_of, "valid/loss", (-1.0,))[0][">=-1"] == 30
