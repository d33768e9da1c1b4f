"""PoPE attention as our Triton prologue and chain rule around cuDNN's attention core (`impl="cudnn"`).

The same Cartesian form as `triton_expand.py` (MATH §3.3, layout "interleaved"):

1. forward: the prologue writes q_hat [B,H,T,2D] and k_hat [B,H,S,2D] in q's dtype (angles,
   cos/sin and the amplitude in fp32); cuDNN's fused attention runs on (q_hat, k_hat, v) with the
   value D wide (cuDNN accepts a value head dim other than the query/key one, so nothing is
   padded); only out and the log-sum-exp are saved, as for plain attention.
2. backward, per group of heads: the prologue again (q_hat, k_hat of the group), cuDNN's backward
   (dq_hat, dk_hat, dv of the group), then the chain-rule kernel back to dq, dk and d delta
   (`triton_expand.pope_expand_bwd`, fp32). The groups bound the 2D-wide buffers that exist
   at once (`GROUP_BYTES`), so the forward+backward peak stays close to plain attention's instead
   of holding four 2D-wide tensors for every head (2.3x cuDNN's peak at 64k tokens,
   benchmarks/results/attention-h200-d64-dv.md).

Where it runs (`unsupported_reason`): CUDA on Hopper or newer (where it was measured), bf16/fp16,
D <= 64 and a multiple of 8 (cuDNN's query/key width 2D <= 128), as many key/value heads as query heads, and a mask
cuDNN can express: non-causal, or causal with the trivial positions 0..T-1 for queries and keys
(cuDNN's causal mask is by index, PoPE's by position). cuDNN's attention backward is not
deterministic in PyTorch (pytorch/pytorch#182551), so a call that asks for determinism is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor

from phaselab.kernels.common import triton_common
from phaselab.kernels.common.checks import capability
from phaselab.kernels.pope.triton_expand import pope_expand_bwd, pope_expand_fwd

GROUP_BYTES = 256 * 2**20   # q_hat, k_hat and their gradients of one head group, at most
MAX_D = 64                  # cuDNN's q/k head dim, 2D, at most 128


def unsupported_reason(q: Tensor, k: Tensor, *, causal: bool, trivial_pos: bool, deterministic: bool) -> str | None:
    """Why `impl="cudnn"` cannot run this call, or None."""
    if deterministic:
        return "cuDNN's attention backward is not deterministic (PyTorch); deterministic calls use impl='expand'"
    if not q.is_cuda or triton_common.interpreting():
        return "cuDNN attention needs a CUDA device"
    if not _hopper_with_cudnn(q.device.index):
        return "measured and tested on Hopper (sm90) or newer with cuDNN only"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}: cuDNN attention runs bf16/fp16"
    if q.shape[-1] > MAX_D or q.shape[-1] % 8:
        return (f"head dim {q.shape[-1]}: cuDNN needs head dims that are multiples of 8, and the 2D-wide "
                f"q/k at most {2 * MAX_D}")
    if q.shape[1] != k.shape[1]:
        return f"{q.shape[1]} query heads but {k.shape[1]} key/value heads: grouped-query heads use impl='expand'"
    if causal and not trivial_pos:
        return ("a causal call with arbitrary positions: cuDNN masks by index, PoPE by position "
                "(trivial_pos=True declares pos_q == pos_k == 0..T-1)")
    return None


@torch.compiler.assume_constant_result  # a property of the device: no graph break when traced
def _hopper_with_cudnn(index: int) -> bool:
    return torch.backends.cudnn.is_available() and capability(index) >= (9, 0)


def head_groups(B: int, H: int, T: int, S: int, D: int, itemsize: int) -> list[tuple[int, int]]:
    """[h0, h1) ranges of heads whose q_hat, k_hat, dq_hat and dk_hat fit `GROUP_BYTES` together."""
    per_head = 2 * B * (T + S) * 2 * D * itemsize
    size = max(1, min(H, GROUP_BYTES // per_head))
    return [(h, min(h + size, H)) for h in range(0, H, size)]


def pope_cudnn_fwd(q: Tensor, k: Tensor, v: Tensor, pos_q: Tensor, pos_k: Tensor, inv_freq: Tensor,
                   delta: Tensor | None, *, scale: float, causal: bool, amplitude: str) -> tuple[Tensor, Tensor]:
    """(out [B,H,T,D] in q's dtype, lse fp32 [B,H,T], cuDNN's own statistic for its backward)."""
    B, H, T, _ = q.shape
    q_hat, k_hat = pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(q_hat, k_hat, v, None, True, 0.0, causal, False,
                                                              scale=scale)
    return res[0], res[1].reshape(B, H, T)


def pope_cudnn_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, delta: Tensor | None, out: Tensor, lse: Tensor,
                   pos_q: Tensor, pos_k: Tensor, inv_freq: Tensor, *, scale: float, causal: bool,
                   amplitude: str) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(dq, dk, dv, d delta fp32 [H, D] or None), head group by head group (module docstring)."""
    B, H, T, D = q.shape
    S = k.shape[2]
    groups = head_groups(B, H, T, S, D, q.element_size())
    # dropout is off, so cuDNN reads no philox state; the nested-tensor arguments stay undefined
    seed = torch.zeros((), dtype=torch.int64, device=q.device)
    cfg = (seed, scale, causal, amplitude)
    if len(groups) == 1:
        return _group_bwd(do, q, k, v, delta, out, lse, pos_q, pos_k, inv_freq, *cfg)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ddelta = None if delta is None else torch.empty_like(delta, dtype=torch.float32)
    for h0, h1 in groups:
        part = (t[:, h0:h1] for t in (do, q, k, v, out, lse))  # strided views: cuDNN and our kernels take them
        g_do, g_q, g_k, g_v, g_out, g_lse = part
        g_delta = None if delta is None else delta[h0:h1]
        _, _, g_dv, g_dd = _group_bwd(g_do, g_q, g_k, g_v, g_delta, g_out, g_lse, pos_q, pos_k, inv_freq, *cfg,
                                      out_dqdk=(dq[:, h0:h1], dk[:, h0:h1]))
        dv[:, h0:h1] = g_dv
        if ddelta is not None:
            ddelta[h0:h1] = g_dd
    return dq, dk, dv, ddelta


def _group_bwd(do, q, k, v, delta, out, lse, pos_q, pos_k, inv_freq, seed, scale, causal, amplitude,
               out_dqdk=None):
    """(dq, dk, dv, d delta) of the heads of q..lse; dq and dk written into out_dqdk if given."""
    B, H, T, _ = q.shape
    S = k.shape[2]
    q_hat, k_hat = pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
    dq_hat, dk_hat, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q_hat, k_hat, v, out, lse.reshape(B, H, T, 1), seed, seed, None, None, None, T, S, 0.0, causal,
        scale=scale)
    del q_hat, k_hat
    dq, dk, ddelta = pope_expand_bwd(dq_hat, dk_hat, q, k, pos_q, pos_k, inv_freq, delta, amplitude, out=out_dqdk)
    return dq, dk, dv, ddelta
