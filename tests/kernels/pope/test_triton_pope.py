"""Fused PoPE attention (kernels/pope/triton_pope.py) against the float64 reference.

CPU: TRITON_INTERPRET=1 on tiny awkward shapes (tests/kernels/conftest.py sets it without CUDA).
GPU (`gpu`): shape x dtype x causal x T<S sweep with the 2x calibrated rule (DESIGN §6).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from phaselab.kernels import registry
from phaselab.kernels.attention import reference
from phaselab.kernels.attention.function import TritonBackend
from phaselab.kernels.common import triton_common
from phaselab.kernels.common.options import AttentionOptions
from phaselab.kernels.common.score_mod import ScoreMod, pope_inv_freq
from phaselab.kernels.pope import reference as pope_reference
from phaselab.kernels.pope import triton_pope
from phaselab.kernels.pope.function import pope_attention
from phaselab.kernels.testing import assert_close, calibrated_close, forced_config, generator, shape_id

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                       reason="CPU interpreter test; the gpu tests cover CUDA")


def make_inputs(B, H, G, T, S, D, dtype, device, *, delta=True, offset=0, seed=42):
    gen = generator(seed, device)
    q = torch.randn(B, H, T, D, generator=gen, device=device).to(dtype)
    k = torch.randn(B, G, S, D, generator=gen, device=device).to(dtype)
    v = torch.randn(B, G, S, D, generator=gen, device=device).to(dtype)
    pos_k = (torch.arange(S, device=device) + offset)[None].expand(B, S).contiguous()
    pos_q = pos_k[:, S - T:].contiguous()  # bottom-right: the queries are the last T keys
    d = (-2 * math.pi * torch.rand(H, D, generator=gen, device=device)) if delta else None
    return q, k, v, pos_q, pos_k, pope_inv_freq(D).to(device), d


def reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, *, causal, amplitude="softplus",
                    dtype=torch.float64):
    """(out, dq, dk, dv, ddelta) of the reference in `dtype` (float64: the spec)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    d = None if delta is None else delta.detach().to(dtype).requires_grad_()
    mod = ScoreMod(kind="pope", params={"inv_freq": inv_freq, "delta": d, "amplitude": amplitude})
    out = reference.attention(*leaves, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=q.shape[-1] ** -0.5,
                              causal=causal, score_mod=mod, compute_dtype=dtype)
    out.backward(do.to(dtype))
    return out, *[t.grad for t in leaves], (None if d is None else d.grad)


def triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, *, causal, amplitude="softplus", impl="fused",
                 **call):
    """The same through `pope_attention` (``impl``: this file tests "fused"; None = the default;
    ``call``: the wrapper's other keywords, e.g. trivial_pos and deterministic)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    d = None if delta is None else delta.detach().clone().requires_grad_()
    out = pope_attention(*leaves, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=d,
                         causal=causal, amplitude=amplitude, impl=impl, **call)
    out.backward(do)
    return out, *[t.grad for t in leaves], (None if d is None else d.grad)


NAMES = ("out", "dq", "dk", "dv", "ddelta")


def seeded_like(x, seed=7):
    """A seeded standard-normal tensor like x (the upstream gradient dO)."""
    return torch.randn(x.shape, generator=generator(seed, x.device.type), device=x.device).to(x.dtype)

# (B, H, G, T, S, D, causal): N=37 D=32; T<S; GQA with D=48 padded to 64 in registers
CPU_CASES = [(1, 2, 1, 37, 37, 32, True), (1, 2, 2, 7, 45, 32, True), (2, 4, 2, 20, 20, 48, False),
             (1, 2, 1, 19, 33, 16, False)]


@needs_interpreter
@pytest.mark.parametrize("B,H,G,T,S,D,causal", CPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6]) for c in CPU_CASES])
def test_pope_interpreter_matches_float64_reference(B, H, G, T, S, D, causal):
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(B, H, G, T, S, D, torch.float32, "cpu", offset=5)
    do = torch.randn(B, H, T, D, generator=generator(7))
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    out = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"pope-{name}", r, o, 1e-5)


@needs_interpreter
@pytest.mark.parametrize("amplitude", ["relu", "identity"])
def test_pope_interpreter_amplitude_ablations(amplitude):
    q, k, v, pos_q, pos_k, inv_freq, _delta = make_inputs(1, 2, 1, 21, 21, 32, torch.float32, "cpu", delta=False)
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, None, do, causal=True, amplitude=amplitude)
    out = triton_grads(q, k, v, pos_q, pos_k, inv_freq, None, do, causal=True, amplitude=amplitude)
    for name, r, o in zip(NAMES[:4], ref, out):
        assert_close(f"pope-{amplitude}-{name}", r, o, 1e-5)


@needs_interpreter
def test_pope_interpreter_softplus_extremes():
    """Raw q/k spread over [-30, 30]: softplus' log1p branch (x < -7) and threshold (x > 20)."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 1, 1, 16, 16, 32, torch.float32, "cpu")
    q, k = q * 12, k * 12
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    out = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    assert (q < -9).any() and (q > 20).any()
    for name, r, o in zip(NAMES, ref, out):
        # logits reach ~|30 * 30| / sqrt(32): fp32 rounding is amplified accordingly
        assert_close(f"softplus-extremes-{name}", r, o, 5e-5)


