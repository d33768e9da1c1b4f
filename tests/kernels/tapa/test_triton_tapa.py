"""Fused TAPA attention (kernels/tapa/triton_tapa.py) against the float64 reference.

CPU: TRITON_INTERPRET=1 on tiny awkward shapes (tests/kernels/conftest.py sets it without CUDA).
GPU (`gpu`): shape x dtype x causal x T<S x phase sweep with the 2x calibrated rule (DESIGN §6).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import triton
import triton.language as tl

from phaselab.kernels import registry
from phaselab.kernels.attention import reference
from phaselab.kernels.common import triton_common
from phaselab.kernels.common.score_mod import ScoreMod, tapa_split
from phaselab.kernels.tapa import phase as tapa_phase
from phaselab.kernels.tapa import triton_tapa
from phaselab.kernels.tapa.function import tapa_attention
from phaselab.kernels.testing import assert_close, calibrated_close, forced_config, generator, shape_id

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                       reason="CPU interpreter test; the gpu tests cover CUDA")
NAMES = ("out", "dq", "dk", "dv")


def seeded_like(x, seed=7):
    """A seeded standard-normal tensor like x (the upstream gradient dO)."""
    return torch.randn(x.shape, generator=generator(seed, x.device.type), device=x.device).to(x.dtype)


def make_inputs(B, H, G, T, S, D, dtype, device, *, offset=0, seed=42, phase_std=1.0):
    gen = generator(seed, device)
    q = torch.randn(B, H, T, D, generator=gen, device=device)
    k = torch.randn(B, G, S, D, generator=gen, device=device)
    v = torch.randn(B, G, S, D, generator=gen, device=device).to(dtype)
    q[..., D // 2:] *= phase_std  # scales |Phi| (the argument of the cosine; MATH §4.5)
    pos_k = (torch.arange(S, device=device) + offset)[None].expand(B, S).contiguous()
    return q.to(dtype), k.to(dtype), v, pos_k[:, S - T:].contiguous(), pos_k


def run(q, k, v, pos_q, pos_k, do, *, causal, params, dtype=None, deterministic=True):
    """(out, dq, dk, dv): the reference in `dtype` when given, else the Triton kernel."""
    leaves = [(t.detach().to(dtype) if dtype else t.detach().clone()).requires_grad_() for t in (q, k, v)]
    if dtype is None:
        out = tapa_attention(*leaves, pos_q_BT=pos_q, pos_k_BS=pos_k, causal=causal, deterministic=deterministic,
                             **params)
        out.backward(do)
    else:
        out = reference.attention(*leaves, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0, causal=causal,
                                  score_mod=ScoreMod(kind="tapa", params=params), compute_dtype=dtype)
        out.backward(do.to(dtype))
    return out, *[t.grad for t in leaves]


# (B, H, G, T, S, D, causal, params)
CPU_CASES = [
    (1, 2, 1, 37, 37, 32, True, {"alpha": 0.1}),
    (1, 2, 2, 7, 45, 32, True, {"alpha": 0.5, "phase": "linear"}),
    (2, 4, 2, 20, 20, 64, False, {"alpha": 0.3, "theta": 0.25, "phase_scale": 1.0}),
    (1, 2, 1, 19, 33, 48, True, {"alpha": 0.1, "theta": 0.5, "phase": "linear"}),
    # keys up to ~140 positions back: most tiles take the binomial series of `_tapa_turns`
    (1, 2, 1, 16, 160, 32, True, {"alpha": 0.1}),
]


@needs_interpreter
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params", CPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6],
                                       phase=c[7].get("phase", "quadratic")) for c in CPU_CASES])
def test_tapa_interpreter_matches_float64_reference(B, H, G, T, S, D, causal, params):
    q, k, v, pos_q, pos_k = make_inputs(B, H, G, T, S, D, torch.float32, "cpu", offset=3)
    do = torch.randn(B, H, T, D, generator=generator(7))
    ref = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, dtype=torch.float64)
    out = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"tapa-{name}", r, o, 2e-5)


@triton.jit
def _turns_probe(pq, pk, out, alpha, k_turn, u_max, c1, c2, c3, c4, c5, MASKED: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr):
    o_m, o_n = tl.arange(0, BM), tl.arange(0, BN)
    b_pq = tl.load(pq + o_m)
    b_pk, k_lo, k_hi = tapa_phase._block_pos(pk, 0, BN, BN, MASKED)
    q_lo, q_hi, u, _ = tapa_phase._row_range(b_pq, o_m < BM, True, u_max)
    w = tapa_phase._tapa_turns(b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn, u, c1, c2, c3, c4, c5,
                                MASKED, True, False)
    tl.store(out + o_m[:, None] * BN + o_n[None, :], w)


@needs_interpreter
@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.5, 2.0, 3.7])
@pytest.mark.parametrize("q0,k0,masked", [(1000, 0, False), (5, 200, False), (2**17, 2**17 - 300, False),
                                          (20, 0, False), (1000, 0, True), (2**40 + 1000, 2**40, False),
                                          (2**24 + 7, 2**24 + 20, True)])
def test_tapa_phase_weight_series_matches_float64(alpha, q0, k0, masked):
    """W = k_turn |m - n|^alpha from `_tapa_turns` against float64, whether the tile takes the
    binomial series (far from the diagonal, either sign of m - n) or the exact path (q0=20: too
    near; masked tiles). Bound: 3e-7 plus the fp32 rounding of the exponent alpha log2 d that the
    per-row exp2 (and torch's own fp32 pow) carries, ~1e-7 |alpha log2 d| relative."""
    pq = torch.arange(16, dtype=torch.int64) + q0
    pk = torch.arange(16, dtype=torch.int64) * 3 + k0  # keys 3 apart: a block spanning 45 positions
    u_max, *coef = tapa_phase._taylor(alpha)
    out = torch.empty(16, 16, dtype=torch.float32)
    _turns_probe[(1,)](pq, pk, out, alpha, 0.7, u_max, *coef, MASKED=masked, BM=16, BN=16)
    d = (pq[:, None] - pk[None, :]).abs().double()
    ref = 0.7 * d.pow(alpha)
    assert torch.equal(out[d == 0], torch.zeros_like(out[d == 0]))  # 0^alpha = 0 on the diagonal
    rel = ((out.double() - ref).abs() / ref)[d > 0].max().item()
    assert rel < 3e-7 + 1e-7 * alpha * math.log2(d.max().item()), rel


def test_tapa_series_radius_bounds_the_tail():
    """`_taylor`'s u_max keeps sum_{k>=6} |binom(alpha, k)| u^k under 1.4e-7 (summed to k = 60)."""
    for alpha in (0.05, 0.1, 0.5, 0.9, 1.5, 2.5, 4.2, 5.9):
        u_max, *coef = tapa_phase._taylor(alpha)
        c, tail = 1.0, 0.0
        for k in range(1, 61):
            c *= (alpha - k + 1) / k
            if k <= 5:
                assert c == pytest.approx(coef[k - 1], rel=1e-12)
            else:
                tail += abs(c) * u_max ** k
        assert tail < 1.4e-7, (alpha, u_max, tail)
        assert u_max >= 0.1 or alpha > 5  # TAPA's alphas: the series covers tiles ~5 blocks out
    assert tapa_phase._taylor(7.5)[0] == 0.0


@needs_interpreter
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params", CPU_CASES[:3] + CPU_CASES[4:],
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6],
                                       phase=c[7].get("phase", "quadratic")) for c in CPU_CASES[:3] + CPU_CASES[4:]])
