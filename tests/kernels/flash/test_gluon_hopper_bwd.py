"""Gluon Hopper flash backward (kernels/flash/gluon_hopper_bwd.py) against float64 autograd.

CPU: the module imports without a GPU and without Gluon, and `supported` gives the routing reasons.
GPU (`gpu`, sm_90 only): dq, dk, dv against the float64 reference's autograd gradients (relative
RMS error, and no worse than the Triton `tl` backward's own error), equal to the `tl` backward's
within bf16/fp16 rounding, from the lse of the `tl` forward; NaN-poisoned gradient buffers, lengths
no block divides, T < S, T > S (rows that see no key), GQA, both widths and dtypes, causal and not,
every shipped tile, bitwise repeatable; the atomic-dQ and warp-specialized variants likewise.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from phaselab.kernels.flash import gluon_hopper_bwd as bwd
from phaselab.kernels.flash import reference as flash_reference
from phaselab.kernels.flash import triton_flash
from phaselab.kernels.testing import assert_close, generator, rel_rms, shape_id

# ----------------------------------------------------------------------------- CPU


def test_module_imports_without_gpu():
    module = importlib.reload(bwd)
    assert module.gluon_common.HEAD_DIMS == (64, 128)
    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    assert isinstance(module.supported(q, q, q), str)  # no CUDA tensor here: a reason, no exception


def test_module_imports_without_gluon(monkeypatch):
    """A Triton without Gluon: the module still imports and every input gets the import reason."""
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)
    try:
        importlib.reload(bwd.gluon_common)
        module = importlib.reload(bwd)
        assert module.gluon_common.IMPORT_ERROR.startswith(("ImportError", "ModuleNotFoundError"))
        q, k, v = _qkv()
        assert module.supported(q, k, v).startswith("gluon unavailable (")
        with pytest.raises(ValueError, match="gluon_flash_bwd: gluon unavailable"):
            module.gluon_flash_bwd(q, q, k, v, q, q[..., 0].float(), scale=0.125, causal=True)
    finally:
        monkeypatch.undo()
        importlib.reload(bwd.gluon_common)
        importlib.reload(bwd)



def _qkv(D=64, dtype=torch.bfloat16, H=4, G=2, T=8, S=8):
    return (torch.zeros(1, H, T, D, dtype=dtype), torch.zeros(1, G, S, D, dtype=dtype),
            torch.zeros(1, G, S, D, dtype=dtype))


def test_supported_reasons(gluon_importable):
    q, k, v = _qkv()
    assert bwd.supported(q, k, v) == "device cpu (needs CUDA, one device)"
    assert bwd.supported(q, k, v, torch.arange(8)[None], torch.arange(8)[None]) == \
        "explicit positions (the Gluon backward is index-causal)"
    assert bwd.supported(*_qkv(dtype=torch.float32)) == "dtype torch.float32 (needs bf16 or fp16, one for q, k, v)"
    assert bwd.supported(q, k.half(), v).startswith("dtype torch.bfloat16")
    assert bwd.supported(*_qkv(D=96)) == "head dims q 96, k 96, v 96 (needs one of (64, 128))"
    assert bwd.supported(q, k, v[..., :32].contiguous()).startswith("head dims q 64, k 64, v 32")
    assert bwd.supported(*_qkv(H=3, G=2)).startswith("shapes q (1, 3, 8, 64)")
    assert bwd.supported(q[0], k, v) == "q, k, v must be 4-D tensors"


def test_input_reasons_come_before_the_machine(monkeypatch):
    """What the inputs say reads the same with or without Gluon (routing logs compare across machines)."""
    monkeypatch.setattr(bwd.gluon_common, "IMPORT_ERROR", "ImportError: no module named gluon")
    assert bwd.supported(*_qkv(D=96)).startswith("head dims q 96")
    assert bwd.supported(*_qkv(), torch.arange(8)[None], torch.arange(8)[None]).startswith("explicit positions")
    assert bwd.supported(*_qkv()) == "gluon unavailable (ImportError: no module named gluon)"
    monkeypatch.setattr(bwd.gluon_common, "IMPORT_ERROR", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert bwd.supported(*_qkv()).startswith("TRITON_INTERPRET is set")


def test_launcher_refuses_what_is_not_supported(gluon_importable):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="gluon_flash_bwd: device cpu"):
        bwd.gluon_flash_bwd(q, q, k, v, q, q[..., 0].float(), scale=0.125, causal=True)


def test_tiles_are_checked_along_each_kernels_accumulator_rows():
    """The warps stack along the dK/dV kernel's key block and the dQ kernel's query block, 16 rows
    each: every shipped default and test tile passes, a block too short for its warps does not."""
    for tile in [*bwd.DKDV_TILES.values(), *TILES["dkdv_tile"]]:
        bwd._check_tile(tile, 1)
    for tile in [*bwd.DQ_TILES.values(), *TILES["dq_tile"]]:
        bwd._check_tile(tile, 0)
    for tile, rows in (((128, 64, 2, 8), 1), ((64, 128, 2, 8), 0), ((128, 8, 2, 4), 0), ((64, 64, 2, 6), 0)):
        with pytest.raises(ValueError, match="at least 16 rows a warp"):
            bwd._check_tile(tile, rows)


# ----------------------------------------------------------------------------- GPU


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _on_hopper(), reason="the Gluon kernels need an sm_90 GPU")


def make_inputs(B, H, G, T, S, D, dtype, seed=42):
    gen = generator(seed, "cuda")
    return tuple(torch.randn(*shape, generator=gen, device="cuda").to(dtype)
                 for shape in ((B, H, T, D), (B, G, S, D), (B, G, S, D), (B, H, T, D)))


def index_positions(T, S):
    """Explicit reference positions of index-causal masking for any T, S (queries are the last T
    of the S keys; with T > S the first T - S queries precede every key and see none)."""
    return (torch.arange(T, device="cuda") + S - T)[None], torch.arange(S, device="cuda")[None]


def reference(q, k, v, do, *, causal):
    """(out, lse, dq, dk, dv) in float64: autograd through `reference.flash_attention`."""
    rq, rk = index_positions(q.shape[2], k.shape[2])
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out = flash_reference.flash_attention(*leaves, pos_q_BT=rq, pos_k_BS=rk, causal=causal,
                                          compute_dtype=torch.float64)
    out.backward(do.double())
    lse = flash_reference.row_lse2(q.double(), k.double(), pos_q_BT=rq, pos_k_BS=rk, scale=q.shape[-1] ** -0.5,
                                   causal=causal)
    return out.detach(), lse, *(t.grad for t in leaves)


def gluon_backward(do, q, k, v, out, lse, *, causal, **options):
    """dq, dk, dv into NaN-poisoned buffers (a row the kernels skip stays NaN and fails)."""
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    return bwd.gluon_flash_bwd(do, q, k, v, out, lse, scale=q.shape[-1] ** -0.5, causal=causal, grads=grads,
                               **options)


CASES = [  # (B, H, G, T, S, D, causal, dtype)
    (2, 4, 4, 1, 1, 64, True, torch.bfloat16),
    (1, 8, 2, 77, 77, 64, True, torch.bfloat16),
    (1, 8, 2, 1000, 1000, 128, True, torch.bfloat16),
    (1, 4, 4, 4099, 4099, 128, True, torch.float16),
    (2, 4, 2, 4099, 4099, 64, False, torch.bfloat16),
    (1, 4, 4, 100, 733, 128, True, torch.bfloat16),
    (1, 8, 2, 1, 1000, 64, True, torch.float16),
    (1, 4, 2, 77, 1000, 128, False, torch.float16),
    (1, 8, 2, 1000, 4099, 64, True, torch.bfloat16),
    (1, 8, 2, 4099, 4099, 128, False, torch.bfloat16),
    (2, 16, 16, 1024, 1024, 128, True, torch.bfloat16),
]
RATIO = {torch.bfloat16: 2e-2, torch.float16: 4e-3}  # relative RMS error of a gradient vs float64


def check_backward(q, k, v, do, *, causal, label="gluon", **options):
    """Gradients against float64 and against the tl backward, both fed the tl forward's out, lse."""
    D = q.shape[-1]
    _, _, *want = reference(q, k, v, do, causal=causal)
    cfg = {"scale": D**-0.5, "causal": causal}
    out, lse = triton_flash.flash_fwd(q, k, v, None, None, None, **cfg)
    got = gluon_backward(do, q, k, v, out, lse, causal=causal, **options)
    tl_grads = triton_flash.flash_bwd(do, q, k, v, out, lse, None, None, None, **cfg)
    for name, ref, g, t in zip(("dq", "dk", "dv"), want, got, tl_grads):
        assert g.dtype == q.dtype and not g.isnan().any(), f"{label}-{name}: NaN or wrong dtype"
        err = assert_close(f"{label}-{name}", ref, g, RATIO[q.dtype])
        tl_err = rel_rms(ref, t)
        assert err <= 1.25 * tl_err + 1e-4, f"{label}-{name}: error {err:.3e} vs the tl backward's {tl_err:.3e}"
        assert_close(f"{label}-{name}-vs-tl", t.float(), g.float(), RATIO[q.dtype])
    return got


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,dtype", CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], dtype=c[7])
                              for c in CASES])
