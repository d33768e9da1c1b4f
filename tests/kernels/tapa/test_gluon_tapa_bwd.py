"""Gluon Hopper TAPA backward (kernels/tapa/gluon_tapa_bwd.py) against float64 autograd.

CPU: the module imports without a GPU and without Gluon, `supported` gives the routing reasons, the
launcher validates like `tapa_attention`, the tile checks and scalars, the transposed tile's offsets
(the dK/dV kernel's rows are keys) and the series' radius over every tile the kernels give it.
GPU (`gpu`, sm_90 only): dq, dk, dv against the float64 reference's autograd gradients (relative RMS
error, and no worse than the Triton `tl` TAPA backward's own error) and against the `tl` backward,
into NaN-poisoned gradient buffers, from the lse of the Gluon forward and of the `tl` forward; lengths
no block divides (1, 63, 65, 200, 1000, 4099), T < S and T > S (rows that see no key), GQA 4/2 and
4/1, D 64 and 128, bf16 and fp16, causal and not, quadratic and linear phase, alphas that take the
series, the exact series (alpha = 1) and none (alpha = 7.5), every tile of both kernels, bitwise
repeatable. The kernels are index-only (TAPA depends on |m - n| alone, MATH §4.6), so distances
beyond fp32's integers come from S = 2**24 + 77 keys rather than an offset.
"""

from __future__ import annotations

import importlib
import math
import sys

import pytest
import torch

from phaselab.kernels.attention import reference
from phaselab.kernels.common.score_mod import ScoreMod
from phaselab.kernels.tapa import gluon_tapa, gluon_tapa_bwd, gluon_tapa_host, phase, triton_tapa
from phaselab.kernels.testing import assert_close, generator, rel_rms, shape_id

# ----------------------------------------------------------------------------- CPU


def _qkv(D=128, dtype=torch.bfloat16, H=4, G=2, T=8, S=8):
    return (torch.zeros(1, H, T, D, dtype=dtype), torch.zeros(1, G, S, D, dtype=dtype),
            torch.zeros(1, G, S, D, dtype=dtype))


def test_module_imports_without_gpu():
    module = importlib.reload(gluon_tapa_bwd)
    assert set(module.DKDV_TILES) == set(module.DQ_TILES) == {64, 128}
    q, k, v = _qkv()
    assert isinstance(module.supported(q, k, v), str)  # no CUDA tensor here: a reason, no exception


def test_module_imports_without_gluon(monkeypatch):
    """A Triton without Gluon: the module still imports and every input gets the import reason."""
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)
    try:
        importlib.reload(gluon_tapa_bwd.gluon_common)
        module = importlib.reload(gluon_tapa_bwd)
        assert module.gluon_common.IMPORT_ERROR.startswith(("ImportError", "ModuleNotFoundError"))
        q, k, v = _qkv()
        assert module.supported(q, k, v).startswith("gluon unavailable (")
        with pytest.raises(ValueError, match="gluon_tapa_bwd: gluon unavailable"):
            module.gluon_tapa_bwd(q, q, k, v, q, q[..., 0].float())
    finally:
        monkeypatch.undo()
        importlib.reload(gluon_tapa_bwd.gluon_common)
        importlib.reload(gluon_tapa_bwd)


def test_supported_reasons(gluon_importable):
    q, k, v = _qkv()
    sup = gluon_tapa_bwd.supported
    assert sup(q, k, v) == "device cpu (needs CUDA, one device)"
    assert sup(q, k, v, theta=0.25) == \
        "theta=0.25 with head dim 128 gives D_A=32 (the Gluon TAPA backward needs D_A = D / 2)"
    assert sup(q, k, v, scale=-1.0).startswith("scale=-1.0 (the Gluon TAPA backward needs scale > 0")
    assert sup(q, k, v, torch.arange(8)[None], torch.arange(8)[None]) == \
        "explicit positions (the Gluon TAPA backward is index-causal)"
    assert sup(*_qkv(dtype=torch.float32)).startswith("dtype torch.float32")
    assert sup(*_qkv(D=96)) == "head dims q 96, k 96, v 96 (needs one of (64, 128))"
    assert sup(*_qkv(D=64)) == "device cpu (needs CUDA, one device)"
    assert sup(*_qkv(H=3, G=2)).startswith("shapes q (1, 3, 8, 128)")
    assert sup(q[0], k, v) == "q, k, v must be 4-D tensors"
    long_k = torch.zeros(1, 1, 1, 128).expand(1, 1, 2**29, 128)
    assert sup(q, long_k, long_k).startswith("lengths T=8, S=536870912")


