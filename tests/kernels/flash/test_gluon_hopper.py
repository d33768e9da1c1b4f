"""Gluon Hopper flash forward (kernels/flash/gluon_hopper.py) against the float64 reference.

CPU: the module imports without a GPU and `supported` gives the routing reasons.
GPU (`gpu`, sm_90 only): out and lse against float64 (relative RMS error, and no worse than the
Triton `tl` forward's own error), NaN-poisoned output buffers, both schedules (loads by the softmax warps or a producer
warp), lengths no block divides, T < S,
GQA, rows that see no key, both widths and dtypes, causal and not; the lse fed to the `tl`
backward gives the gradients of the `tl` path.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from phaselab.kernels.flash import gluon_hopper, triton_flash
from phaselab.kernels.flash import reference as flash_reference
from phaselab.kernels.testing import assert_close, generator, rel_rms, shape_id

# ----------------------------------------------------------------------------- CPU


def test_module_imports_without_gpu():
    module = importlib.reload(gluon_hopper)
    assert module.gluon_common.HEAD_DIMS == (64, 128)
    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    assert isinstance(module.supported(q, q, q), str)  # no CUDA tensor here: a reason, no exception



def _qkv(D=64, dtype=torch.bfloat16, H=4, G=2, T=8, S=8):
    return (torch.zeros(1, H, T, D, dtype=dtype), torch.zeros(1, G, S, D, dtype=dtype),
            torch.zeros(1, G, S, D, dtype=dtype))


def test_supported_reasons(gluon_importable):
    q, k, v = _qkv()
    assert gluon_hopper.supported(q, k, v) == "device cpu (needs CUDA, one device)"
    assert gluon_hopper.supported(q, k, v, torch.arange(8)[None], torch.arange(8)[None]) == \
        "explicit positions (the Gluon forward is index-causal)"
    assert gluon_hopper.supported(*_qkv(dtype=torch.float32)) == \
        "dtype torch.float32 (needs bf16 or fp16, one for q, k, v)"
    assert gluon_hopper.supported(q, k.half(), v).startswith("dtype torch.bfloat16")
    assert gluon_hopper.supported(*_qkv(D=96)) == "head dims q 96, k 96, v 96 (needs one of (64, 128))"
    assert gluon_hopper.supported(q, k, v[..., :32].contiguous()).startswith("head dims q 64, k 64, v 32")
    assert gluon_hopper.supported(*_qkv(H=3, G=2)).startswith("shapes q (1, 3, 8, 64)")
    assert gluon_hopper.supported(q[0], k, v) == "q, k, v must be 4-D tensors"


def test_supported_without_gluon_or_under_interpreter(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setattr(gluon_hopper.gluon_common, "IMPORT_ERROR", "ImportError: no module named gluon")
    assert gluon_hopper.supported(q, k, v) == "gluon unavailable (ImportError: no module named gluon)"
    monkeypatch.setattr(gluon_hopper.gluon_common, "IMPORT_ERROR", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gluon_hopper.supported(q, k, v).startswith("TRITON_INTERPRET is set")


def test_capability_is_asked_once_a_device(monkeypatch):
    """kernels.common.checks.capability, which the routing checks (Gluon, cuDNN, SDPA) call every
    call, asks torch once per device index."""
    from phaselab.kernels.common import checks
    asked = []
    monkeypatch.setattr(checks, "_CAPABILITY", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or (9, index))
    assert [checks.capability(i) for i in (0, 0, 1, 0, 1)] == [(9, 0), (9, 0), (9, 1), (9, 0), (9, 1)]
    assert asked == [0, 1]


@pytest.mark.skipif(gluon_hopper.gluon_common.IMPORT_ERROR is not None, reason="no Gluon in this Triton")
def test_launch_facts_tell_apart_what_triton_specialises():
    """gluon_common.launch reuses a compiled kernel only for arguments whose facts all match:
    integers by value (1 and 16-divisibility are specialised), tensors by dtype and 16-byte
    alignment, descriptors by shape, strides and block; floats never."""
    fact, descriptor = gluon_hopper.gluon_common._launch_fact, gluon_hopper.gluon_common.descriptor
    t = torch.zeros(8, 64, dtype=torch.bfloat16)
    assert fact(16) != fact(17) and fact(1) != fact(2) and fact(1) != fact(True) and fact(1.0) == fact(2.5)
    assert fact(t) == fact(torch.ones(4, dtype=torch.bfloat16)) and fact(t) != fact(t.half())
    assert fact(t) != fact(t[:, 1:])   # 2 bytes past an aligned base
    assert fact(descriptor(t, 16)) == fact(descriptor(torch.ones(8, 64, dtype=torch.bfloat16), 16))
    assert fact(descriptor(t, 16)) != fact(descriptor(t, 32))
    assert fact(descriptor(t, 16)) != fact(descriptor(torch.zeros(16, 64, dtype=torch.bfloat16), 16))
    hash(fact(descriptor(t, 16)))
    with pytest.raises(TypeError):
        fact(None)


@pytest.mark.skipif(gluon_hopper.gluon_common.IMPORT_ERROR is not None, reason="no Gluon in this Triton")
def test_descriptors_equal_tritons_checked_construction_and_fall_back_to_it():
    """gluon_common.descriptor sets a descriptor's fields without Triton's checks only where it has
    made them itself: the result equals the checked constructor's on the tensor's `Address` (a
    whole tensor, a head-dim half, the half at an offset), and a misaligned base goes through the
    constructor, which refuses it."""
    gc = gluon_hopper.gluon_common
    q = torch.zeros(2, 3, 40, 128, dtype=torch.bfloat16)
    for t, rows, width in ((q, 64, None), (q, 64, 64), (q[..., 64:], 32, None), (q[..., 32:], 16, 32)):
        width_ = t.shape[-1] if width is None else width
        checked = gc.TensorDescriptor(gc.Address(t.data_ptr(), t.dtype), [240, width_], [128, 1], [rows, width_],
                                      gc.block_layout(rows, width_, t.dtype))
        assert gc.descriptor(t, rows, width) == checked
    assert gc._DEFAULTS is None or gc._DEFAULTS["padding"] == "zero"
    with pytest.raises(AssertionError, match="16-byte aligned"):
        gc.descriptor(q.view(-1)[1:1 + 40 * 128].view(40, 128), 16)


@pytest.mark.skipif(gluon_hopper.gluon_common.IMPORT_ERROR is not None, reason="no Gluon in this Triton")
def test_descriptors_are_kept_by_address_without_their_tensors():
    """A descriptor is a function of its tensor's address, dtype, rows, width and block: one built
    again for the same is the kept object, another address or block gives another, and the kept
    one holds no reference to its tensor (the memory goes back to the allocator)."""
    import gc as collector
    import weakref

    gc = gluon_hopper.gluon_common
    t = torch.zeros(4, 64, 128, dtype=torch.bfloat16)
    desc = gc.descriptor(t, 64)
    assert gc.descriptor(t, 64) is desc and gc.descriptor(t, 32) is not desc
    assert gc.descriptor(t[1:], 64) is not desc and gc.descriptor(t[1:], 64).base.data_ptr() == t[1:].data_ptr()
    assert isinstance(desc.base, gc.Address) and desc.base == gc.Address(t.data_ptr(), torch.bfloat16)
    assert desc.base != gc.Address(t.data_ptr(), torch.float16)
    alive = weakref.ref(t)
    del t
    collector.collect()
    assert alive() is None


def test_launcher_refuses_what_is_not_supported(gluon_importable):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="gluon_flash_fwd: device cpu"):
        gluon_hopper.gluon_flash_fwd(q, k, v, scale=0.125, causal=True)


def test_flash_attention_routes_by_flash_impl(monkeypatch):
    """`flash_attention` takes the Gluon forward where it runs ("auto", "gluon"), the `tl` one
    elsewhere or when told ("tl"), says why "gluon" cannot run, and records which ran."""
    from phaselab.kernels.common.options import AttentionOptions, options_used, reset_options
    from phaselab.kernels.flash import function

    q, k, v = _qkv()
    assert function.forward_impl(q, k, v, None, None, AttentionOptions()) == "tl"   # CPU: no Gluon
    with pytest.raises(ValueError, match="flash_impl='gluon': (TRITON_INTERPRET|device cpu|gluon unavailable)"):
        function.forward_impl(q, k, v, None, None, AttentionOptions(flash_impl="gluon"))
    monkeypatch.setattr(function.gluon_common, "supported", lambda *a, **kw: None)   # as on an H200
    assert function.forward_impl(q, k, v, None, None, AttentionOptions()) == "gluon"
    assert function.forward_impl(q, k, v, None, None, AttentionOptions(flash_impl="tl")) == "tl"
    calls = []
    monkeypatch.setattr(function.GluonFlashFunction, "apply", lambda *a: calls.append(a) or a[0])
    reset_options()
    function.flash_attention(q, k, v, options=AttentionOptions(flash_impl="gluon"))
    assert len(calls) == 1 and options_used()["flash"]["forward"] == "gluon"
    with pytest.raises(ValueError, match="flash_impl='nope'"):
        AttentionOptions(flash_impl="nope")


# ----------------------------------------------------------------------------- GPU


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _on_hopper(), reason="the Gluon core needs an sm_90 GPU")


def make_inputs(B, H, G, T, S, D, dtype, seed=42):
    gen = generator(seed, "cuda")
    q, k, v, do = (torch.randn(*shape, generator=gen, device="cuda").to(dtype)
                   for shape in ((B, H, T, D), (B, G, S, D), (B, G, S, D), (B, H, T, D)))
    return q, k, v, do


def index_positions(T, S):
    """Explicit reference positions of index-causal masking for any T, S (queries are the last T
    of the S keys; with T > S the first T - S queries precede every key and see none)."""
    return (torch.arange(T, device="cuda") + S - T)[None], torch.arange(S, device="cuda")[None]


def gluon_forward(q, k, v, *, causal, tile=None, ws=False):
    """out, lse of the Gluon core into NaN-poisoned buffers (a row it skips stays NaN and fails)."""
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    return gluon_hopper.gluon_flash_fwd(q, k, v, scale=q.shape[-1] ** -0.5, causal=causal, out=out, lse=lse,
                                        tile=tile, warp_specialize=ws)


CASES = [  # (B, H, G, T, S, D, causal, dtype)
    (2, 4, 4, 1, 1, 64, True, torch.bfloat16),
    (1, 8, 2, 77, 77, 64, True, torch.bfloat16),
    (1, 8, 2, 1000, 1000, 128, True, torch.bfloat16),
    (1, 4, 4, 4099, 4099, 128, True, torch.float16),
    (2, 4, 2, 4099, 4099, 64, False, torch.bfloat16),
    (1, 4, 4, 100, 733, 128, True, torch.bfloat16),
    (1, 8, 2, 1, 1000, 64, True, torch.float16),
    (1, 4, 2, 77, 1000, 128, False, torch.float16),
    (1, 4, 4, 300, 77, 64, True, torch.bfloat16),  # T > S: the first 223 rows see no key
    (2, 16, 16, 1024, 1024, 128, True, torch.bfloat16),
]
RATIO = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def check_forward(q, k, v, *, causal, tile=None, ws=False, label="gluon"):
    T, S, D = q.shape[2], k.shape[2], q.shape[-1]
    rq, rk = index_positions(T, S)
    out, lse = gluon_forward(q, k, v, causal=causal, tile=tile, ws=ws)
    ref = flash_reference.flash_attention(q.double(), k.double(), v.double(), pos_q_BT=rq, pos_k_BS=rk,
                                          causal=causal, compute_dtype=torch.float64)
    err = assert_close(f"{label}-out", ref, out, RATIO[q.dtype])
    want = flash_reference.row_lse2(q.double(), k.double(), pos_q_BT=rq, pos_k_BS=rk, scale=D**-0.5,
                                    causal=causal)
    empty = torch.isposinf(want)
    assert torch.equal(torch.isposinf(lse), empty) and not lse.isnan().any()
    assert (out[empty] == 0).all()
    assert_close(f"{label}-lse", want[~empty], lse[~empty], 1e-5)
    if T <= S:  # the tl forward's own error at the same dtype (its index positions need T <= S)
        tl_out, _ = triton_flash.flash_fwd(q, k, v, None, None, None, scale=D**-0.5, causal=causal)
        tl_err = rel_rms(ref, tl_out)
        assert err <= 1.25 * tl_err + 1e-4, f"{label}: error {err:.3e} vs the tl forward's {tl_err:.3e}"
    return out, lse


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,dtype", CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], dtype=c[7])
                              for c in CASES])
@pytest.mark.parametrize("ws", [False, True], ids=["pipelined", "warp-specialized"])
def test_gluon_forward_matches_float64(B, H, G, T, S, D, causal, dtype, ws):
    q, k, v, _ = make_inputs(B, H, G, T, S, D, dtype)
    check_forward(q, k, v, causal=causal, ws=ws, label="gluon-ws" if ws else "gluon")


TILES = [(128, 64, 2, 8), (128, 128, 2, 8), (128, 64, 3, 8), (64, 64, 2, 4), (64, 128, 2, 4), (64, 128, 1, 4)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("tile", TILES, ids=["x".join(map(str, t)) for t in TILES])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("ws", [False, True], ids=["pipelined", "warp-specialized"])
def test_gluon_forward_every_tile(tile, D, ws):
    q, k, v, _ = make_inputs(1, 8, 2, 1000, 1003, D, torch.bfloat16)
    check_forward(q, k, v, causal=True, tile=tile, ws=ws, label=f"gluon-{'x'.join(map(str, tile))}-ws{int(ws)}")


BWD_CASES = [(1, 8, 2, 1000, 1000, 64, True, torch.bfloat16), (1, 4, 4, 77, 300, 128, True, torch.float16),
             (1, 4, 2, 513, 513, 128, False, torch.bfloat16)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,dtype", BWD_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], dtype=c[7])
                              for c in BWD_CASES])
def test_gluon_lse_feeds_tl_backward(B, H, G, T, S, D, causal, dtype):
    """flash_bwd on the Gluon forward's (out, lse) gives the tl path's gradients: within bf16/fp16
    rounding of them, and no further from float64 than they are."""
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    rq, rk = index_positions(T, S)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    flash_reference.flash_attention(*leaves, pos_q_BT=rq, pos_k_BS=rk, causal=causal,
                                    compute_dtype=torch.float64).backward(do.double())
    cfg = {"scale": D**-0.5, "causal": causal}
    g_out, g_lse = gluon_forward(q, k, v, causal=causal)
    t_out, t_lse = triton_flash.flash_fwd(q, k, v, None, None, None, **cfg)
    grads_gluon = triton_flash.flash_bwd(do, q, k, v, g_out, g_lse, None, None, None, **cfg)
    grads_tl = triton_flash.flash_bwd(do, q, k, v, t_out, t_lse, None, None, None, **cfg)
    for name, ref, g, t in zip(("dq", "dk", "dv"), (x.grad for x in leaves), grads_gluon, grads_tl):
        assert_close(f"gluon-vs-tl-{name}", t.float(), g.float(), RATIO[dtype])
        err, tl_err = rel_rms(ref, g), rel_rms(ref, t)
        assert err <= 1.25 * tl_err + 1e-4, f"{name}: error {err:.3e} vs the tl path's {tl_err:.3e}"
    out = gluon_hopper.gluon_flash_attention(*[t.clone().requires_grad_() for t in (q, k, v)], causal=causal)
    assert torch.equal(out, g_out)


@pytest.mark.gpu
@hopper
def test_gluon_autograd_matches_tl_path():
    """The autograd wrapper's gradients are flash_bwd's on the Gluon (out, lse)."""
    q, k, v, do = make_inputs(1, 4, 2, 700, 700, 128, torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    gluon_hopper.gluon_flash_attention(*leaves, causal=True).backward(do)
    out, lse = gluon_forward(q, k, v, causal=True)
    want = triton_flash.flash_bwd(do, q, k, v, out, lse, None, None, None, scale=128**-0.5, causal=True)
    for name, leaf, w in zip(("dq", "dk", "dv"), leaves, want):
        assert torch.equal(leaf.grad, w), name