@needs_interpreter
def test_pope_interpreter_decode_unsorted_and_empty_rows():
    """T=1 decode at pos S-1 (MATH §7.6); shuffled key positions (no block skipping); a query
    before every key sees nothing and outputs exactly 0 with zero gradients."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 2, 1, 1, 40, 32, torch.float32, "cpu")
    do = seeded_like(q)
    for name, r, o in zip(NAMES, reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True),
                          triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)):
        assert_close(f"decode-{name}", r, o, 1e-5)
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 2, 1, 24, 24, 32, torch.float32, "cpu")
    perm = torch.randperm(24, generator=generator(3))
    pos_k = pos_k[:, perm].contiguous()
    pos_q = pos_q.clone()
    pos_q[0, :3] = -1  # three queries placed before every key
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    out = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"unsorted-{name}", r, o, 1e-5)
    assert torch.equal(out[0][0, :, :3], torch.zeros_like(out[0][0, :, :3]))
    assert torch.equal(out[1][0, :, :3], torch.zeros_like(out[1][0, :, :3]))


@needs_interpreter
@pytest.mark.parametrize("impl", ["fused", "expand"])
def test_pope_interpreter_large_positions_range_reduction(impl):
    """Positions near 2**17 (MATH §7.4): fp32 angles reduced to [-pi, pi] before cos/sin. The
    first key sits at 0, the kernels' phase origin, so the angles really reach ~1.3e5 rad."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 1, 1, 17, 17, 32, torch.float32, "cpu",
                                                         offset=2**17 - 17)
    pos_k[:, 0] = 0
    pos_q = pos_k.clone()
    mod = ScoreMod(kind="pope", params={"inv_freq": inv_freq, "delta": delta})
    out = pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=delta, impl=impl)
    ref32 = reference.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=32**-0.5, score_mod=mod)
    ref64 = reference.attention(q.double(), k.double(), v.double(), pos_q_BT=pos_q, pos_k_BS=pos_k,
                                scale=32**-0.5, score_mod=mod, compute_dtype=torch.float64)
    # fp32 m*theta carries ~1e-2 rad of rounding at 1.3e5 (MATH §7.4): same order as the fp32 reference
    # (fp32 ulp is 2**-6 rad there): the kernel must be as close to float64 as the fp32 reference
    err_kernel = assert_close("large-pos-vs-fp64", ref64, out, 5e-2)
    assert err_kernel <= 2 * reference_err(ref64, ref32) + 1e-5


@needs_interpreter
def test_pope_interpreter_offset_and_strided_rows():
    """Row 0's positions advance by 1 from 700, row 1's by 3 from 11: both rows' outputs and every
    gradient are as close to float64 as the fp32 reference is (angles of ~1e3 rad carry fp32
    rounding either way)."""
    q, k, v, _, _, inv_freq, delta = make_inputs(2, 2, 1, 37, 37, 32, torch.float32, "cpu")
    pos = torch.stack([700 + torch.arange(37), 11 + 3 * torch.arange(37)])
    do = seeded_like(q)
    ref64 = reference_grads(q, k, v, pos, pos, inv_freq, delta, do, causal=True)
    ref32 = reference_grads(q, k, v, pos, pos, inv_freq, delta, do, causal=True, dtype=torch.float32)
    out = triton_grads(q, k, v, pos, pos, inv_freq, delta, do, causal=True)
    for name, r64, r32, o in zip(NAMES, ref64, ref32, out):
        err = assert_close(f"offset-{name}", r64, o, 1e-4)
        assert err <= 2 * reference_err(r64, r32) + 1e-6, (name, err, reference_err(r64, r32))


