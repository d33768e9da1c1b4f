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


def test_source_summary_of_committed_tapa_gluon_profile():
    """The source page of the Gluon TAPA forward (H200, 16k, ncu/tapa-gluon-16k-source.csv.gz): the
    shares of warp-state samples by reason add up to nearly all samples (98.6 %: the page names
    no reason for the rest) and lead with the issuing warp."""
    text = ncu_summary.source_stalls(str(ROOT / "benchmarks" / "results" / "ncu" / "tapa-gluon-16k-source.csv.gz"),
                                     top=50)
    lines = text.splitlines()
    assert lines[0] == "gluon_tapa_fwd_kernel: 1355657 warp-state samples"
    reasons = {}
    for line in lines[4:]:
        if not line.startswith("| "):
            break
        name, pct, ops = line.strip("| ").split(" | ")
        reasons[name] = (float(pct), ops)
    assert 97.0 < sum(p for p, _ in reasons.values()) <= 100.05
    assert list(reasons)[:3] == ["selected", "not_selected", "dispatch"]
    assert reasons["selected"][0] == 30.3 and reasons["long_sb"][1].startswith("BRA 4.7")
    assert ncu_summary._opcode("@!P0 BRA 0x7fd0817d2e70") == "BRA"
    assert ncu_summary._opcode("HGMMA.64x64x16.F32.BF16 R120, gdesc[UR16], RZ, !UPT") == "HGMMA"