def test_tapa_interpreter_atomic_dq_matches_float64_reference(B, H, G, T, S, D, causal, params):
    """deterministic=False: dQ added with fp32 atomics in the dK/dV kernel (no dQ kernel) matches
    float64 like the deterministic path (GQA, Lq < Lk, linear phase, the forward's series tiles)."""
    q, k, v, pos_q, pos_k = make_inputs(B, H, G, T, S, D, torch.float32, "cpu", offset=3)
    do = torch.randn(B, H, T, D, generator=generator(7))
    ref = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, dtype=torch.float64)
    out = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, deterministic=False)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"tapa-atomic-{name}", r, o, 2e-5)


@needs_interpreter
def test_tapa_interpreter_unsorted_far_keys_take_the_exact_path():
    """Shuffled key positions far from the queries: block ends are not the extremes, so the series
    must not be taken on the ends' say-so (`_row_range` passes u = -1); matches float64."""
    q, k, v, pos_q, pos_k = make_inputs(1, 2, 1, 16, 160, 32, torch.float32, "cpu", offset=3)
    pos_k = pos_k[:, torch.randperm(160, generator=generator(3))].contiguous()
    do = seeded_like(q)
    ref = run(q, k, v, pos_q, pos_k, do, causal=False, params={"alpha": 0.1}, dtype=torch.float64)
    out = run(q, k, v, pos_q, pos_k, do, causal=False, params={"alpha": 0.1})
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"tapa-unsorted-{name}", r, o, 2e-5)


