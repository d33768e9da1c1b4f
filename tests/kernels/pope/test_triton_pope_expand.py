"""PoPE through the Cartesian expansion on the flash core (kernels/pope/triton_expand.py):
the prologue against `pope_reference.pope_expand`, the whole path (`pope_attention(impl="expand")`) and
its gradients for q, k, v and delta against the float64 reference.

CPU: TRITON_INTERPRET=1 on tiny awkward shapes (tests/kernels/conftest.py sets it without CUDA).
GPU (`gpu`): bf16/fp16 sweep with the 2x calibrated rule (DESIGN §6).
"""

from __future__ import annotations

import os
import sys
import weakref

import pytest
import torch
from test_triton_pope import reference_grads, triton_grads  # one float64 spec for both implementations

from phaselab.kernels.attention import reference
from phaselab.kernels.common.options import AttentionOptions, options_used, reset_options
from phaselab.kernels.pope import reference as pope_reference
from phaselab.kernels.pope import triton_expand
from phaselab.kernels.pope.function import pope_attention
from phaselab.kernels.testing import assert_close, calibrated_close, generator, pope_inputs, shape_id

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                       reason="CPU interpreter test; the gpu tests cover CUDA")
NAMES = ("out", "dq", "dk", "dv", "ddelta")


make_inputs = pope_inputs


def expand_grads(*args, **kw):
    return triton_grads(*args, **kw, impl="expand")


def seeded_like(x, seed=7):
    return torch.randn(x.shape, generator=generator(seed, x.device.type), device=x.device).to(x.dtype)


@needs_interpreter
@pytest.mark.parametrize("amplitude", ["softplus", "relu", "identity"])
@pytest.mark.parametrize("offset", [5, 2**24 + 7])
@pytest.mark.parametrize("one_launch", [False, True], ids=["q-k-apart", "q-k-one-launch"])
def test_prologue_matches_reference_pope_expand(amplitude, offset, one_launch):
    """q_hat / k_hat (D=48, padded to 64 in registers; 21 rows, no block multiple) equal
    pope_reference.pope_expand at positions relative to the row's first key, in float64; q and k of
    one shape share a launch (grid axis 2), GQA / T != S take one each."""
    H, G, S = (3, 3, 21) if one_launch else (4, 2, 30)
    q, k, _, pos_q, pos_k, inv_freq, delta = make_inputs(2, H, G, 21, S, 48, torch.float32, "cpu",
                                                         offset=offset, broadcast=False)
    assert triton_expand._one_launch(q, k) == one_launch
    q, k = 4 * q, 4 * k  # softplus' tails too
    qh, kh = triton_expand.pope_expand_fwd(q, k, pos_q, pos_k, inv_freq, delta, amplitude)
    rel_q, rel_k = pos_q - pos_k[:, :1], pos_k - pos_k[:, :1]
    rq, rk = pope_reference.pope_expand(q.double(), k.double(), pos_q_BT=rel_q, pos_k_BS=rel_k, inv_freq_D=inv_freq,
                                   delta_HD=delta, amplitude=amplitude, layout="interleaved")
    assert_close(f"q_hat-{amplitude}", rq, qh, 1e-6)
    assert_close(f"k_hat-{amplitude}", rk, kh, 1e-6)


@needs_interpreter
@pytest.mark.parametrize("G", [1, 2], ids=["q-k-apart", "q-k-one-launch"])
def test_expansion_backward_matches_autograd_of_reference(G):
    """The chain kernel's dq, dk, d delta against autograd through pope_reference.pope_expand (float64),
    with q and k in one launch (G = H) and in two (GQA)."""
    q, k, _, pos_q, pos_k, inv_freq, delta = make_inputs(2, 2, G, 19, 19, 32, torch.float32, "cpu", offset=3,
                                                         broadcast=False)
    assert triton_expand._one_launch(q, k) == (G == 2)
    gq = seeded_like(torch.empty(2, 2, 19, 64), 1)
    gk = seeded_like(torch.empty(2, G, 19, 64), 2)
    leaves = [t.clone().requires_grad_() for t in (q, k, delta)]
    qh, kh = triton_expand.pope_expand(leaves[0], leaves[1], pos_q, pos_k, inv_freq, leaves[2])
    torch.autograd.backward([qh, kh], [gq, gk])
    l64 = [t.double().requires_grad_() for t in (q, k, delta)]
    rq, rk = pope_reference.pope_expand(l64[0], l64[1], pos_q_BT=pos_q - pos_k[:, :1], pos_k_BS=pos_k - pos_k[:, :1],
                                   inv_freq_D=inv_freq, delta_HD=l64[2], layout="interleaved")
    torch.autograd.backward([rq, rk], [gq.double(), gk.double()])
    for name, r, o in zip(("dq", "dk", "ddelta"), l64, leaves):
        assert_close(f"chain-{name}", r.grad, o.grad, 1e-6)


