"""benchmarks/gpu_clocks.py's sampler and the clock columns of benchmarks/attention.py's rows (no
GPU: samples are placed by hand, or the sampler runs where neither NVML nor nvidia-smi exists)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention
from gpu_clocks import ClockSampler


def test_mean_takes_only_the_samples_inside_the_window():
    s = ClockSampler(period_s=0.1)
    s.samples = [(1.0, 1980.0, 300.0), (2.0, 1710.0, 690.0), (3.0, 1750.0, 700.0), (4.0, 1980.0, 250.0)]
    assert s.mean(1.5, 3.0) == (pytest.approx(1730.0), pytest.approx(695.0))
    assert s.mean(0.0, 0.5) == (None, None)
    # a window shorter than the period takes the samples within one period of it
    assert s.mean(2.05, 2.06) == (pytest.approx(1710.0), pytest.approx(690.0))


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None or importlib.util.find_spec("pynvml") is not None,
                    reason="a machine with a GPU tool samples for real")
def test_without_nvml_or_nvidia_smi_the_sampler_stays_inactive():
    s = ClockSampler().start()
    s.stop()
    assert s.source is None and not s.samples and s.mean(0.0, 1e12) == (None, None)


def _row(method: str, ms: float, mhz: float | None) -> dict:
    row = {"method": method, "N": 4096, "B": 16, "H": 16, "D": 128, "mode": "fwd", "status": "ok", "ms": ms,
           "host_ms": 0.1, "queued_ms": ms * 0.9, "tflops": 100.0, "peak_gib": 0.25, "configs": {}}
    if mhz is not None:
        row.update(sm_mhz=mhz, power_w=650.0, queued_sm_mhz=1980.0)
    return row


def test_rounds_keep_the_median_clock_and_the_table_shows_it():
    merged = attention.merge_rounds([_row("x", 3.0, 1700.0), _row("x", 3.1, 1750.0), _row("x", 3.2, 1800.0)])
    assert merged["sm_mhz"] == 1750.0 and merged["queued_sm_mhz"] == 1980.0 and merged["power_w"] == 650.0
    text = attention.table([merged, _row("y", 2.0, None)])
    head, _, first, second = text.splitlines()[:4]
    assert head.endswith("| queued ms | SM MHz synced / queued | W |")
    assert first.endswith("| 2.790 | 1750 / 1980 | 650 |") and second.endswith("| 1.800 | - | - |")
    # a round without a clock leaves the row without one
    assert "sm_mhz" not in attention.merge_rounds([_row("x", 3.0, 1700.0), _row("x", 3.1, None)])