def test_gluon_backward_matches_float64(B, H, G, T, S, D, causal, dtype):
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    check_backward(q, k, v, do, causal=causal)


ATOMIC_CASES = [CASES[i] for i in (1, 3, 4, 5, 6, 7, 8)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,dtype", ATOMIC_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], dtype=c[7])
                              for c in ATOMIC_CASES])
def test_gluon_backward_atomic_dq(B, H, G, T, S, D, causal, dtype):
    """deterministic=False: dQ shares added by atomics in the dK/dV kernel, same accuracy."""
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    check_backward(q, k, v, do, causal=causal, label="atomic", deterministic=False)


WS_CASES = [CASES[i] for i in (0, 2, 3, 5, 8, 9)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("deterministic", [True, False], ids=["dq-kernel", "atomic-dq"])
@pytest.mark.parametrize("B,H,G,T,S,D,causal,dtype", WS_CASES,
                         ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], dtype=c[7])
                              for c in WS_CASES])
def test_gluon_backward_warp_specialized(B, H, G, T, S, D, causal, dtype, deterministic):
    """warp_specialize=True: the dK/dV kernel's loads in a producer warp, same gradients."""
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    check_backward(q, k, v, do, causal=causal, label="ws", deterministic=deterministic, warp_specialize=True)


@pytest.mark.gpu
@hopper
def test_rows_that_see_no_key():
    """T > S, causal: the first T - S queries see no key (lse +inf, out 0): their dq is 0 and they
    add nothing to dk, dv; out and lse from the float64 reference (the tl forward needs T <= S)."""
    q, k, v, do = make_inputs(1, 4, 2, 300, 77, 64, torch.bfloat16)
    out, lse, *want = reference(q, k, v, do, causal=True)
    for deterministic, ws in ((True, False), (False, False), (True, True)):
        got = gluon_backward(do, q, k, v, out.to(q.dtype), lse.float(), causal=True, deterministic=deterministic,
                             warp_specialize=ws)
        assert (got[0][:, :, :223] == 0).all()
        for name, ref, g in zip(("dq", "dk", "dv"), want, got):
            assert_close(f"no-key-{name}-{deterministic}-{ws}", ref, g, RATIO[q.dtype])