@needs_interpreter
@pytest.mark.parametrize("offset", [2**24 + 7, 2**31 - 100])
@pytest.mark.parametrize("case", [CPU_CASES[0], CPU_CASES[1]], ids=["causal", "Lq<Lk-gqa"])
def test_pope_interpreter_large_absolute_positions(offset, case):
    """Absolute positions where fp32 no longer holds every integer: the kernels form angles from
    positions relative to the row's first key (subtracted in int64), and the logit depends only
    on m - n, so they match float64 as tightly as at small positions (the fp32 reference, which
    converts absolute positions, is off by ~1 rad per channel there)."""
    B, H, G, T, S, D, causal = case
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(B, H, G, T, S, D, torch.float32, "cpu", offset=offset)
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    out = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"pope-offset{offset}-{name}", r, o, 1e-5)


def reference_err(ref64, other):
    return ((other.double() - ref64).norm() / ref64.norm()).item()


@needs_interpreter
def test_pope_interpreter_backward_is_deterministic_and_registry_resolves():
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 2, 1, 18, 18, 32, torch.float32, "cpu")
    do = seeded_like(q)
    first = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    second = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    mod = ScoreMod(kind="pope", params={"inv_freq": inv_freq, "delta": delta})
    call = registry.AttnCall.describe(q, k, v, causal=True, score_mod=mod, deterministic=True)
    backend = registry.resolve("triton", call)
    out = backend(q, k, v, pos_q=pos_q, pos_k=pos_k, scale=32**-0.5, causal=True, score_mod=mod)
    # the backend runs the default implementation (AttentionOptions().pope_impl)
    assert torch.equal(out, triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True, impl=None)[0])


def test_pope_backend_refusals_and_validation():
    backend = TritonBackend()
    base = {"dtype": torch.bfloat16, "device_type": "cuda", "head_dim": 64, "qk_width": 64, "causal": True,
                "q_shorter_than_k": False, "varlen": False, "score_mod": "pope", "needs_grad": True, "deterministic": True}
    assert backend.unsupported_reason(registry.AttnCall(**base)) is None
    assert "fused kernels for pope, tapa and distance-bias tables" in backend.unsupported_reason(registry.AttnCall(**{**base, "score_mod": None}))
    assert "cu_seqlens" in backend.unsupported_reason(registry.AttnCall(**{**base, "varlen": True}))
    assert "RAW D-wide" in backend.unsupported_reason(registry.AttnCall(**{**base, "qk_width": 128}))
    assert "head_dim 256" in backend.unsupported_reason(registry.AttnCall(**{**base, "head_dim": 256, "qk_width": 256}))
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 2, 1, 8, 8, 32, torch.float32, "cpu")
    with pytest.raises(TypeError, match="float16"):
        pope_attention(q.double(), k.double(), v.double(), pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq)
    with pytest.raises(TypeError, match="pos_q_BT must be int64"):
        pope_attention(q, k, v, pos_q_BT=pos_q.float(), pos_k_BS=pos_k, inv_freq_D=inv_freq)
    with pytest.raises(ValueError, match=r"inv_freq_D must be an fp32 tensor of shape \(32,\)"):
        pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq[:16])
    with pytest.raises(ValueError, match=r"delta_HD must be None or an fp32 tensor of shape \(2, 32\)"):
        pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=delta[:1])
    with pytest.raises(ValueError, match="amplitude='gelu'"):
        pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, amplitude="gelu")
    with pytest.raises(ValueError, match="H=2 must be divisible by kv heads G=3"):
        pope_attention(q, k.expand(1, 3, 8, 32), v.expand(1, 3, 8, 32), pos_q_BT=pos_q, pos_k_BS=pos_k,
                       inv_freq_D=inv_freq)
    with pytest.raises(ValueError, match="must be 4-D"):
        pope_attention(q[0], k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq)


# ----------------------------------------------------------------------------- GPU sweep


