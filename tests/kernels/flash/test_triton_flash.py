"""Flash attention core (kernels/flash/triton_flash.py) against the float64 reference.

CPU: TRITON_INTERPRET=1 on tiny awkward shapes (tests/kernels/conftest.py sets it without CUDA):
q/k width != v width, lengths no block divides, GQA, T < S decode, batch-broadcast positions,
offsets beyond 2**24, strided (sorted, not consecutive), shuffled positions and rows that see no
key; each position kind takes a different block-bound path in the kernels.
GPU (`gpu`): bf16/fp16 sweep with the 2x calibrated rule (DESIGN §6), every tile config.
"""

from __future__ import annotations

import os

import pytest
import torch

from phaselab.kernels.attention import reference
from phaselab.kernels.flash import reference as flash_reference
from phaselab.kernels.flash import triton_flash
from phaselab.kernels.flash.function import flash_attention, pos_flags
from phaselab.kernels.testing import assert_close, calibrated_close, forced_config, generator, shape_id

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                       reason="CPU interpreter test; the gpu tests cover CUDA")

NAMES = ("out", "dq", "dk", "dv")


def make_positions(kind, B, T, S, device, seed=3):
    """(pos_q, pos_k) passed to the kernel (None for "index") and the explicit ones for the reference."""
    ar = torch.arange(S, device=device)
    if kind == "index":
        return None, None, ar[S - T:][None], ar[None]
    if kind == "offset":  # consecutive from 2**24 + 7, one row broadcast over the batch
        pk = (ar + 2**24 + 7)[None]
    elif kind == "strided":  # sorted, not consecutive: bounds by bisection
        pk = torch.stack([3 * ar + 11 * b for b in range(B)])
    else:  # "shuffled": no block skipping; the first queries come before every key
        pk = ar[torch.randperm(S, generator=generator(seed))][None].to(device)
        pq = ar[S - T:][None].clone()
        pq[0, :2] = -1
        return pq, pk, pq, pk
    return pk[:, S - T:].contiguous(), pk, pk[:, S - T:].contiguous(), pk


def make_inputs(B, H, G, T, S, DK, DV, dtype, device, seed=42):
    gen = generator(seed, device)
    q = torch.randn(B, H, T, DK, generator=gen, device=device).to(dtype)
    k = torch.randn(B, G, S, DK, generator=gen, device=device).to(dtype)
    v = torch.randn(B, G, S, DV, generator=gen, device=device).to(dtype)
    do = torch.randn(B, H, T, DV, generator=gen, device=device).to(dtype)
    return q, k, v, do


def reference_grads(q, k, v, do, rq, rk, *, causal, dtype=torch.float64):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = flash_reference.flash_attention(*leaves, pos_q_BT=rq, pos_k_BS=rk, causal=causal, compute_dtype=dtype)
    out.backward(do.to(dtype))
    return out, *[t.grad for t in leaves]


def flash_grads(q, k, v, do, pq, pk, *, causal):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, pos_q_BT=pq, pos_k_BS=pk, causal=causal)
    out.backward(do)
    return out, *[t.grad for t in leaves]


# (B, H, G, T, S, DK, DV, causal, positions)
CPU_CASES = [(1, 2, 1, 37, 37, 32, 16, True, "index"), (1, 2, 2, 7, 45, 16, 32, True, "offset"),
             (2, 4, 2, 20, 20, 32, 32, False, "index"), (2, 2, 1, 33, 33, 48, 16, True, "strided"),
             (1, 2, 1, 24, 24, 16, 16, True, "shuffled"), (2, 2, 2, 19, 19, 32, 16, True, "offset")]


@needs_interpreter
@pytest.mark.parametrize("B,H,G,T,S,DK,DV,causal,kind", CPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], DK=c[5], DV=c[6], causal=c[7],
                                       pos=c[8]) for c in CPU_CASES])
def test_flash_interpreter_matches_float64_reference(B, H, G, T, S, DK, DV, causal, kind):
    q, k, v, do = make_inputs(B, H, G, T, S, DK, DV, torch.float32, "cpu")
    pq, pk, rq, rk = make_positions(kind, B, T, S, "cpu")
    ref = reference_grads(q, k, v, do, rq, rk, causal=causal)
    out = flash_grads(q, k, v, do, pq, pk, causal=causal)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"flash-{kind}-{name}", r, o, 1e-5)
    if kind == "shuffled":  # two queries before every key: exactly 0 out and no gradient
        assert torch.equal(out[0][0, :, :2], torch.zeros_like(out[0][0, :, :2]))
        assert torch.equal(out[1][0, :, :2], torch.zeros_like(out[1][0, :, :2]))


