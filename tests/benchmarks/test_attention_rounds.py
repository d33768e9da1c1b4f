"""benchmarks/attention.py's interleaved rounds (`--rounds`): the order in which a shape's methods
are timed, the medians of a row's rounds and the per-round ratios (no GPU: the timer is a plain
function of the call's place)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention


def _result(ms: float, status: str = "ok") -> dict:
    return {"status": status, "ms": ms, "host_ms": ms / 10, "queued_ms": ms * 0.9, "tflops": 100.0 / ms,
            "peak_gib": ms / 4, "configs": {}}


def test_rounds_time_every_method_in_turn_and_ratios_are_per_round(monkeypatch):
    # the card slows by half in the second round: the per-round ratios stay 1.5 and 2.0
    timings = iter([1.0, 1.5, 1.5, 2.25, 1.0, 1.5] * 2)
    calls = []

    def bench_one(method, B, H, N, D, mode, warmup, iters, profile):
        calls.append((method, mode))
        return _result(next(timings))

    monkeypatch.setattr(attention, "bench_one", bench_one)
    monkeypatch.setattr(attention.torch.cuda, "empty_cache", lambda: None)
    args = argparse.Namespace(head_dims=[128], lengths=[4096], tokens=65536, heads=16, methods=["sdpa-cudnn", "x"],
                              rounds=3, material_limit_gib=8.0, warmup=1, iters=2, profile=0)
    monkeypatch.setitem(attention.METHOD_KIND, "x", "tapa")
    rows = attention.run(args)
    assert calls == [("sdpa-cudnn", "fwd"), ("x", "fwd")] * 3 + [("sdpa-cudnn", "fwd+bwd"), ("x", "fwd+bwd")] * 3
    ref, x = rows[0], rows[1]
    assert ref["ms_rounds"] == [1.0, 1.5, 1.0] and ref["ms"] == 1.0 and x["ms_rounds"] == [1.5, 2.25, 1.5]
    assert x["ms"] == 1.5 and x["x_sdpa-cudnn"] == pytest.approx(1.5) and x["peak_gib"] == 2.25 / 4
    assert x["tflops"] == pytest.approx(100.0 / 1.5) and x["queued_ms"] == pytest.approx(1.35)


def test_one_round_is_the_plain_row_and_a_failed_round_fails_the_row():
    assert attention.merge_rounds([_result(2.0)]) == _result(2.0)
    assert attention.merge_rounds([_result(2.0), {"status": "OOM"}]) == {"status": "OOM"}
    rows = [dict(method="sdpa-cudnn", N=1, D=64, mode="fwd", **_result(2.0)),
            dict(method="x", N=1, D=64, mode="fwd", **_result(3.0))]
    attention.add_ratios(rows)
    assert rows[1]["x_sdpa-cudnn"] == 1.5


def test_rounds_below_one_are_refused():
    with pytest.raises(SystemExit):
        attention.main(["--rounds", "0"])