def torch_same_dtype(q, k, v, pos_q, pos_k, inv_freq, delta, do, *, causal):
    """PyTorch's own low-precision computation: pope_expand (fp32 trig, cast to q's dtype), then
    logits and P@V in q's dtype with an fp32 softmax (flash-attention's `upcast=False` reference)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    d = None if delta is None else delta.detach().clone().requires_grad_()
    qh, kh = pope_reference.pope_expand(leaves[0], leaves[1], pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq,
                                   delta_HD=d)
    kh = reference.repeat_kv(kh, q.shape[1])
    vv = reference.repeat_kv(leaves[2], q.shape[1])
    logits = (qh @ kh.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    vis = reference.visibility(pos_q, pos_k) if causal else None
    p = reference.masked_softmax(logits.float(), vis).to(q.dtype)
    out = p @ vv
    out.backward(do)
    return out, *[t.grad for t in leaves], (None if d is None else d.grad)


GPU_CASES = [  # (B, H, G, T, S, D, causal, dtype): every head dim, both dtypes, T<S, decode, GQA
    (2, 4, 4, 63, 63, 32, True, torch.bfloat16), (2, 4, 2, 217, 217, 48, True, torch.float16),
    (1, 4, 4, 500, 500, 64, False, torch.bfloat16), (2, 4, 1, 256, 256, 128, True, torch.bfloat16),
    (1, 4, 4, 100, 733, 64, True, torch.float16), (1, 2, 2, 1, 1024, 128, True, torch.bfloat16),
    (1, 8, 2, 1000, 1000, 64, True, torch.bfloat16), (1, 4, 4, 77, 300, 48, False, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,G,T,S,D,causal,dtype", GPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], dtype=c[7])
                              for c in GPU_CASES])
def test_pope_gpu_calibrated(B, H, G, T, S, D, causal, dtype):
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(B, H, G, T, S, D, dtype, "cuda", offset=3)
    do = torch.randn(B, H, T, D, generator=generator(7, "cuda"), device="cuda").to(dtype)
    check_calibrated("pope", q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)


def check_calibrated(label, q, k, v, pos_q, pos_k, inv_freq, delta, do, *, causal, **call):
    """Output and every gradient within twice PyTorch's own error in q's dtype (DESIGN §6);
    ``call``: more keywords of `pope_attention` (options)."""
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    low = torch_same_dtype(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    out = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal, **call)
    for name, r, lo, o in zip(NAMES, ref, low, out):
        calibrated_close(f"{label}-{name}", r, o, lo, factor=2.0, atol=1e-3 * max(r.abs().max().item(), 1.0))


@pytest.mark.gpu
def test_pope_gpu_autotuned_first_call():
    """Autotuning (`AttentionOptions(autotune=True)`) on a shape no other test tunes: the first backward times every config on
    the real buffers, and a config with 32- or 64-key blocks writes more d(delta) rows than a
    128-key one. Without zeroing between runs (reset_to_zero) a winning 128-key config would leave
    the smaller tiles' extra rows (32-124 at S=4000) in the sum. 128-key dK/dV tiles won at every
    length benchmarked on the H200 (4k-64k, benchmarks/results/attention-h200.md), so the length is 4000 (no other test
    uses it, so no earlier untuned call has cached a config for it); should a 32-key config win
    here, every row is rewritten and this test cannot see the bug."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 2, 2, 4000, 4000, 64, torch.bfloat16, "cuda", offset=3)
    check_calibrated("pope-autotuned", q, k, v, pos_q, pos_k, inv_freq, delta, seeded_like(q), causal=True,
                     options=AttentionOptions(autotune=True))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", triton_common._bwd_configs(),
                         ids=lambda c: f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}-w{c.num_warps}")
def test_pope_gpu_every_bwd_config(cfg):
    """Each backward tile config the autotuner may pick (the sweep above runs only the first) on a
    GQA case whose lengths no tile divides, under the same 2x rule."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 8, 2, 1000, 1000, 64, torch.bfloat16, "cuda", offset=3)
    with forced_config(cfg, triton_pope.pope_bwd_kernel_dkdv, triton_pope.pope_bwd_kernel_dq):
        check_calibrated(f"pope-{cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']}", q, k, v, pos_q, pos_k, inv_freq,
                         delta, seeded_like(q), causal=True)


@pytest.mark.gpu
def test_pope_gpu_large_positions():
    """Positions near 2**17 (MATH §7.4) through the GPU's range reduction + approximate cos/sin;
    the first key at 0 (the kernels' phase origin) keeps the angles at ~1.3e5 rad."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 4, 2, 300, 300, 64, torch.bfloat16, "cuda",
                                                         offset=2**17 - 300)
    pos_k[:, 0] = 0
    pos_q = pos_k.clone()
    check_calibrated("pope-bigpos", q, k, v, pos_q, pos_k, inv_freq, delta, seeded_like(q), causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [2**24 + 7, 2**31 - 100])
