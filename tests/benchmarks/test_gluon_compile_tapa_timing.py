"""benchmarks/gluon_compile_tapa.py's interleaved timing: the order of the timed calls and the
medians and ratios it prints (no GPU: the timers are plain functions of the call's place)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gluon_compile_tapa


def test_rounds_time_the_reference_then_every_row_in_turn():
    calls = []
    timings = gluon_compile_tapa.interleaved([4096, 16384], 2, 3, lambda i, N: calls.append((i, N)) or 1.0,
                                             lambda N: calls.append(("ref", N)) or 1.0)
    assert calls == [("ref", 4096), (0, 4096), (1, 4096)] * 3 + [("ref", 16384), (0, 16384), (1, 16384)] * 3
    assert timings[4096] == {"ref": [1.0] * 3, "rows": [[1.0] * 3, [1.0] * 3]}


def test_lines_give_medians_ranges_and_per_round_ratios():
    # the card slows by half in the second round: per-round ratios stay 2.0 and 1.5, the plain
    # ratio of medians would not
    refs, rows = iter([1.0, 1.5, 1.0]), iter([2.0, 1.5, 3.0, 2.25, 2.0, 1.5])
    timings = gluon_compile_tapa.interleaved([4096], 2, 3, lambda i, N: next(rows), lambda N: next(refs))
    lines = gluon_compile_tapa.timing_lines(["a", "b"], timings)
    assert lines == ["  N=4096: cuDNN 1.000 ms (median of 3 rounds)",
                     "  N=4096 a: 2.000 ms (2.000-3.000), x cuDNN 2.00",
                     "  N=4096 b: 1.500 ms (1.500-2.250), x cuDNN 1.50"]


def test_repeats_below_one_are_refused():
    with pytest.raises(SystemExit):
        gluon_compile_tapa.main(["--time", "4096", "--repeats", "0"])