@needs_interpreter
def test_tapa_interpreter_large_phase_and_empty_rows():
    """|w Phi| up to ~1e3 (MATH §7.4) stays accurate after range reduction; a query before every
    key outputs 0; distances near 2**17 (positions offset) keep exact integer differences."""
    q, k, v, pos_q, pos_k = make_inputs(1, 2, 1, 24, 24, 32, torch.float32, "cpu", offset=2**17, phase_std=30.0)
    pos_q = pos_q.clone()
    pos_q[0, :2] = 0
    do = seeded_like(q)
    params = {"alpha": 0.5, "phase_scale": 2 * math.pi}
    ref = run(q, k, v, pos_q, pos_k, do, causal=True, params=params, dtype=torch.float64)
    out = run(q, k, v, pos_q, pos_k, do, causal=True, params=params)
    d_amp, d_phase = tapa_split(32, 0.5)
    phi = (q[..., d_amp:] @ k[..., d_amp:].transpose(-1, -2)).abs().max() / math.sqrt(d_phase)
    assert phi * 2 * math.pi * 23 ** 0.5 > 1e3  # the test really reaches large cosine arguments
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"tapa-bigphase-{name}", r, o, 1e-4)
    assert torch.equal(out[0][0, :, :2], torch.zeros_like(out[0][0, :, :2]))


# Absolute positions where fp32 no longer holds every integer (2**24 + 7), near the int32 limit and
# far beyond it: the reference subtracts in int64, so |m - n| is exact there and the kernels must
# match it as at small positions (the distance is subtracted in integers before any conversion).
BIG_OFFSETS = [2**24 + 7, 2**31 - 100, 2**50 + 3]


@needs_interpreter
@pytest.mark.parametrize("offset", BIG_OFFSETS)
@pytest.mark.parametrize("case", [CPU_CASES[0], CPU_CASES[1], CPU_CASES[4]], ids=["causal", "Lq<Lk-linear", "series"])
def test_tapa_interpreter_large_absolute_positions(offset, case):
    B, H, G, T, S, D, causal, params = case
    params = params | {"alpha": 0.5}  # a steep weight: a distance off by one moves the phase visibly
    q, k, v, pos_q, pos_k = make_inputs(B, H, G, T, S, D, torch.float32, "cpu", offset=offset)
    do = seeded_like(q)
    ref = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, dtype=torch.float64)
    out = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, deterministic=offset != 2**31 - 100)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"tapa-offset{offset}-{name}", r, o, 2e-5)


@needs_interpreter
@pytest.mark.parametrize("causal", [True, False])
def test_tapa_interpreter_tiles_spanning_beyond_fp32_integers(causal):
    """Positions jump by 2**25 inside a block (and sit at 2**33 in row 1): a tile whose positions
    span more than 2**24 cannot hold them exactly in fp32 even relative to its first key, so it
    subtracts in int64; distances within each side of the jump stay exact, those across it are
    rounded once to fp32 (relative 6e-8, alpha = 0.1 keeps that far below the tolerance)."""
    q, k, v, _, _ = make_inputs(2, 2, 1, 37, 37, 32, torch.float32, "cpu")
    pos = torch.arange(37).repeat(2, 1)
    pos[:, 20:] += 2**25
    pos[1] += 2**33
    do = seeded_like(q)
    params = {"alpha": 0.1}
    ref = run(q, k, v, pos, pos, do, causal=causal, params=params, dtype=torch.float64)
    out = run(q, k, v, pos, pos, do, causal=causal, params=params)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"tapa-span-{name}", r, o, 2e-5)