def test_pope_gpu_large_absolute_positions(offset):
    """Positions offset beyond 2**24 against float64, under the 2x rule with PyTorch's own
    low-precision error taken at the unshifted positions (the logit depends on m - n only; its
    fp32 angles from absolute positions would be off by ~1 rad there)."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 4, 2, 100, 733, 64, torch.bfloat16, "cuda",
                                                         offset=offset)
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    low = torch_same_dtype(q, k, v, pos_q - offset, pos_k - offset, inv_freq, delta, do, causal=True)
    out = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    for name, r, lo, o in zip(NAMES, ref, low, out):
        calibrated_close(f"pope-offset{offset}-{name}", r, o, lo, factor=2.0,
                         atol=1e-3 * max(r.abs().max().item(), 1.0))


@pytest.mark.gpu
def test_pope_gpu_deterministic_long():
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 4, 4, 4096, 4096, 64, torch.bfloat16, "cuda")
    do = seeded_like(q)
    first = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    second = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    mod = ScoreMod(kind="pope", params={"inv_freq": inv_freq, "delta": delta})
    ref = reference.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=0.125, score_mod=mod)
    assert_close("pope-4k-out", ref.float(), first[0].float(), 2e-2)


def tiny_model_losses(kind: str, backend: str, steps: int = 6) -> list[float]:
    """Losses of the tiny model (pe `kind`, attention `backend`) trained `steps` steps on one fixed
    CUDA batch with bf16 autocast from seed 0."""
    from phaselab.workloads.models.presets import preset
    from phaselab.workloads.models.transformer import Transformer

    torch.manual_seed(0)
    cfg = preset("tiny", pe={"kind": kind, "pope": {"delta_init": "uniform"}}, attention={"backend": backend})
    model = Transformer(cfg, device_type="cuda").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=generator(0, "cuda"), device="cuda")
    y = torch.roll(x, -1, dims=1)
    losses = []
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, targets_BT=y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        model.after_optimizer_step()
        losses.append(loss.item())
    return losses


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["pope", "tapa"])
def test_triton_backend_trains_like_reference(kind):
    """A tiny model trained 6 steps (bf16 autocast) on the triton backend reproduces the reference
    backend's losses. Both models start from the same seed and batch."""
    ref, tri = tiny_model_losses(kind, "reference"), tiny_model_losses(kind, "triton")
    assert tri[-1] < tri[0] - 0.05, tri  # it trains
    for step, (a, b) in enumerate(zip(ref, tri)):
        assert abs(a - b) <= 2e-2 * abs(a), (step, ref, tri)


@needs_interpreter
@pytest.mark.parametrize("kind", ["pope", "tapa"])
def test_triton_backend_model_steps_interpreter(kind):
    """The tiny model on the triton backend (interpreted, fp32) takes the same two AdamW steps as on
    the reference backend: the second loss depends on every kernel gradient (q, k, v, delta)."""
    from phaselab.workloads.models.presets import preset
    from phaselab.workloads.models.transformer import Transformer

    losses = {}
    for backend in ("reference", "triton"):
        torch.manual_seed(0)
        cfg = preset("tiny", pe={"kind": kind, "pope": {"delta_init": "uniform"}}, attention={"backend": backend})
        model = Transformer(cfg, device_type="cpu")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        x = torch.randint(0, cfg.vocab_size, (1, 16), generator=generator(0))
        losses[backend] = []
        for _ in range(2):
            _, loss = model(x, targets_BT=torch.roll(x, -1, dims=1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            model.after_optimizer_step()
            losses[backend].append(loss.item())
    assert losses["triton"][1] < losses["triton"][0]
    for a, b in zip(losses["reference"], losses["triton"]):
        assert abs(a - b) <= 1e-5 * abs(a), losses
