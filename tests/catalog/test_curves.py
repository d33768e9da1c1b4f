"""Learning curves from ``metrics.jsonl`` points (docs/results figures): grouping by cell without
the seed, labels that name a zip's structured axis by its scalar companion, and the figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaselab.catalog.reports.curves import plot_learning_curves, series

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