@needs_interpreter
def test_tapa_interpreter_registry_and_validation():
    q, k, v, pos_q, pos_k = make_inputs(1, 2, 1, 16, 16, 32, torch.float32, "cpu")
    mod = ScoreMod(kind="tapa", params={})
    call = registry.AttnCall.describe(q, k, v, causal=True, score_mod=mod, deterministic=True)
    out = registry.resolve("triton", call)(q, k, v, pos_q=pos_q, pos_k=pos_k, scale=1.0, causal=True,
                                           score_mod=mod)
    ref = reference.attention(q.double(), k.double(), v.double(), pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0,
                              score_mod=mod, compute_dtype=torch.float64)
    assert_close("tapa-registry", ref, out, 2e-5)
    with pytest.raises(ValueError, match="theta=0.01"):
        tapa_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, theta=0.01)
    with pytest.raises(ValueError, match="alpha=0"):
        tapa_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, alpha=0)
    with pytest.raises(ValueError, match="phase='cubic'"):
        tapa_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, phase="cubic")
    with pytest.raises(ValueError, match=r"pos_k_BS has shape \(1, 15\)"):
        tapa_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k[:, :15])


# ----------------------------------------------------------------------------- GPU sweep


def torch_same_dtype(q, k, v, pos_q, pos_k, do, *, causal, params):
    """PyTorch in q's dtype: the two dots in q's dtype, w and the cosine in fp32 (MATH §7.5 forbids
    a low-precision distance table), logits rounded to q's dtype, fp32 softmax, P@V in q's dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    qq, kk, vv = leaves[0], reference.repeat_kv(leaves[1], q.shape[1]), reference.repeat_kv(leaves[2], q.shape[1])
    d_amp, d_phase = tapa_split(q.shape[-1], params.get("theta", 0.5))
    amp = (qq[..., :d_amp] @ kk[..., :d_amp].transpose(-1, -2)) / math.sqrt(d_amp)
    if params.get("phase", "quadratic") == "quadratic":
        phi = (qq[..., d_amp:] @ kk[..., d_amp:].transpose(-1, -2)) / math.sqrt(d_phase)
    else:
        phi = (qq[..., d_amp:].sum(-1)[..., None] + kk[..., d_amp:].sum(-1)[..., None, :]) / math.sqrt(d_phase)
    dist = (pos_q[:, :, None] - pos_k[:, None, :]).abs().float()[:, None]
    w = params.get("phase_scale", 2 * math.pi) * dist.pow(params.get("alpha", 0.1))
    logits = (amp.float() * torch.cos(w * phi.float())).to(q.dtype)
    vis = reference.visibility(pos_q, pos_k) if causal else None
    out = reference.masked_softmax(logits.float(), vis).to(q.dtype) @ vv
    out.backward(do)
    return out, *[t.grad for t in leaves]


GPU_CASES = [  # (B, H, G, T, S, D, causal, params, dtype)
    (2, 4, 4, 63, 63, 64, True, {"alpha": 0.1}, torch.bfloat16),
    (2, 4, 2, 217, 217, 128, True, {"alpha": 0.5, "phase_scale": 1.0}, torch.float16),
    (1, 4, 4, 500, 500, 64, False, {"alpha": 0.1, "phase": "linear"}, torch.bfloat16),
    (1, 4, 4, 100, 733, 128, True, {"alpha": 0.1}, torch.bfloat16),
    (1, 2, 2, 1, 1024, 128, True, {"alpha": 0.1}, torch.float16),
    (1, 8, 2, 1000, 1000, 128, True, {"alpha": 0.1, "phase": "linear"}, torch.bfloat16),
    (1, 4, 4, 300, 300, 96, True, {"alpha": 0.1, "theta": 0.25}, torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", GPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6],
                                       phase=c[7].get("phase", "quadratic"), dtype=c[8]) for c in GPU_CASES])
def test_tapa_gpu_calibrated(B, H, G, T, S, D, causal, params, dtype):
    q, k, v, pos_q, pos_k = make_inputs(B, H, G, T, S, D, dtype, "cuda", offset=3)
    do = torch.randn(B, H, T, D, generator=generator(7, "cuda"), device="cuda").to(dtype)
    ref = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, dtype=torch.float64)
    low = torch_same_dtype(q, k, v, pos_q, pos_k, do, causal=causal, params=params)
    out = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params)
    for name, r, lo, o in zip(NAMES, ref, low, out):
        calibrated_close(f"tapa-{name}", r, o, lo, factor=2.0, atol=1e-3 * max(r.abs().max().item(), 1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[3], GPU_CASES[5]], ids=["fp16-gqa", "Lq<Lk", "linear-gqa"])
def test_tapa_gpu_atomic_dq_calibrated(case):
    """deterministic=False (fp32-atomic dQ in the dK/dV kernel) under the same 2x rule."""
    B, H, G, T, S, D, causal, params, dtype = case
    q, k, v, pos_q, pos_k = make_inputs(B, H, G, T, S, D, dtype, "cuda", offset=3)
    do = torch.randn(B, H, T, D, generator=generator(7, "cuda"), device="cuda").to(dtype)
    ref = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, dtype=torch.float64)
    low = torch_same_dtype(q, k, v, pos_q, pos_k, do, causal=causal, params=params)
    out = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, deterministic=False)
    for name, r, lo, o in zip(NAMES, ref, low, out):
        calibrated_close(f"tapa-atomic-{name}", r, o, lo, factor=2.0, atol=1e-3 * max(r.abs().max().item(), 1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", triton_common._bwd_configs(),
                         ids=lambda c: f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}-w{c.num_warps}")
def test_tapa_gpu_every_bwd_config(cfg):
    """Each backward tile config the autotuner may pick (the GPU sweep above runs only the first),
    on the awkward fp16 GQA case with D=128 and T=217, under the same 2x rule."""
    B, H, G, T, S, D, causal, params, dtype = GPU_CASES[1]
    q, k, v, pos_q, pos_k = make_inputs(B, H, G, T, S, D, dtype, "cuda", offset=3)
    do = torch.randn(B, H, T, D, generator=generator(7, "cuda"), device="cuda").to(dtype)
    ref = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, dtype=torch.float64)
    low = torch_same_dtype(q, k, v, pos_q, pos_k, do, causal=causal, params=params)
    with forced_config(cfg, triton_tapa.tapa_bwd_kernel_dkdv, triton_tapa.tapa_bwd_kernel_dq):
        out = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params)
    for name, r, lo, o in zip(NAMES, ref, low, out):
        calibrated_close(f"tapa-{cfg}-{name}", r, o, lo, factor=2.0, atol=1e-3 * max(r.abs().max().item(), 1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("offset", BIG_OFFSETS)
@pytest.mark.parametrize("case", [GPU_CASES[0], GPU_CASES[3]], ids=["causal", "Lq<Lk"])
def test_tapa_gpu_large_absolute_positions(offset, case):
    """Positions offset beyond 2**24 on the compiled kernels (the series and the exact path, both
    backward modes) under the 2x rule; `torch_same_dtype` subtracts positions in int64."""
    B, H, G, T, S, D, causal, params, dtype = case
    q, k, v, pos_q, pos_k = make_inputs(B, H, G, T, S, D, dtype, "cuda", offset=offset)
    do = torch.randn(B, H, T, D, generator=generator(7, "cuda"), device="cuda").to(dtype)
    ref = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, dtype=torch.float64)
    low = torch_same_dtype(q, k, v, pos_q, pos_k, do, causal=causal, params=params)
    for deterministic in (True, False):
        out = run(q, k, v, pos_q, pos_k, do, causal=causal, params=params, deterministic=deterministic)
        for name, r, lo, o in zip(NAMES, ref, low, out):
            calibrated_close(f"tapa-offset{offset}-{name}", r, o, lo, factor=2.0,
                             atol=1e-3 * max(r.abs().max().item(), 1.0))


@pytest.mark.gpu
def test_tapa_gpu_large_phase_deterministic():
    """|w Phi| in the hundreds (MATH §7.4) through the GPU's range reduction + cos.approx; two
    backward passes are bitwise equal (no atomics, MATH §7.8)."""
    q, k, v, pos_q, pos_k = make_inputs(1, 4, 2, 300, 300, 64, torch.bfloat16, "cuda", phase_std=10.0)
    do = seeded_like(q)
    params = {"alpha": 0.1}
    ref = run(q, k, v, pos_q, pos_k, do, causal=True, params=params, dtype=torch.float64)
    low = torch_same_dtype(q, k, v, pos_q, pos_k, do, causal=True, params=params)
    first = run(q, k, v, pos_q, pos_k, do, causal=True, params=params)
    second = run(q, k, v, pos_q, pos_k, do, causal=True, params=params)
    for name, r, lo, a, b in zip(NAMES, ref, low, first, second):
        calibrated_close(f"tapa-bigphase-{name}", r, a, lo, factor=2.0, atol=1e-3 * max(r.abs().max().item(), 1.0))
        assert torch.equal(a, b)
