"""benchmarks/ncu_summary.py on the committed Nsight Compute export of the shipped PoPE
kernels (H200, 16k, benchmarks/results/ncu/pope-16k.csv): kernel columns in launch order and known values."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ncu_summary


def test_summary_of_committed_pope_profile():
    table = ncu_summary.summarise(str(ROOT / "benchmarks" / "results" / "ncu" / "pope-16k.csv"))
    lines = table.splitlines()
    assert lines[0] == ("| metric | pope_fwd_kernel | pope_fwd_kernel | pope_bwd_kernel_dkdv | "
                        "pope_bwd_kernel_dq |")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert rows["duration (ms)"][2] == "29.461888"  # dK/dV
    assert rows["registers / thread"][0] == "255"
    assert float(rows["stall: barrier (per issue)"][0]) > 1.0  # the forward's leading stall
    assert rows["local (spill) requests"][0].startswith("0")  # the shipped forward does not spill
