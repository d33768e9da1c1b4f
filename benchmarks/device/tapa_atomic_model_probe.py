"""H200 probe (written 2026-12-01, session 3; not run yet): the tiny TAPA model trained 6 steps on the
triton backend with the atomic-dQ backward forced (`tapa_attention(deterministic=False)` patched in
for this process only), against the reference backend, bf16 autocast: the check that failed in
session 3's call 3 (benchmarks/NOTES-device.md). Prints both loss curves, then the same with the
deterministic backward, so one call says whether the failure reproduces and where it starts."""
import functools
import sys

import torch

sys.path.insert(0, "benchmarks")
import shim

shim.install()
from phaselab.kernels.attention import function
from phaselab.kernels.testing import generator
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer

ORIGINAL = function.tapa_attention


def curve(backend: str) -> list[float]:
    torch.manual_seed(0)
    cfg = preset("tiny", pe={"kind": "tapa"}, attention={"backend": backend})
    model = Transformer(cfg, device_type="cuda").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=generator(0, "cuda"), device="cuda")
    y = torch.roll(x, -1, dims=1)
    out = []
    for _ in range(6):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, targets_BT=y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        model.after_optimizer_step()
        out.append(round(loss.item(), 4))
    return out


for deterministic in (False, True):
    function.tapa_attention = functools.partial(ORIGINAL, deterministic=deterministic)
    print(f"deterministic={deterministic}: reference {curve('reference')} triton {curve('triton')}", flush=True)
