"""benchmarks/attention_ablation.py: "full" is the shipped kernel (it matches the float64
reference) and each variant really swaps its helpers in (its output and dq differ), checked under
TRITON_INTERPRET=1 on a tiny causal case; one subprocess per variant, since a variant patches
module globals before the first launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_ablation.py"


def _checksum(family: str, variant: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--checksum", family, variant], check=False,
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("family", "variant"), [("pope", "no-transform"), ("tapa", "plain")])
def test_full_is_shipped_and_variant_differs(family, variant):
    full = _checksum(family, "full")
    other = _checksum(family, variant)
    assert full["out"] == pytest.approx(full["reference_out"], rel=1e-4)
    assert abs(other["out"] - full["out"]) > 1e-2 * full["out"]
    assert abs(other["dq"] - full["dq"]) > 1e-2 * full["dq"]
