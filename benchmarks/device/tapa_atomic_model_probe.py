"""H200 probe (written 2026-12-01, session 3; not run yet): the tiny TAPA model trained 6 steps on the
triton backend with the atomic-dQ backward forced (`tapa_attention(deterministic=False)` patched in
for this process only), against the reference backend, bf16 autocast: the check that failed in
session 3's call 3 (benchmarks/NOTES-device.md). Prints both loss curves, then the same with the
deterministic backward, so one call says whether the failure reproduces and where it starts."""
import functools
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "tests/kernels")
import shim

shim.install()
from test_triton_pope import tiny_model_losses

from phaselab.kernels.attention import function

ORIGINAL = function.tapa_attention
for deterministic in (False, True):
    function.tapa_attention = functools.partial(ORIGINAL, deterministic=deterministic)
    ref, tri = tiny_model_losses("tapa", "reference"), tiny_model_losses("tapa", "triton")
    print(f"deterministic={deterministic}: reference {[round(v, 4) for v in ref]} "
          f"triton {[round(v, 4) for v in tri]}", flush=True)