@needs_interpreter
def test_flash_interpreter_lse_flags_and_determinism():
    """lse is log2(sum exp(logits)) over the visible keys (+inf for an empty row); the position
    flags pick the intended block-bound path; two backward runs agree bitwise."""
    B, H, T, S, D = 1, 2, 21, 21, 16
    q, k, v, do = make_inputs(B, H, H, T, S, D, D, torch.float32, "cpu")
    pq, pk, rq, rk = make_positions("shuffled", B, T, S, "cpu")
    _, lse = triton_flash.flash_fwd(q, k, v, pq, pk, pos_flags(pq, pk), scale=D**-0.5, causal=True)
    want = flash_reference.row_lse2(q.double(), k.double(), pos_q_BT=rq, pos_k_BS=rk, scale=D**-0.5)
    assert torch.equal(torch.isinf(lse), torch.isinf(want)) and (want[0, :, :2] == float("inf")).all()
    assert_close("lse", want[..., 2:], lse[..., 2:], 1e-6)
    ar = torch.arange(S)[None]
    assert pos_flags(ar[:, 5:] + 9, ar + 9).tolist() == [7]     # consecutive (bottom-right), sorted
    assert pos_flags(3 * ar, 3 * ar).tolist() == [3]            # sorted only
    assert pos_flags(ar.flip(1), ar).tolist() == [1]            # keys sorted, queries not
    assert pos_flags(torch.cat([ar, ar + 1]), ar).tolist() == [7, 3]  # per batch row
    first = flash_grads(q, k, v, do, pq, pk, causal=True)
    second = flash_grads(q, k, v, do, pq, pk, causal=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_flash_validation():
    q, k, v, _ = make_inputs(1, 2, 1, 8, 8, 16, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="both positions or neither"):
        flash_attention(q, k, v, pos_q_BT=torch.arange(8)[None])
    with pytest.raises(ValueError, match="G | H"):
        flash_attention(q, k.expand(1, 3, 8, 16), v.expand(1, 3, 8, 16))
    with pytest.raises(ValueError, match="one dtype"):
        flash_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="pos_k_BS must be int64"):
        flash_attention(q, k, v, pos_q_BT=torch.arange(8)[None], pos_k_BS=torch.arange(8.0)[None])


# ----------------------------------------------------------------------------- GPU sweep


def torch_same_dtype(q, k, v, do, rq, rk, *, causal):
    """PyTorch in q's dtype: logits and P@V in bf16/fp16 with an fp32 softmax (flash-attention's
    `upcast=False` reference)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    H = q.shape[1]
    logits = (leaves[0] @ reference.repeat_kv(leaves[1], H).transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    vis = reference.visibility(rq, rk) if causal else None
    out = reference.masked_softmax(logits.float(), vis).to(q.dtype) @ reference.repeat_kv(leaves[2], H)
    out.backward(do)
    return out, *[t.grad for t in leaves]


def check_calibrated(label, q, k, v, do, pq, pk, rq, rk, *, causal):
    ref = reference_grads(q, k, v, do, rq, rk, causal=causal)
    low = torch_same_dtype(q, k, v, do, rq, rk, causal=causal)
    out = flash_grads(q, k, v, do, pq, pk, causal=causal)
    for name, r, lo, o in zip(NAMES, ref, low, out):
        calibrated_close(f"{label}-{name}", r, o, lo, factor=2.0, atol=1e-3 * max(r.abs().max().item(), 1.0))


GPU_CASES = [  # (B, H, G, T, S, DK, DV, causal, positions, dtype)
    (2, 4, 4, 63, 63, 64, 64, True, "index", torch.bfloat16),
    (1, 8, 2, 1000, 1000, 128, 64, True, "offset", torch.bfloat16),
    (1, 4, 4, 100, 733, 128, 64, True, "offset", torch.float16),
    (1, 4, 4, 77, 300, 96, 48, False, "strided", torch.bfloat16),
    (1, 2, 2, 1, 1024, 128, 64, True, "offset", torch.bfloat16),
    (1, 4, 2, 500, 500, 64, 64, True, "shuffled", torch.bfloat16),
    (1, 4, 4, 257, 257, 256, 128, True, "index", torch.bfloat16)]  # PoPE's core at D = 128


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,G,T,S,DK,DV,causal,kind,dtype", GPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], DK=c[5], DV=c[6], causal=c[7],
                                       pos=c[8], dtype=c[9]) for c in GPU_CASES])
def test_flash_gpu_calibrated(B, H, G, T, S, DK, DV, causal, kind, dtype):
    q, k, v, do = make_inputs(B, H, G, T, S, DK, DV, dtype, "cuda")
    pq, pk, rq, rk = make_positions(kind, B, T, S, "cuda")
    check_calibrated(f"flash-{kind}", q, k, v, do, pq, pk, rq, rk, causal=causal)


def _cfg_id(c):
    return f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}-w{c.num_warps}-s{c.num_stages}"


@pytest.mark.gpu
@pytest.mark.parametrize("width,kind", [((64, 64), "index"), ((128, 64), "offset")], ids=["plain-D64", "pope-DK128"])
@pytest.mark.parametrize("i", range(3))
def test_flash_gpu_every_config(width, kind, i):
    """Main config i of each autotune list (the sweep above runs only the first that fits) on a
    GQA case whose lengths no tile divides, at the benchmark's two widths and position kinds."""
    lists = (triton_flash.fwd_configs(), triton_flash.dkdv_configs(), triton_flash.dq_configs())
    kernels = (triton_flash.flash_fwd_kernel, triton_flash.flash_bwd_kernel_dkdv, triton_flash.flash_bwd_kernel_dq)
    DK, DV = width
    q, k, v, do = make_inputs(1, 8, 2, 1000, 1000, DK, DV, torch.bfloat16, "cuda")
    pq, pk, rq, rk = make_positions(kind, 1, 1000, 1000, "cuda")
    with (forced_config(lists[0][i], kernels[0]), forced_config(lists[1][i], kernels[1]),
          forced_config(lists[2][i], kernels[2])):
        check_calibrated(f"flash-{kind}-cfg{i}", q, k, v, do, pq, pk, rq, rk, causal=True)


@pytest.mark.gpu
def test_flash_gpu_deterministic_long():
    q, k, v, do = make_inputs(1, 4, 4, 4096, 4096, 128, 64, torch.bfloat16, "cuda")
    first = flash_grads(q, k, v, do, None, None, causal=True)
    second = flash_grads(q, k, v, do, None, None, causal=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    ar = torch.arange(4096, device="cuda")[None]
    ref = reference.attention(q, k, v, pos_q_BT=ar, pos_k_BS=ar, scale=128**-0.5)
    assert_close("flash-4k-out", ref.float(), first[0].float(), 2e-2)
