"""H200 probe (2026-12-01): the atomic-dQ TAPA backward failed `trains_like_reference[tapa]` (tiny
model: B=4, H=4, T=64, D=32, bf16, q/k/v strided views of one projection) while its calibrated GPU
tests (D=64/128, contiguous inputs) passed. Relative errors of dq/dk/dv against float64, with the
deterministic and the atomic backward, over the shapes that separate those cases."""
import sys

import torch

sys.path.insert(0, "benchmarks")
import shim

shim.install()
from phaselab.kernels.attention import reference
from phaselab.kernels.attention.function import tapa_attention
from phaselab.kernels.attention.score_mod import ScoreMod


def grads(fn, base, do, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in base]
    q, k, v = (t.transpose(1, 2) for t in leaves)  # the model's BTHD -> BHTD views
    fn(q, k, v).backward(do.to(dtype))
    return [t.grad.double() for t in leaves]


for B, T, H, D, dtype in [(4, 64, 4, 32, torch.bfloat16), (4, 64, 4, 64, torch.bfloat16),
                          (2, 256, 4, 32, torch.bfloat16), (4, 64, 4, 32, torch.float32)]:
    g = torch.Generator("cuda").manual_seed(0)
    base = [torch.randn(B, T, H, D, generator=g, device="cuda") for _ in range(3)]
    do = torch.randn(B, H, T, D, generator=g, device="cuda")
    pos = torch.arange(T, device="cuda")[None].expand(B, T)
    mod = ScoreMod(kind="tapa", params={"alpha": 0.1, "theta": 0.5})
    ref = grads(lambda q, k, v, pos=pos, mod=mod: reference.attention(
        q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=1.0, causal=True, score_mod=mod, compute_dtype=torch.float64),
        base, do, torch.float64)
    for det in (True, False):
        out = grads(lambda q, k, v, pos=pos, det=det: tapa_attention(
            q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5, deterministic=det), base, do, dtype)
        errs = {n: f"{((o - r).norm() / r.norm()).item():.2e}" for n, o, r in zip(("dq", "dk", "dv"), out, ref)}
        print(f"B{B} T{T} H{H} D{D} {str(dtype)[6:]} deterministic={det}: {errs}", flush=True)
