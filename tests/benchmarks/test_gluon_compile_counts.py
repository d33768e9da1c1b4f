"""benchmarks/gluon_compile.py's count of a key-block loop on a known listing: its instructions,
MUFU among them, those a forward branch inside the loop can skip, and its opcodes (no GPU, no
compile)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gluon_compile


def _listing(body_ops: list[str], start: int = 0x100) -> str:
    lines = [f"        /*{start - 0x10:04x}*/                   MOV R1, c[0x0][0x28] ;"]
    lines += [f"        /*{start + 0x10 * i:04x}*/                   {op} ;" for i, op in enumerate(body_ops)]
    end = start + 0x10 * len(body_ops)
    lines += [f"        /*{end:04x}*/               @P0 BRA 0x{start:x} ;",
              f"        /*{end + 0x10:04x}*/                   EXIT ;",
              # an mbarrier wait's retry: back from after EXIT into the loop, not a loop of its own
              f"        /*{end + 0x20:04x}*/                   BRA 0x{start + 0x10:x} ;"]
    return "\n".join(lines)


def test_loop_counts_known_listing():
    ops = ["HGMMA.64x64x16.F32.BF16 R8, R10, gdesc[UR4], RZ, !UPT, gsb0", "MUFU.EX2 R6, R2", "MUFU.COS R7, R3"]
    ops += ["@!P1 BRA 0x{:x}"]   # a forward branch over the next three instructions
    ops += ["FMUL R2, R2, R5"] * 3 + ["FADD R2, R3, R4"] * 200
    skip_to = 0x100 + 0x10 * 7   # the first FADD (ops[7])
    ops[3] = ops[3].format(skip_to)
    assert gluon_compile.loop_counts(_listing(ops)) == [(len(ops) + 1, 2, 3)]   # + the back branch


def test_loop_counts_needs_a_wgmma():
    assert gluon_compile.loop_counts(_listing(["FADD R2, R3, R4"] * 210)) == []


def test_loop_opcodes_known_listing():
    ops = ["HGMMA.64x64x16.F32.BF16 R8, R10, gdesc[UR4], RZ, !UPT, gsb0", "MUFU.COS R7, R3", "MUFU.COS R9, R3"]
    ops += ["FMUL.RZ R3, R3, 0.15915493667125701904", "FMUL R2, R2, R5"] + ["FADD R2, R3, R4"] * 200
    counts = gluon_compile.loop_opcodes(gluon_compile.key_block_loops(_listing(ops)))
    assert len(counts) == 1
    assert counts[0] == {"HGMMA.64x64x16.F32.BF16": 1, "MUFU.COS": 2, "FMUL.RZ": 1, "FMUL": 1, "FADD": 200, "BRA": 1}
    assert gluon_compile.loop_opcodes(gluon_compile.key_block_loops(_listing(["FADD R2, R3, R4"] * 210))) == []
