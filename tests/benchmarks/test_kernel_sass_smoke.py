"""benchmarks/kernel_sass.py: the SASS loop parser on a known listing, and one real
offline sm_90a compile of a fused kernel with Triton's bundled ptxas (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_sass as ks

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FADD R2, R3, R4 ;
        /*0020*/               @P0 FMUL R2, R2, R5 ;
        /*0030*/                   MUFU.EX2 R6, R2 ;
        /*0040*/              @!P1 BRA 0x10 ;
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R8, R10, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0060*/                   BRA 0x60;
"""


def test_loops_known_listing():
    (body,) = ks.loops(LISTING, min_len=1)  # the self-branch at 0x60 is not a backward range
    assert [op for _, op, _ in body] == ["FADD", "FMUL", "MUFU", "BRA"]
    assert body[2][2] == ".EX2"
    assert ks.loops(LISTING, min_len=5) == []


def test_pope_dq_compiles_for_sm90_offline():
    """A subprocess without TRITON_INTERPRET: the kernels' conftest sets it for the whole pytest process, and
    interpreted kernels have no compiler front end to audit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_sass.py"), "pope_dq", "--block", "128",
                          "64", "--warps", "8", "--top", "40"], check=False, capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "registers" in run.stdout and "spill" in run.stdout
    first = run.stdout.split("\nloop 1:")[0]  # the unmasked key-block loop's table
    assert "instructions per iteration" in first
    assert "| HGMMA |" in first and "| MUFU |" in first  # Hopper tensor-core MMA, the transform's MUFU ops