# (B, H, G, T, S, D, causal, offset): N=37; T<S decode-like GQA at 2**24+7; D=48 non-causal GQA
CPU_CASES = [(1, 2, 1, 37, 37, 32, True, 5), (1, 2, 2, 7, 45, 32, True, 2**24 + 7),
             (2, 4, 2, 20, 20, 48, False, 0), (2, 2, 1, 19, 19, 16, True, 2**31 - 100)]


@needs_interpreter
@pytest.mark.parametrize("B,H,G,T,S,D,causal,offset", CPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], off=c[7])
                              for c in CPU_CASES])
def test_expand_path_matches_float64_reference(B, H, G, T, S, D, causal, offset):
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(B, H, G, T, S, D, torch.float32, "cpu", offset=offset)
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    out = expand_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"expand-{name}", r, o, 1e-5)


@needs_interpreter
def test_expand_path_ablations_empty_rows_and_determinism():
    """relu amplitude without delta; unsorted keys and queries before every key (0 out, 0 grad);
    `AttentionOptions.pope_impl` selects the path (an explicit `impl=` wins); two backward runs
    agree bitwise."""
    q, k, v, pos_q, pos_k, inv_freq, _ = make_inputs(1, 2, 1, 21, 21, 32, torch.float32, "cpu", delta=False)
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, None, do, causal=True, amplitude="relu")
    out = expand_grads(q, k, v, pos_q, pos_k, inv_freq, None, do, causal=True, amplitude="relu")
    for name, r, o in zip(NAMES[:4], ref, out):
        assert_close(f"expand-relu-{name}", r, o, 1e-5)
    assert out[4] is None
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 2, 1, 24, 24, 16, torch.float32, "cpu")
    pos_k = pos_k[:, torch.randperm(24, generator=generator(3))].contiguous()
    pos_q = pos_q.clone()
    pos_q[0, :3] = -1
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    first = expand_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    for name, r, o in zip(NAMES, ref, first):
        assert_close(f"expand-unsorted-{name}", r, o, 1e-5)
    assert torch.equal(first[0][0, :, :3], torch.zeros_like(first[0][0, :, :3]))
    assert torch.equal(first[1][0, :, :3], torch.zeros_like(first[1][0, :, :3]))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, delta)]
    out = pope_attention(*leaves[:3], pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=leaves[3],
                         options=AttentionOptions(pope_impl="expand"))
    out.backward(do)
    for a, b in zip(first, (out, *[t.grad for t in leaves])):
        assert torch.equal(a, b)
    reset_options()
    fused = pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=delta,
                           impl="fused", options=AttentionOptions(pope_impl="expand", exp2="poly"))
    assert options_used() == {"pope": {"pope_impl": "fused", "exp2": "poly", "autotune": False}}
    mufu = pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=delta,
                          impl="fused")
    # the exp2 option reaches the kernel: the polynomial rounds otherwise than exp2, within fp32
    assert not torch.equal(fused, mufu)
    assert_close("fused-poly", mufu.double(), fused, 1e-5)
    with pytest.raises(ValueError, match="pope impl='bogus'"):
        pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, impl="bogus")
    with pytest.raises(ValueError, match="pope_impl='bogus'"):
        AttentionOptions(pope_impl="bogus")