def test_supported_under_interpreter(gluon_importable, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gluon_tapa_bwd.supported(*_qkv()).startswith("TRITON_INTERPRET is set")


def test_launcher_validates_and_refuses(gluon_importable):
    q, k, v = _qkv()
    lse = torch.zeros(q.shape[:3])
    with pytest.raises(ValueError, match="gluon_tapa_bwd: device cpu"):
        gluon_tapa_bwd.gluon_tapa_bwd(q, q, k, v, q, lse)
    with pytest.raises(ValueError, match="alpha=0"):
        gluon_tapa_bwd.gluon_tapa_bwd(q, q, k, v, q, lse, alpha=0)
    with pytest.raises(ValueError, match="theta=0.25 with head dim 128"):
        gluon_tapa_bwd.gluon_tapa_bwd(q, q, k, v, q, lse, theta=0.25)


@pytest.mark.parametrize("tile,resident", [((16, 128, 2, 8), 1), ((32, 64, 2, 4), 1), ((128, 32, 2, 8), 0),
                                           ((64, 64, 3, 4), 0)])
def test_check_tile_accepts(tile, resident):
    gluon_tapa_bwd.check_tile(tile, resident)


@pytest.mark.parametrize("tile,resident", [((16, 64, 2, 8), 1), ((8, 128, 2, 8), 1), ((32, 128, 2, 2), 1),
                                           ((64, 32, 0, 4), 0), ((128, 24, 2, 8), 0), ((64, 512, 2, 4), 0)])
def test_check_tile_refuses(tile, resident):
    with pytest.raises(ValueError, match="tile"):
        gluon_tapa_bwd.check_tile(tile, resident)


def test_default_tiles_are_valid():
    for D in (64, 128):
        gluon_tapa_bwd.check_tile(gluon_tapa_bwd.DKDV_TILES[D], 1)
        gluon_tapa_bwd.check_tile(gluon_tapa_bwd.DQ_TILES[D], 0)


@pytest.mark.parametrize("D", [64, 128])
def test_kernel_scalars_extend_the_forward(D):
    """The forward's scalars for the same tile, then ds_scale = scale / sqrt(D_A) (the epilogue's
    factor of the amplitude gradient; the phase gradient's is -2 pi times it)."""
    got = gluon_tapa_bwd.kernel_scalars(D, 0.3, 1.0, 0.7, 16, 128)
    assert got[:-1] == gluon_tapa_host.kernel_scalars(D, 0.3, 1.0, 0.7, 16, 128)
    assert got[-1] == pytest.approx(0.7 / math.sqrt(D // 2))


@pytest.mark.parametrize("tile", [(16, 128), (32, 128), (32, 64), (128, 32), (128, 64)])
def test_transposed_offsets(tile):
    """The dK/dV kernel's tile has keys as rows r and queries as columns c: m - n = D_c + (c - r -
    CENTRE) with D_c = i BM + S - T + CENTRE - n0, CENTRE = (BM - BN) // 2, and the offset is the
    forward helper's u numerator with rows -(r + CENTRE) and columns -c (`_weight_t`)."""
    bm, bn = tile
    T, S, i, n0 = 1000, 1300, 7, 5 * bn
    centre = (bm - bn) // 2
    r = torch.arange(bn)[:, None]
    c = torch.arange(bm)[None, :]
    m = i * bm + c + S - T
    n = n0 + r
    dc = i * bm + S - T + centre - n0
    assert torch.equal(m - n, dc + (c - r - centre))
    ia_t, jc_t = -(r + centre), -c
    assert torch.equal(ia_t - jc_t, c - r - centre)
    assert (c - r - centre).abs().max().item() == (bm + bn - 2) // 2


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.5, 1.0, 5.9, 7.5])
@pytest.mark.parametrize("D", [64, 128])
def test_series_radius_covers_the_backward_tiles(alpha, D):
    """Every default tile of both kernels: where |D_c| >= r_min, every in-tile offset e has |e /
    D_c| <= u_max and the five-term series matches |D_c + e|^alpha within 1.4e-7 of |D_c|^alpha."""
    for bm, bn, _, _ in (gluon_tapa_bwd.DKDV_TILES[D], gluon_tapa_bwd.DQ_TILES[D]):
        *_, c1, c2, c3, c4, c5, r_min, _ = gluon_tapa_bwd.kernel_scalars(D, alpha, 2 * math.pi, 1.0, bm, bn)
        u_max = phase._taylor(alpha)[0]
        if u_max == 0.0:
            assert r_min == gluon_tapa_host._R_MIN_CAP
            continue
        e = (torch.arange(bm, dtype=torch.float64)[None, :] - torch.arange(bn, dtype=torch.float64)[:, None]
             - (bm - bn) // 2)
        for dc in (r_min, -r_min, 2**28):
            u = e / dc
            assert u.abs().max().item() <= u_max
            series = sum(cf * u**k for k, cf in enumerate([1.0, c1, c2, c3, c4, c5]))
            assert (series - (dc + e).abs() ** alpha / abs(dc) ** alpha).abs().max().item() < 1.4e-7


# ----------------------------------------------------------------------------- GPU


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _on_hopper(), reason="the Gluon TAPA backward needs an sm_90 GPU")
RATIO = {torch.bfloat16: 2e-2, torch.float16: 4e-3}  # relative RMS error of a gradient vs float64


def make_inputs(B, H, G, T, S, D, dtype, seed=42):
    gen = generator(seed, "cuda")
    return tuple(torch.randn(*shape, generator=gen, device="cuda").to(dtype)
                 for shape in ((B, H, T, D), (B, G, S, D), (B, G, S, D), (B, H, T, D)))


def positions(T, S):
    """Index positions (the T queries are the last T of the S keys), int64."""
    return torch.arange(S - T, S, device="cuda")[None], torch.arange(S, device="cuda")[None]


def ref_grads(q, k, v, do, params, causal):
    """dq, dk, dv in float64: autograd through the reference."""
    pos_q, pos_k = positions(q.shape[2], k.shape[2])
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    reference.attention(*leaves, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0, causal=causal,
                        score_mod=ScoreMod(kind="tapa", params=params),
                        compute_dtype=torch.float64).backward(do.double())
    return [t.grad for t in leaves]


def tl_config(params, D, causal):
    return {"d_amp": D // 2, "alpha": params.get("alpha", 0.1), "phase_scale": params.get("phase_scale", 2 * math.pi),
            "linear": params.get("phase", "quadratic") == "linear", "scale": 1.0, "causal": causal}


def forward(q, k, v, params, causal, fwd):
    """(out, lse) of the Gluon forward or of the tl forward (both in the tl lse convention)."""
    if fwd == "gluon":
        return gluon_tapa.gluon_tapa_fwd(q, k, v, causal=causal, **params)
    return triton_tapa.tapa_fwd(q, k, v, *positions(q.shape[2], k.shape[2]), **tl_config(params, q.shape[-1], causal))


def gluon_backward(do, q, k, v, out, lse, params, causal, **kwargs):
    """dq, dk, dv into NaN-poisoned buffers (a row the kernels skip stays NaN and fails); kwargs:
    tiles, variants."""
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    cfg = tl_config(params, q.shape[-1], causal)
    return gluon_tapa_bwd.gluon_tapa_bwd(do, q, k, v, out, lse, alpha=cfg["alpha"], phase_scale=cfg["phase_scale"],
                                         linear=cfg["linear"], causal=causal, grads=grads, **kwargs)


def check_backward(q, k, v, do, params, *, causal, fwd="gluon", label="gluon-tapa-bwd", ratio=None, **kwargs):
    """Gradients against float64 (relative RMS within `ratio`, default RATIO of q's dtype), and
    (T <= S) against the tl backward fed the same out and lse."""
    ratio = RATIO[q.dtype] if ratio is None else ratio
    T, S = q.shape[2], k.shape[2]
    want = ref_grads(q, k, v, do, params, causal)
    out, lse = forward(q, k, v, params, causal, fwd)
    got = gluon_backward(do, q, k, v, out, lse, params, causal, **kwargs)
    tl_grads = None
    if T <= S:
        tl_grads = triton_tapa.tapa_bwd(do, q, k, v, out, lse, *positions(T, S), **tl_config(params, q.shape[-1], causal))
    for idx, (name, ref, g) in enumerate(zip(("dq", "dk", "dv"), want, got)):
        assert g.dtype == q.dtype and not g.isnan().any(), f"{label}-{name}: NaN or wrong dtype"
        err = assert_close(f"{label}-{name}", ref, g, ratio)
        if tl_grads is not None:
            tl_err = rel_rms(ref, tl_grads[idx])
            assert err <= 1.25 * tl_err + 1e-4, f"{label}-{name}: error {err:.3e} vs the tl backward's {tl_err:.3e}"
            # two implementations, each within RATIO of float64, differ by up to twice that
            assert_close(f"{label}-{name}-vs-tl", tl_grads[idx].float(), g.float(), 2 * ratio)
    return got


CASES = [  # (B, H, G, T, S, D, causal, params, dtype)
    (2, 4, 4, 1, 1, 128, True, {}, torch.bfloat16),
    (1, 4, 2, 63, 63, 64, True, {}, torch.bfloat16),
    (1, 4, 1, 65, 65, 128, False, {}, torch.float16),
    (1, 4, 2, 200, 200, 128, True, {"phase": "linear"}, torch.bfloat16),
    (1, 4, 1, 1000, 1000, 64, True, {"alpha": 0.5, "phase_scale": 1.0}, torch.float16),
    (2, 4, 2, 1000, 1000, 128, False, {}, torch.bfloat16),
    (1, 4, 2, 1, 1000, 128, True, {}, torch.bfloat16),
    (1, 4, 1, 63, 200, 64, False, {"phase": "linear"}, torch.float16),
    (1, 4, 2, 65, 1000, 128, True, {"alpha": 1.0}, torch.float16),  # the series is exact
    # no series; |m - n|^7.5 reaches 3e22 here, so phase_scale keeps the phase within a few turns,
    # where fp32 (and float64) still resolve it
    (1, 4, 2, 200, 1000, 64, True, {"alpha": 7.5, "phase_scale": 1e-21}, torch.bfloat16),
    (1, 4, 2, 1000, 1000, 128, True, {"phase": "linear"}, torch.float16),
    (1, 4, 1, 1000, 1000, 64, False, {"phase": "linear"}, torch.bfloat16),
    (1, 4, 4, 4099, 4099, 128, True, {}, torch.bfloat16),
    (1, 4, 2, 4099, 4099, 64, True, {}, torch.bfloat16),  # the 124M model's heads, every kind of block
    (1, 4, 2, 300, 77, 64, True, {}, torch.bfloat16),  # T > S: the first 223 rows see no key
]


def _case_id(c):
    return shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], phase=c[7].get("phase", "quadratic"),
                    alpha=c[7].get("alpha", 0.1), dtype=c[8])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", CASES, ids=[_case_id(c) for c in CASES])
