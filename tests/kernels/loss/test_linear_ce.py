"""Fused linear + cross-entropy (kernels/loss) against the float64 reference.

CPU: the reference against an independent float64 formula; the Triton row kernel under
TRITON_INTERPRET=1 (tests/kernels/conftest.py sets it without CUDA and NaN-poisons the kernels'
torch.empty buffers) on awkward tiny shapes; validation. GPU (`gpu`): GPT-2 sized bf16 rows with
the 2x rule against the fp32 torch path (DESIGN §6).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from phaselab.kernels.loss import reference
from phaselab.kernels.loss.function import linear_cross_entropy
from phaselab.kernels.testing import assert_close, calibrated_close, generator, shape_id

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                       reason="CPU interpreter test; the gpu test covers CUDA")
NAMES = ("loss", "grad_h", "grad_W")


def make_inputs(N, C, V, V_pad, *, mask, device="cpu", seed=42):
    """h [N, C], W [V_pad, C] (fp32), targets with every 5th ignored, and a mask: None, "rand"
    (uniform weights, every 7th row 0) or "zeros"."""
    gen = generator(seed, device)
    h = torch.randn(N, C, generator=gen, device=device)
    w = torch.randn(V_pad, C, generator=gen, device=device) / math.sqrt(C) * 3.0
    targets = torch.randint(0, V, (N,), generator=gen, device=device)
    targets[::5] = -1
    if mask is None:
        return h, w, targets, None
    m = torch.rand(N, generator=gen, device=device)
    m[::7] = 0.0
    return h, w, targets, m * 0 if mask == "zeros" else m


def run(fn, h, w, targets, mask, *, g=0.7, dtype=None, **kw):
    """(loss, grad_h, grad_W) of fn on leaves cast to dtype (default: h's), upstream gradient g."""
    dtype = dtype or h.dtype
    hh, ww = (t.detach().to(dtype).requires_grad_() for t in (h, w))
    loss = fn(hh, ww, targets, mask, **kw)
    (loss * g).backward()
    return loss, hh.grad, ww.grad


# ----------------------------------------------------------------------------- reference


def explicit_loss(h, w, targets, mask, vocab_size):
    """Independent float64 form: a Python loop over scored rows of logsumexp - target logit."""
    logits = (h.double() @ w.double().t())[:, :vocab_size]
    num, den = 0.0, 0.0
    for i, t in enumerate(targets.tolist()):
        wi = 0.0 if t < 0 else (1.0 if mask is None else float(mask[i]))
        if wi:
            num += wi * float(torch.logsumexp(logits[i], 0) - logits[i, t])
        den += wi
    return num / den


@pytest.mark.parametrize("mask", [None, "rand"], ids=["nomask", "mask"])
def test_reference_matches_explicit_float64_loss(mask):
    h, w, targets, m = make_inputs(37, 24, 101, 128, mask=mask)
    got = reference.linear_cross_entropy(h.double(), w.double(), targets, None if m is None else m.double(),
                                         vocab_size=101)
    assert got.dtype == torch.float64
    assert math.isclose(float(got), explicit_loss(h, w, targets, m, 101), rel_tol=1e-12)


def test_reference_ignores_padding_columns():
    """Rows of W at or beyond vocab_size change nothing and get exactly zero gradient."""
    h, w, targets, m = make_inputs(37, 24, 101, 128, mask="rand")
    w2 = w.clone()
    w2[101:] = 1e4  # would dominate the softmax if it took part
    l1, _, gw1 = run(reference.linear_cross_entropy, h, w, targets, m, dtype=torch.float64, vocab_size=101)
    l2, _, gw2 = run(reference.linear_cross_entropy, h, w2, targets, m, dtype=torch.float64, vocab_size=101)
    assert float(l1.detach()) == float(l2.detach())
    assert torch.equal(gw2[101:], torch.zeros_like(gw2[101:])) and gw1[:101].abs().sum() > 0


def test_reference_all_zero_weight_is_nan():
    h, w, targets, m = make_inputs(37, 24, 101, 128, mask="zeros")
    assert math.isnan(float(reference.linear_cross_entropy(h, w, targets, m, vocab_size=101)))


# ----------------------------------------------------------------------------- Triton (interpreter)

CPU_CASES = [(37, 24, 101, 128, None, "rand"), (37, 24, 101, 128, 16, "rand"), (37, 24, 101, 128, 16, None),
             (20, 16, 64, 64, 7, "rand")]  # V = V_pad: no padding columns, chunk not dividing N


@needs_interpreter
@pytest.mark.parametrize("N,C,V,V_pad,chunk,mask", CPU_CASES,
                         ids=[shape_id(N=c[0], C=c[1], V=c[2], Vp=c[3], chunk=c[4] or 0, mask=c[5] or "nomask")
                              for c in CPU_CASES])
def test_triton_matches_float64_reference(N, C, V, V_pad, chunk, mask):
    h, w, targets, m = make_inputs(N, C, V, V_pad, mask=mask)
    ref = run(reference.linear_cross_entropy, h, w, targets, m, dtype=torch.float64, vocab_size=V)
    out = run(linear_cross_entropy, h, w, targets, m, vocab_size=V, chunk_rows=chunk)
    assert out[0].dtype == torch.float32 and out[2].dtype == torch.float32
    for name, r, o in zip(NAMES, ref, out):
        assert_close(f"linear-ce-{name}", r, o, 2e-6)
    assert torch.equal(out[2][V:], torch.zeros_like(out[2][V:]))  # padding rows of W: exactly 0


@needs_interpreter
def test_triton_without_grad_gives_the_same_loss():
    h, w, targets, m = make_inputs(37, 24, 101, 128, mask="rand")
    with_grad = run(linear_cross_entropy, h, w, targets, m, vocab_size=101)[0]
    without = linear_cross_entropy(h, w, targets, m, vocab_size=101)
    assert not without.requires_grad and float(without) == float(with_grad.detach())


@needs_interpreter
@pytest.mark.parametrize("chunk", [None, 16], ids=["chunk0", "chunk16"])
def test_triton_all_zero_weight_is_nan(chunk):
    h, w, targets, m = make_inputs(37, 24, 101, 128, mask="zeros")
    assert math.isnan(float(linear_cross_entropy(h, w, targets, m, vocab_size=101, chunk_rows=chunk)))


@needs_interpreter
def test_triton_rows_never_read_padding_and_write_every_output():
    """The kernel alone on a buffer whose padding columns and loss output are NaN: per-row losses
    and the in-place gradient match float64 autograd; padding comes back 0; unscored rows are 0."""
    from phaselab.kernels.loss import triton_ce

    N, V, V_pad = 37, 101, 128
    gen = generator(3)
    logits = torch.randn(N, V_pad, generator=gen) * 4
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[::5] = -1
    weight_N = reference.row_weights(targets, torch.rand(N, generator=gen))
    weight_N[1] = 0.0
    x = logits.clone()
    x[:, V:] = float("nan")
    loss_N = torch.full((N,), float("nan"))
    triton_ce.ce_rows_(x, targets, weight_N, weight_N.sum(), loss_N, V)

    l64 = logits[:, :V].double().requires_grad_()
    nll = torch.nn.functional.cross_entropy(l64, targets, ignore_index=-1, reduction="none") * weight_N.double()
    (nll.sum() / weight_N.double().sum()).backward()
    assert_close("rows-loss", nll.detach(), loss_N, 1e-6)
    assert_close("rows-grad", l64.grad, x[:, :V], 1e-6)
    assert torch.equal(x[:, V:], torch.zeros(N, V_pad - V))
    unscored = weight_N == 0
    assert unscored.sum() >= 2 and torch.equal(loss_N[unscored], torch.zeros(int(unscored.sum())))
    assert torch.equal(x[unscored], torch.zeros_like(x[unscored]))


# ----------------------------------------------------------------------------- validation


def _bad_calls():
    h, w, t, m = make_inputs(8, 16, 30, 32, mask="rand")
    return {
        "h-1d": ((h[0], w, t, m), {"vocab_size": 30}, "h_NC"),
        "C-mismatch": ((h, w[:, :8], t, m), {"vocab_size": 30}, "weight_VC"),
        "vocab-too-big": ((h, w, t, m), {"vocab_size": 33}, "vocab_size"),
        "vocab-zero": ((h, w, t, m), {"vocab_size": 0}, "vocab_size"),
        "targets-float": ((h, w, t.float(), m), {"vocab_size": 30}, "targets_N"),
        "targets-len": ((h, w, t[:5], m), {"vocab_size": 30}, "targets_N"),
        "mask-len": ((h, w, t, m[:5]), {"vocab_size": 30}, "mask_N"),
        "dtype-mismatch": ((h, w.double(), t, m), {"vocab_size": 30}, "weight_VC"),
        "fp64": ((h.double(), w.double(), t, m), {"vocab_size": 30}, "float64"),
        "empty": ((h[:0], w, t[:0], m[:0]), {"vocab_size": 30}, "no rows"),
        "chunk-zero": ((h, w, t, m), {"vocab_size": 30, "chunk_rows": 0}, "chunk_rows"),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_bad_inputs_raise_value_error_naming_them(case):
    args, kwargs, match = _bad_calls()[case]
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(*args, **kwargs)


def test_non_tensor_raises_type_error():
    h, w, t, _ = make_inputs(8, 16, 30, 32, mask=None)
    with pytest.raises(TypeError, match="h_NC"):
        linear_cross_entropy(h.tolist(), w, t, vocab_size=30)


def test_cpu_without_interpreter_refuses(monkeypatch):
    """Nothing falls back silently: CPU tensors without TRITON_INTERPRET=1 are refused."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    h, w, t, _ = make_inputs(8, 16, 30, 32, mask=None)
    with pytest.raises(ValueError, match="needs CUDA"):
        linear_cross_entropy(h, w, t, vocab_size=30)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [None, 1024], ids=["chunk0", "chunk1024"])
def test_gpu_bf16_gpt2_head_2x_rule(chunk):
    """GPT-2 head: bf16 fused vs the fp32 torch path, within 2x PyTorch's own bf16 error (the
    unfused path of today: bf16 logits, fp32 softmax); loss by max-abs, gradients by RMS."""
    N, C, V, V_pad = 4096, 768, 50257, 50304
    h, w, targets, m = make_inputs(N, C, V, V_pad, mask="rand", device="cuda")
    h16, w16 = h.bfloat16(), w.bfloat16()
    ref = run(reference.linear_cross_entropy, h16.float(), w16.float(), targets, m, vocab_size=V)
    torch_bf16 = run(reference.linear_cross_entropy, h16, w16, targets, m, vocab_size=V)
    out = run(linear_cross_entropy, h16, w16, targets, m, vocab_size=V, chunk_rows=chunk)
    for name, r, t, o in zip(NAMES, ref, torch_bf16, out):
        calibrated_close(f"linear-ce-gpu-{name}", r, o, t, metric="max" if name == "loss" else "rms")
    assert torch.equal(out[2][V:], torch.zeros_like(out[2][V:]))
