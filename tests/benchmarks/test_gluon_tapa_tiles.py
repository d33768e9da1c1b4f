"""benchmarks/gluon_tapa_tiles.py without a GPU: its candidates hold every default tile, and its
rows, verdicts and tables from given timings (the timers are the other scripts', timed on GPUs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gluon_tapa_tiles


@pytest.mark.parametrize("D", sorted(gluon_tapa_tiles.CANDIDATES))
def test_every_default_tile_is_a_candidate(D):
    for kernel, tile in gluon_tapa_tiles.defaults(D).items():
        assert tile in gluon_tapa_tiles.CANDIDATES[D][kernel], (D, kernel, tile)
        assert len(set(gluon_tapa_tiles.CANDIDATES[D][kernel])) == len(gluon_tapa_tiles.CANDIDATES[D][kernel])


def _timings():
    # three tiles over three rounds; the card runs 20 % slower in round two (cuDNN too)
    return {4096: {"ref": [1.0, 1.2, 1.0],
                   "rows": [[2.0, 2.4, 2.0],      # the default
                            [1.6, 1.92, 1.7],     # fastest: 1.6 / 2.0 a round at best
                            [2.2, 2.64, 2.2]]}}


def test_rows_take_medians_and_per_round_ratios():
    tiles = [(64, 64, 2, 4), (64, 32, 2, 4), (128, 64, 2, 8)]
    rows = gluon_tapa_tiles.summarise(128, "fwd", tiles, (64, 64, 2, 4), _timings())
    assert [r["tile"] for r in rows] == ["64x64x2x4", "64x32x2x4", "128x64x2x8"]
    assert [r["default"] for r in rows] == [True, False, False]
    assert [r["best"] for r in rows] == [False, True, False]
    assert rows[1]["ms"] == pytest.approx(1.7) and (rows[1]["ms_min"], rows[1]["ms_max"]) == (1.6, 1.92)
    assert rows[1]["x_cudnn"] == pytest.approx(1.6) and rows[1]["x_default"] == pytest.approx(0.8)
    assert rows[2]["x_default"] == pytest.approx(1.1) and rows[0]["x_default"] == pytest.approx(1.0)

    verdict, = gluon_tapa_tiles.verdicts(rows)
    assert (verdict["default"], verdict["best"]) == ("64x64x2x4", "64x32x2x4")
    assert verdict["default_over_best"] == pytest.approx(2.0 / 1.7) and verdict["within"] is False
    assert gluon_tapa_tiles.verdicts(rows, limit=1.2)[0]["within"] is True

    text = gluon_tapa_tiles.tables(rows, [verdict])
    assert "| 128 | 4096 | fwd | 64x64x2x4 (default) | 2.000 | 2.000-2.400 | 2.00 | 1.000 |" in text
    assert "| 128 | 4096 | fwd | 64x64x2x4 | 64x32x2x4 | 1.176 | **no** |" in text
    assert "fastest" not in gluon_tapa_tiles.tables(rows)


def test_a_default_that_is_fastest_reads_one():
    timings = {16384: {"ref": [1.0], "rows": [[1.5], [1.6]]}}
    rows = gluon_tapa_tiles.summarise(64, "dq", [(128, 64, 2, 8), (128, 32, 2, 8)], (128, 64, 2, 8), timings)
    verdict, = gluon_tapa_tiles.verdicts(rows)
    assert verdict["default_over_best"] == 1.0 and verdict["within"] is True


def test_repeats_below_one_are_refused():
    with pytest.raises(SystemExit):
        gluon_tapa_tiles.main(["--repeats", "0"])


def test_save_writes_the_rows_so_far_with_their_verdicts(tmp_path):
    import json

    rows = gluon_tapa_tiles.summarise(128, "fwd", [(64, 64, 2, 4), (64, 32, 2, 4), (128, 64, 2, 8)],
                                      (64, 64, 2, 4), _timings())
    meta = {"card": "NVIDIA H200", "commit": "0123abcd"}
    gluon_tapa_tiles.save(str(tmp_path / "tiles"), meta, rows)
    data = json.loads((tmp_path / "tiles.json").read_text())
    assert data["meta"] == meta and len(data["rows"]) == 3
    assert data["summary"][0]["best"] == "64x32x2x4" and data["summary"][0]["within"] is False
    md = (tmp_path / "tiles.md").read_text()
    assert md.startswith("# Gluon TAPA tiles") and "- commit: 0123abcd" in md and "| **no** |" in md
    gluon_tapa_tiles.save(None, meta, rows)   # no --out: nothing written, no error


def test_a_failing_tile_reads_inf_and_is_never_the_fastest(capsys):
    def time_row(tile, N):
        if tile == (64, 32, 3, 4):
            raise RuntimeError("out of resource: shared memory\nmore")
        return {(64, 64, 2, 4): 2.0, (64, 32, 2, 4): 1.8}[tile]

    run = gluon_tapa_tiles.guarded(time_row)
    assert run((64, 32, 3, 4), 4096) == float("inf") and run((64, 64, 2, 4), 4096) == 2.0
    assert "64x32x3x4 at N=4096 failed: RuntimeError: out of resource: shared memory" in capsys.readouterr().out
    tiles = [(64, 64, 2, 4), (64, 32, 2, 4), (64, 32, 3, 4)]
    timings = _interleave(tiles, run)
    rows = gluon_tapa_tiles.summarise(128, "fwd", tiles, (64, 64, 2, 4), timings)
    assert [r["best"] for r in rows] == [False, True, False] and rows[2]["ms"] == float("inf")
    verdict, = gluon_tapa_tiles.verdicts(rows)
    assert verdict["default_over_best"] == pytest.approx(2.0 / 1.8)


def _interleave(tiles, run):
    return gluon_tapa_tiles.gluon_compile_tapa.interleaved([4096], len(tiles), 2, lambda i, N: run(tiles[i], N),
                                                           lambda N: 1.0)