def test_gluon_tapa_backward_matches_float64(B, H, G, T, S, D, causal, params, dtype):
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    dq, _, _ = check_backward(q, k, v, do, params, causal=causal)
    if causal and T > S:
        assert (dq[:, :, :T - S] == 0).all()  # rows that see no key: lse +inf, P 0


TL_FWD_CASES = [CASES[i] for i in (1, 3, 5, 8)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", TL_FWD_CASES, ids=[_case_id(c) for c in TL_FWD_CASES])
def test_gluon_tapa_backward_from_tl_forward(B, H, G, T, S, D, causal, params, dtype):
    """The lse of the tl forward (same convention) gives the same gradients."""
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    check_backward(q, k, v, do, params, causal=causal, fwd="tl", label="tl-fwd")


TILES = {"dkdv_tile": [(32, 128, 2, 8), (16, 128, 2, 8), (32, 64, 2, 4), (16, 128, 3, 8)],
         "dq_tile": [(128, 32, 2, 8), (128, 64, 2, 8), (64, 64, 2, 4), (128, 32, 3, 8)]}


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kind,tile", [(k, t) for k, ts in TILES.items() for t in ts],
                         ids=[f"{k}-{'x'.join(map(str, t))}" for k, ts in TILES.items() for t in ts])
@pytest.mark.parametrize("D", [64, 128])
def test_gluon_tapa_backward_every_tile(kind, tile, D):
    q, k, v, do = make_inputs(1, 4, 2, 1000, 1003, D, torch.bfloat16)
    check_backward(q, k, v, do, {"alpha": 0.5}, causal=True, label=f"{kind}-{'x'.join(map(str, tile))}",
                   **{kind: tile})