@needs_interpreter
def test_expand_memory_no_saved_expansion_and_no_2d_wide_gradient(monkeypatch):
    """Memory of the expand path (module docstring of triton_expand.py): the forward saves no
    2D-wide tensor (q_hat, k_hat are transient), and the tensors the backward
    allocates itself (torch.empty / zeros called from phaselab.kernels) never hold more at once
    than dq, dk, dv, one 2D-wide operand and the fp32 rows (Delta, d delta partials). Saving
    q_hat / k_hat, or a 2D-wide dq_hat / dk_hat beside them, fails it."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 4, 2, 40, 40, 32, torch.float32, "cpu")
    leaves = [t.clone().requires_grad_() for t in (q, k, v, delta)]
    out = pope_attention(*leaves[:3], pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=leaves[3],
                         impl="expand")
    saved = [t for t in out.grad_fn.saved_tensors if t is not None and t.is_floating_point()]
    assert max(t.numel() for t in saved) <= max(q.numel(), k.numel(), v.numel())
    live, peak = [], [0]

    def tracking(fn):
        def wrapper(*args, **kwargs):
            t = fn(*args, **kwargs)
            if sys._getframe(1).f_globals.get("__name__", "").startswith("phaselab.kernels"):
                live.append(weakref.ref(t))
                peak[0] = max(peak[0], sum(r().nbytes for r in live if r() is not None))
            return t
        return wrapper

    for name in ("empty", "zeros"):
        monkeypatch.setattr(torch, name, tracking(getattr(torch, name)))
    out.backward(seeded_like(q))
    rows = 4 * (4 * 40 + 4 * 3 * 32)  # fp32 Delta [B, H, T] and d delta partials [B, H, ceil(T / 16), 32]
    assert 0 < peak[0] <= 4 * (q.numel() + k.numel() + v.numel() + 2 * max(q.numel(), k.numel())) + rows


# ----------------------------------------------------------------------------- GPU sweep


def torch_same_dtype(q, k, v, pos_q, pos_k, inv_freq, delta, do, *, causal):
    """PyTorch in q's dtype: pope_expand (fp32 trig, cast to q's dtype; positions relative to the
    first key, as the kernels take them), logits and P@V in q's dtype with an fp32 softmax."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    d = None if delta is None else delta.detach().clone().requires_grad_()
    qh, kh = pope_reference.pope_expand(leaves[0], leaves[1], pos_q_BT=pos_q - pos_k[:, :1], pos_k_BS=pos_k - pos_k[:, :1],
                                   inv_freq_D=inv_freq, delta_HD=d)
    kh = reference.repeat_kv(kh, q.shape[1])
    logits = (qh @ kh.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    vis = reference.visibility(pos_q, pos_k) if causal else None
    out = reference.masked_softmax(logits.float(), vis).to(q.dtype) @ reference.repeat_kv(leaves[2], q.shape[1])
    out.backward(do)
    return out, *[t.grad for t in leaves], (None if d is None else d.grad)


GPU_CASES = [  # (B, H, G, T, S, D, causal, offset, dtype); D=48: q_hat 96 wide, padded to 128 in the core
    (2, 4, 2, 217, 217, 48, True, 3, torch.float16), (1, 8, 2, 1000, 1000, 64, True, 2**24 + 7, torch.bfloat16),
    (2, 4, 1, 256, 256, 128, True, 3, torch.bfloat16), (1, 4, 4, 100, 733, 64, False, 3, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,G,T,S,D,causal,offset,dtype", GPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], off=c[7],
                                       dtype=c[8]) for c in GPU_CASES])
def test_expand_gpu_calibrated(B, H, G, T, S, D, causal, offset, dtype):
    inputs = make_inputs(B, H, G, T, S, D, dtype, "cuda", offset=offset)
    assert_calibrated("expand", expand_grads, inputs, causal=causal)


def assert_calibrated(label, grads_fn, inputs, *, causal):
    """out, dq, dk, dv, d delta of ``grads_fn`` against the float64 reference by the 2x rule
    (DESIGN §6), each also finite; shared by the PoPE implementations' GPU sweeps."""
    q, k, v, pos_q, pos_k, inv_freq, delta = inputs
    do = seeded_like(q)
    ref = reference_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    low = torch_same_dtype(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    out = grads_fn(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal)
    for name, r, lo, o in zip(NAMES, ref, low, out):
        assert torch.isfinite(o).all(), f"{label}-{name}"
        calibrated_close(f"{label}-{name}", r, o, lo, factor=2.0, atol=1e-3 * max(r.abs().max().item(), 1.0))


@pytest.mark.gpu
def test_expand_gpu_deterministic_and_close_to_fused():
    """4k tokens, bf16: bitwise reproducible, and the two implementations agree to bf16 level."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 4, 4, 4096, 4096, 64, torch.bfloat16, "cuda")
    do = seeded_like(q)
    first = expand_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    second = expand_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    fused = triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True, impl="fused")
    for name, a, b in zip(NAMES, first, fused):
        assert_close(f"expand-vs-fused-{name}", b.float(), a.float(), 3e-2)