TILES = {"dkdv_tile": [(64, 128, 2, 8), (32, 128, 2, 8), (64, 64, 2, 4), (64, 128, 3, 8)],
         "dq_tile": [(128, 64, 2, 8), (128, 128, 2, 8), (64, 64, 2, 4), (128, 64, 3, 8)]}


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kind,tile", [(k, t) for k, ts in TILES.items() for t in ts],
                         ids=[f"{k}-{'x'.join(map(str, t))}" for k, ts in TILES.items() for t in ts])
@pytest.mark.parametrize("D", [64, 128])
def test_gluon_backward_every_tile(kind, tile, D):
    q, k, v, do = make_inputs(1, 8, 2, 1000, 1003, D, torch.bfloat16)
    check_backward(q, k, v, do, causal=True, label=f"{kind}-{'x'.join(map(str, tile))}", **{kind: tile})


@pytest.mark.gpu
@hopper
def test_gluon_backward_is_deterministic():
    """No atomics: two runs give bitwise equal gradients (GQA sums in a fixed order)."""
    q, k, v, do = make_inputs(2, 8, 2, 2000, 2000, 128, torch.bfloat16)
    out, lse = triton_flash.flash_fwd(q, k, v, None, None, None, scale=128**-0.5, causal=True)
    first, second = (gluon_backward(do, q, k, v, out, lse, causal=True) for _ in range(2))
    for name, a, b in zip(("dq", "dk", "dv"), first, second):
        assert torch.equal(a, b), name