VARIANT_SETS = [frozenset({"table"}), frozenset({"order3"}), frozenset({"ws"}),
                frozenset({"table", "order3", "ws"}), frozenset({"order3", "ws", "diag"}),
                frozenset({"order3", "ws", "coef", "diag"}), frozenset({"order3", "ws", "coef", "diag", "table"})]
# lengths past r_3 of both kernels' tiles, so that every kind of block runs
VARIANT_CASES = [(1, 4, 2, 4099, 4099, 128, True, {}, torch.bfloat16),
                 (1, 4, 1, 3000, 3000, 64, False, {"phase": "linear"}, torch.float16),
                 (1, 4, 2, 300, 4099, 128, True, {"alpha": 0.5}, torch.bfloat16)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("variants", VARIANT_SETS, ids=["+".join(sorted(v)) for v in VARIANT_SETS])
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", VARIANT_CASES, ids=[_case_id(c) for c in VARIANT_CASES])
def test_gluon_tapa_backward_variants_match_float64(B, H, G, T, S, D, causal, params, dtype, variants):
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    check_backward(q, k, v, do, params, causal=causal, variants=variants,
                   label=f"gluon-tapa-bwd-{'+'.join(sorted(variants))}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("phase_kind", ["quadratic", "linear"])
def test_gluon_tapa_backward_ws_wide_dkdv_tile(phase_kind):
    """The producer partition beside the 32-row dK/dV tile at D = 128 (the default since timed,
    DEFAULT_VARIANTS and DKDV_TILES; small spills in the quadratic phase), with the other
    schedules compiled in beside it."""
    q, k, v, do = make_inputs(1, 4, 2, 2000, 2000, 128, torch.bfloat16)
    check_backward(q, k, v, do, {"phase": phase_kind}, causal=True, variants={"ws", "order3", "table"},
                   dkdv_tile=(32, 128, 2, 8), label=f"ws-32x128-{phase_kind}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("D,phase_kind", [(128, "quadratic"), (64, "quadratic"), (64, "linear")])
def test_gluon_tapa_backward_diag_is_bitwise_the_series(D, phase_kind):
    """The "diag" schedule evaluates the same FMAs once per diagonal (gluon_tapa.diag_poly_asm): dQ,
    dK and dV are bitwise those without it, over lengths whose tiles take both series orders."""
    q, k, v, do = make_inputs(1, 4, 2, 3000, 3000, D, torch.bfloat16)
    params = {"phase": phase_kind}
    out, lse = forward(q, k, v, params, True, "gluon")
    plain, diag = (gluon_backward(do, q, k, v, out, lse, params, True, variants=var)
                   for var in ({"order3", "ws"}, {"order3", "ws", "diag"}))
    for name, a, b in zip(("dq", "dk", "dv"), plain, diag):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@hopper
def test_gluon_tapa_backward_is_deterministic():
    """No atomics: two runs give bitwise equal gradients (GQA sums in a fixed order)."""
    q, k, v, do = make_inputs(2, 4, 2, 2000, 2000, 128, torch.bfloat16)
    out, lse = forward(q, k, v, {}, True, "gluon")
    first, second = (gluon_backward(do, q, k, v, out, lse, {}, True) for _ in range(2))
    for name, a, b in zip(("dq", "dk", "dv"), first, second):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@hopper
def test_gluon_tapa_backward_distances_beyond_fp32_integers():
    """S = 2**24 + 77 keys, the last 3 as queries: distances up to 2**24 + 76, where fp32 stops
    holding every integer, are int32 differences converted once; far tiles take the series at
    central distances near 2**24. Against float64 autograd (one head: about 40 GB) and the tl
    backward."""
    q, k, v, do = make_inputs(1, 1, 1, 3, 2**24 + 77, 64, torch.bfloat16)
    # A bf16 attention over 16M keys: the forward's output is ~2e-2 from float64 in both kernels
    # (test_gluon_tapa.py's 2**24 test); the Gluon dq measured 2.43e-2 on the H200. The bound
    # that matters here is the tl backward's own error (check_backward's 1.25x).
    check_backward(q, k, v, do, {"alpha": 0.5}, causal=True, label="gluon-tapa-bwd-2**24", ratio=4e-2)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("D,T", [(128, 1000), (64, 77)])
def test_gluon_tapa_backward_cached_launch_matches_float64(D, T):
    """The backward's launches from gluon_common.launch's cache (the second call adds no entry)
    match float64 as the first call's do."""
    for seed in (1, 2):
        q, k, v, do = make_inputs(1, 4, 2, T, T, D, torch.bfloat16, seed=seed)
        entries = len(gluon_tapa.gluon_common._LAUNCHES)
        check_backward(q, k, v, do, {}, causal=True, label=f"gluon-tapa-bwd-launch-{seed}")
        if seed == 2:
            assert len(gluon_tapa.gluon_common._LAUNCHES) == entries, "the second launches were not cache hits"
