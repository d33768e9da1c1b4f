"""Gluon Hopper TAPA forward (kernels/tapa/gluon_tapa.py) against the float64 reference.

CPU: the module imports without a GPU, `supported` gives the routing reasons, the launcher validates
like `tapa_attention`, the TMA descriptors of the D/2 halves are views, the series' radius covers
every tile the kernel gives the series, the "coef" table's rows cover every tile, and the "diag" asm,
emulated over Triton's own layout of the wgmma accumulator, gives each register its own offset.
GPU (`gpu`, sm_90 only): out and lse against float64 (relative RMS error, and no worse than the
Triton `tl` TAPA forward's own error) into NaN-poisoned buffers, over lengths no block divides
(1, 77, 1000, 4099), T < S and T > S, GQA 8/2, quadratic and linear phase, bf16 and fp16, causal and
not, alphas that take the series, the exact series (alpha = 1) and no series (alpha = 7.5), every
tile; absolute offsets of the positions (the kernel is index-only: TAPA depends on |m - n| alone) up
to 2**50 and distances beyond 2**24 (S = 2**24 + 77); the lse fed to the `tl` TAPA backward gives
the `tl` path's gradients; the schedules of `gluon_tapa_host.VARIANTS` ("lazy" also with logits that grow
along the keys, so that rows both keep and replace their max; "diag" bitwise against the series).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from phaselab.kernels.attention import reference
from phaselab.kernels.common.score_mod import ScoreMod
from phaselab.kernels.tapa import gluon_tapa, gluon_tapa_host, phase, triton_tapa
from phaselab.kernels.tapa.reference import tapa_scores
from phaselab.kernels.testing import assert_close, generator, rel_rms, shape_id

LN2 = math.log(2.0)

# ----------------------------------------------------------------------------- CPU


def _qkv(D=128, dtype=torch.bfloat16, H=4, G=2, T=8, S=8):
    return (torch.zeros(1, H, T, D, dtype=dtype), torch.zeros(1, G, S, D, dtype=dtype),
            torch.zeros(1, G, S, D, dtype=dtype))



def test_module_imports_without_gpu():
    module = importlib.reload(gluon_tapa)
    assert module.forward_tile(128, module.variant_flags(None, 128)) == (64, 64, 2, 4)
    q, k, v = _qkv()
    assert isinstance(module.supported(q, k, v), str)  # no CUDA tensor here: a reason, no exception


def test_supported_reasons(gluon_importable):
    q, k, v = _qkv()
    assert gluon_tapa_host.supported(q, k, v) == "device cpu (needs CUDA, one device)"
    assert gluon_tapa_host.supported(q, k, v, theta=0.25) == \
        "theta=0.25 with head dim 128 gives D_A=32 (the Gluon TAPA forward needs D_A = D / 2)"
    assert gluon_tapa_host.supported(q, k, v, scale=-1.0).startswith("scale=-1.0 (the Gluon TAPA forward needs scale > 0")
    assert gluon_tapa_host.supported(q, k, v, torch.arange(8)[None], torch.arange(8)[None]) == \
        "explicit positions (the Gluon TAPA forward is index-causal)"
    assert gluon_tapa_host.supported(*_qkv(dtype=torch.float32)).startswith("dtype torch.float32")
    assert gluon_tapa_host.supported(*_qkv(D=96)) == "head dims q 96, k 96, v 96 (needs one of (64, 128))"
    assert gluon_tapa_host.supported(*_qkv(D=64)) == "device cpu (needs CUDA, one device)"
    assert gluon_tapa_host.supported(*_qkv(H=3, G=2)).startswith("shapes q (1, 3, 8, 128)")
    assert gluon_tapa_host.supported(q[0], k, v) == "q, k, v must be 4-D tensors"
    long_k = torch.zeros(1, 1, 1, 128).expand(1, 1, 2**29, 128)
    assert gluon_tapa_host.supported(q, long_k, long_k).startswith("lengths T=8, S=536870912")


def test_supported_without_gluon_or_under_interpreter(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setattr(gluon_tapa_host.gluon_common, "IMPORT_ERROR", "ImportError: no module named gluon")
    assert gluon_tapa_host.supported(q, k, v) == "gluon unavailable (ImportError: no module named gluon)"
    monkeypatch.setattr(gluon_tapa_host.gluon_common, "IMPORT_ERROR", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gluon_tapa_host.supported(q, k, v).startswith("TRITON_INTERPRET is set")


def test_launcher_validates_and_refuses(gluon_importable):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="gluon_tapa_fwd: device cpu"):
        gluon_tapa.gluon_tapa_fwd(q, k, v)
    with pytest.raises(ValueError, match="alpha=0"):
        gluon_tapa.gluon_tapa_fwd(q, k, v, alpha=0)
    with pytest.raises(ValueError, match="phase='cubic'"):
        gluon_tapa.gluon_tapa_fwd(q, k, v, phase="cubic")
    with pytest.raises(ValueError, match="theta=0.25 with head dim 128"):
        gluon_tapa.gluon_tapa_fwd(q, k, v, theta=0.25)
    with pytest.raises(ValueError, match="q, k, v must be 4-D tensors"):   # before any plan is keyed
        gluon_tapa.gluon_tapa_fwd(None, k, v)


@pytest.mark.skipif(gluon_tapa.gluon_common.IMPORT_ERROR is not None, reason="no Gluon in this Triton")
def test_forward_launch_picks_the_kernel_and_its_constexprs():
    """The kernel the schedules pick, with HEADS where its grid order applies and the register cap
    of `launch_regs` (the same plan a launch and benchmarks/gluon_compile_tapa.py use)."""
    host, flags = gluon_tapa_host, gluon_tapa_host.variant_flags
    kernel, meta = gluon_tapa.forward_launch(128, (64, 64, 2, 4), flags(None, 128), True, False)
    assert kernel is gluon_tapa.gluon_tapa_fwd_ws_kernel and meta["maxnreg"] == host.FWS_PAIR_REGS
    assert meta["HEADS"] == host.INTERLEAVE_HEADS and meta["PRODUCER_REGS"] == gluon_tapa.PRODUCER_REGS
    assert (meta["STAGES"], meta["num_warps"], meta["CAUSAL"], meta["LINEAR"]) == (2, 4, True, False)
    kernel, meta = gluon_tapa.forward_launch(64, (64, 64, 2, 4), flags({"occupancy", "table"}, 64), False, True)
    assert kernel is gluon_tapa.gluon_tapa_fwd_kernel and meta["HEADS"] == 1 and meta["maxnreg"] == 168
    assert meta["TABLE"] and not meta["COEF"] and not meta["CAUSAL"] and meta["LINEAR"]
    kernel, meta = gluon_tapa.forward_launch(128, (64, 64, 2, 4), flags({"persistent", "interleave"}, 128), True,
                                             False)
    assert kernel is gluon_tapa.gluon_tapa_fwd_persistent_kernel and "HEADS" not in meta and "maxnreg" not in meta
    kernel, meta = gluon_tapa.forward_launch(128, (64, 64, 2, 4), flags({"pingpong", "fws", "persistent"}, 128),
                                             True, False)
    assert kernel is gluon_tapa.gluon_tapa_fwd_pp_kernel and meta["maxnreg"] == host.PINGPONG_REGS
    assert meta["CONSUMER_REGS"] == host.PINGPONG_CONSUMER_REGS and meta["PRODUCER_REGS"] == gluon_tapa.PRODUCER_REGS


@pytest.mark.skipif(gluon_tapa.gluon_common.IMPORT_ERROR is not None, reason="no Gluon in this Triton")
def test_descriptors_are_views_of_the_halves():
    q = torch.zeros(2, 3, 100, 128, dtype=torch.bfloat16)
    k = torch.zeros(2, 1, 90, 128, dtype=torch.bfloat16)
    qa, qp, ka, kp, vd = gluon_tapa_host.descriptors(q, k, k, 64, 32)
    for desc, base, offset, rows in ((qa, q, 0, 600), (qp, q, 64, 600), (ka, k, 0, 180), (kp, k, 64, 180)):
        assert desc.base.data_ptr() == base.data_ptr() + 2 * offset  # no copy: a strided view
        assert list(desc.shape) == [rows, 64] and list(desc.strides) == [128, 1]
    assert list(qa.block_shape) == [64, 64] and list(ka.block_shape) == [32, 64]
    assert list(vd.shape) == [180, 128] and list(vd.block_shape) == [32, 128]


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.5, 1.0, 2.5, 5.9, 7.5])
@pytest.mark.parametrize("tile", [(64, 64), (128, 64), (64, 128)])
def test_series_radius_covers_every_series_tile(alpha, tile):
    """A tile takes the series iff |D_c| >= r_min; there every in-tile offset e (|e| <= (BM + BN - 2)
    / 2) has |e / D_c| <= u_max, and the five-term series (the kernel's, in float64) matches
    |D_c + e|^alpha within `phase._taylor`'s bound, 1.4e-7 of the leading term |D_c|^alpha, at
    either sign of D_c."""
    bm, bn = tile
    qk_scale, a, k_turn, *coef, r_min = gluon_tapa_host.kernel_scalars(128, alpha, 2 * math.pi, 1.0, bm, bn)
    assert a == alpha and k_turn == pytest.approx(1 / 8) and qk_scale == pytest.approx(1 / (8 * LN2))
    u_max = phase._taylor(alpha)[0]
    if u_max == 0.0:
        assert r_min == gluon_tapa_host._R_MIN_CAP  # no series: every tile exact below 2**29 keys
        return
    i = torch.arange(bm, dtype=torch.float64)[:, None]
    j = torch.arange(bn, dtype=torch.float64)[None, :]
    e = i - j - (bm - bn) // 2
    assert e.abs().max().item() == (bm + bn - 2) / 2
    for dc in (r_min, -r_min, 3 * r_min + 5, -(2**28)):
        u = e / dc
        assert u.abs().max().item() <= u_max
        series = sum(c * u**n for n, c in enumerate([1.0, *coef]))
        exact = (dc + e).abs() ** alpha / abs(dc) ** alpha
        assert (series - exact).abs().max().item() < 1.4e-7  # both in units of |D_c|^alpha


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.5, 1.0, 2.5, 4.0, 5.9, 7.5])
@pytest.mark.parametrize("tile", [(64, 64), (128, 64), (16, 128), (128, 32)])
def test_order3_radius_covers_its_tiles(alpha, tile):
    """The "order3" variant: tiles with |D_c| >= r_3 take three terms; r_3 >= r_min, and there the
    third-order series (in float64) matches |D_c + e|^alpha within 1.4e-7 of |D_c|^alpha for every
    in-tile offset e, at either sign of D_c."""
    bm, bn = tile
    *_, c1, c2, c3, _c4, _c5, r_min = gluon_tapa_host.kernel_scalars(128, alpha, 2 * math.pi, 1.0, bm, bn)
    r_3 = gluon_tapa_host.order3_radius(alpha, bm, bn, r_min)
    assert r_min <= r_3 <= gluon_tapa_host._R_MIN_CAP
    u_3 = phase.series_radius(alpha, 3)
    if u_3 == 0.0:
        assert r_3 == gluon_tapa_host._R_MIN_CAP
        return
    e = torch.arange(bm, dtype=torch.float64)[:, None] - torch.arange(bn, dtype=torch.float64)[None, :] - (bm - bn) // 2
    for dc in (r_3, -r_3, 5 * r_3 + 3, -(2**28)):
        u = e / dc
        assert u.abs().max().item() <= u_3
        series = 1.0 + c1 * u + c2 * u**2 + c3 * u**3
        exact = (dc + e).abs() ** alpha / abs(dc) ** alpha
        assert (series - exact).abs().max().item() < 1.4e-7


@pytest.mark.parametrize("alpha", [0.1, 0.5, 3.0])
def test_series_radius_bounds_the_tail(alpha):
    """series_radius(alpha, K): at u = +-u_max the terms past K add up (to order 40, float64) to
    less than 1.4e-7, and at 1.5 u_max (below 0.25) to more than 1e-7 for the orders that need a
    radius: the bound is the radius, not a guess far below it."""
    for order in (3, 5):
        u_max = phase.series_radius(alpha, order)
        coef, c = [], 1.0
        for k in range(1, 41):
            c *= (alpha - k + 1) / k
            coef.append(c)
        for u in (u_max, -u_max):
            assert abs(sum(cf * u**k for k, cf in enumerate(coef, 1) if k > order)) < 1.4e-7
        if u_max < 0.25 / 1.5:
            u = 1.5 * u_max
            assert max(abs(sum(cf * x**k for k, cf in enumerate(coef, 1) if k > order)) for x in (u, -u)) > 1e-7


def test_distance_table_and_variant_scalars():
    """The "table" variant's W: k_turn d^alpha from float64, rounded once, over d < min(r_min,
    max(S, T)) + BM + BN; without the variant one entry; r_3 = r_min without "order3"."""
    scalars = gluon_tapa_host.kernel_scalars(128, 0.1, 2 * math.pi, 1.0, 64, 64)
    k_turn, r_min = scalars[2], scalars[-1]
    r_3, table, w_coef, base = gluon_tapa_host.variant_scalars(scalars, 0.1, 4096, 4096, 64, 64, True, True,
                                                               torch.device("cpu"))
    assert w_coef is table and base == 0   # without "coef": a stand-in the kernel never reads
    assert r_3 == gluon_tapa_host.order3_radius(0.1, 64, 64, r_min) > r_min
    assert table.dtype == torch.float32 and table.shape == (r_min + 128,)
    d = torch.arange(r_min + 128, dtype=torch.float64)
    assert torch.equal(table, (k_turn * d**0.1).float()) and table[0] == 0.0
    assert table[1].item() == pytest.approx(k_turn, rel=1e-7)
    for d in (2, 63, 450, r_min + 127):  # against Python's own power, not the formula above
        assert table[d].item() == pytest.approx(k_turn * math.pow(d, 0.1), rel=6e-8)
    # without "order3" r_3 lies past every distance a launch can have (lengths < _MAX_LEN), so no
    # tile takes the third order; r_3 = r_min would give it to every series tile
    r_3, table, *_ = gluon_tapa_host.variant_scalars(scalars, 0.1, 100, 300, 64, 64, True, False, torch.device("cpu"))
    assert r_3 == gluon_tapa_host._R_MIN_CAP >= gluon_tapa_host._MAX_LEN and table.shape == (300 + 128,)  # max(S, T) + BM + BN
    r_3, table, *coef = gluon_tapa_host.variant_scalars(scalars, 0.1, 4096, 4096, 64, 64, False, False,
                                                        torch.device("cpu"), coef=True)
    want, want_base = gluon_tapa_host.coefficient_table(4096, 4096, 64, 64, 0.1, k_turn, torch.device("cpu"))
    assert torch.equal(coef[0], want) and coef[1] == want_base
    assert r_3 == gluon_tapa_host._R_MIN_CAP and table.shape == (1,)


def test_launch_regs_caps_fws_pairs_and_occupancy():
    """The "fws" kernel with one consumer warpgroup: two CTAs of 8 warps fill the SM's 65536
    registers; "occupancy" alone: its head dim's cap; neither, or fws with two consumer
    warpgroups: no cap."""
    regs, host = gluon_tapa_host.launch_regs, gluon_tapa_host
    assert 2 * 8 * 32 * host.FWS_PAIR_REGS == 65536
    assert regs(128, (64, 64, 2, 4), host.variant_flags({"fws", "order3"}, 128)) == host.FWS_PAIR_REGS
    assert regs(64, (64, 64, 2, 4), host.variant_flags({"fws", "occupancy"}, 64)) == host.FWS_PAIR_REGS
    assert regs(128, (128, 64, 2, 8), host.variant_flags({"fws"}, 128)) is None
    assert regs(64, (64, 64, 2, 4), host.variant_flags({"occupancy"}, 64)) == host.OCCUPANCY_REGS[64] == 168
    assert regs(128, (64, 64, 2, 4), host.variant_flags({"occupancy"}, 128)) is None
    assert regs(128, (64, 64, 2, 4), host.variant_flags({"order3", "coef"}, 128)) is None
    # "pingpong": three warpgroups (two consumers, the producer's) within the SM's registers, and
    # the consumers' share after the producer's 24 is what setmaxnreg can give (a multiple of 8)
    assert 3 * 4 * 32 * host.PINGPONG_REGS <= 65536 and host.PINGPONG_CONSUMER_REGS % 8 == 0
    assert 2 * 128 * host.PINGPONG_CONSUMER_REGS + 128 * gluon_tapa.PRODUCER_REGS <= 3 * 128 * host.PINGPONG_REGS
    for D in (64, 128):
        assert regs(D, (64, 64, 2, 4), host.variant_flags({"pingpong", "fws", "occupancy"}, D)) == host.PINGPONG_REGS


def test_forward_tile_and_interleaved_heads():
    """The forward's tile follows "fws" (TILES_FWS) and its HEADS constexpr "interleave"."""
    host = gluon_tapa_host
    for D in host.TILES:
        assert host.forward_tile(D, host.variant_flags({"order3"}, D)) == host.TILES[D]
        assert host.forward_tile(D, host.variant_flags({"order3", "fws"}, D)) == host.TILES_FWS[D]
    assert host.forward_tile(128, host.variant_flags({"fws"}, 128)) == (64, 64, 2, 4)
    for D in host.TILES_PP:   # one consumer warpgroup's tile, BLOCK_M = BLOCK_N (the kernel asserts it)
        flags = host.variant_flags({"pingpong", "fws"}, D)
        assert host.forward_tile(D, flags) == host.TILES_PP[D] and host.TILES_PP[D][0] == host.TILES_PP[D][1]
        assert host.TILES_PP[D][3] == 4 and host.query_blocks(flags) == 2
    assert host.query_blocks(host.variant_flags({"fws"}, 128)) == 1
    assert host.interleave_heads(host.variant_flags({"order3"}, 64)) == 1
    assert host.interleave_heads(host.variant_flags({"order3", "interleave"}, 64)) == host.INTERLEAVE_HEADS == 4


def test_variant_flags_refuse_unknown_names():
    assert gluon_tapa_host.Variants._fields == gluon_tapa_host.VARIANTS
    assert set(gluon_tapa_host.DEFAULT_VARIANTS) == set(gluon_tapa_host.TILES)   # a default for every head dim
    for D, chosen in gluon_tapa_host.DEFAULT_VARIANTS.items():
        assert gluon_tapa_host.variant_flags(None, D) == tuple(v in chosen for v in gluon_tapa_host.VARIANTS)
        assert chosen <= set(gluon_tapa_host.VARIANTS) and {"ws", "order3"} <= chosen
        # the register cap is for the head dims that have one; fws only where its pair tile is the default
        assert ("occupancy" in chosen) == (D in gluon_tapa_host.OCCUPANCY_REGS)
        assert ("fws" in chosen) == (gluon_tapa_host.TILES_FWS[D] == gluon_tapa_host.TILES[D])
    assert gluon_tapa_host.variant_flags({"table", "order3"}, 64) == (True, True) + (False,) * 9
    flags = gluon_tapa_host.variant_flags(["ws", "lazy", "persistent"], 128)
    assert flags == (False, False, True, False, True, False, False, False, True, False, False) and flags.lazy
    assert flags.persistent and not flags.coef and not flags.interleave
    assert gluon_tapa_host.variant_flags((), 128) == (False,) * len(gluon_tapa_host.VARIANTS)
    with pytest.raises(ValueError, match="unknown TAPA kernel variants.*eager"):
        gluon_tapa_host.variant_flags({"table", "eager"}, 64)


@pytest.mark.parametrize("T,S,bm,bn,alpha", [(4096, 4096, 64, 64, 0.1), (300, 4099, 64, 64, 0.5),
                                             (4099, 300, 128, 64, 0.1), (1, 77, 64, 64, 2.5),
                                             (3001, 2999, 128, 32, 0.1)])   # the last: dQ's D=128 tile
def test_coefficient_table_covers_every_tile(T, S, bm, bn, alpha):
    """The "coef" variant's table: the kernel's row of each (query block, key block) tile
    (`_coef_row`: (x0 - base) // BN - j, x0 = m0 + S - T + (BM - BN) / 2 as `_geometry`'s) lies in
    the table and holds that tile's central distance; each row holds f = k_turn |D_c|^alpha and
    g_i = f binom(alpha, i) / D_c^i, from Python's float64 power, rounded once to fp32."""
    k_turn = gluon_tapa_host.kernel_scalars(128, alpha, 2 * math.pi, 1.0, bm, bn)[2]
    table, base = gluon_tapa_host.coefficient_table(T, S, bm, bn, alpha, k_turn, torch.device("cpu"))
    assert table.dtype == torch.float32 and table.shape[1] == 8 and table.is_contiguous()
    rows = set()
    for m0 in range(0, T, bm):
        x0 = m0 + S - T + (bm - bn) // 2
        for j in range(-(-S // bn)):
            row = (x0 - base) // bn - j
            assert 0 <= row < table.shape[0] and base + row * bn == x0 - j * bn
            rows.add(row)
    binom = phase._taylor(alpha)[1:]
    for row in sorted(rows)[:: max(1, len(rows) // 97)]:
        d = base + row * bn
        want = [0.0] * 6 if d == 0 else [k_turn * math.pow(abs(d), alpha)]
        want += [want[0] * c / d**i for i, c in enumerate(binom, start=1)] if d else []
        assert table[row, :6].tolist() == pytest.approx(want, rel=6e-8, abs=0.0), (row, d)
        assert table[row, 6:].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="multiple of BLOCK_N"):
        gluon_tapa_host.coefficient_table(256, 256, 64, 128, alpha, k_turn, torch.device("cpu"))


def _wgmma_register_cells(num_warps, n):
    """[threads, n / 2] (row, col) of each register of a [16 num_warps, n] fp32 wgmma accumulator
    tile (gluon_common.mma_layout), from Triton's own linear layout of it."""
    gluon_ir = pytest.importorskip("triton._C.libtriton.gluon_ir")
    from triton._C.libtriton import ir
    from triton.experimental.gluon import language as gl

    ctx = ir.context()
    ir.load_dialects(ctx)
    layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])
    builder = gluon_ir.GluonOpBuilder(ctx)
    ll = builder.to_linear_layout(layout._to_ir(builder), [16 * num_warps, n])

    def cell(bases, index):
        r = c = 0
        for bit, (dr, dc) in enumerate(bases):
            if index >> bit & 1:
                r, c = r ^ dr, c ^ dc
        return r, c

    cells = []
    for tid in range(32 * num_warps):
        lr, lc = cell(ll.lane_bases, tid % 32)
        wr, wc = cell(ll.warp_bases, tid // 32)
        cells.append([(lr ^ wr ^ rr, lc ^ wc ^ rc) for rr, rc in (cell(ll.reg_bases, k) for k in range(n // 2))])
    return cells


def _run_asm(asm, operands, regs):
    """Emulate the "diag" asm (fma.rn.f32 and mov.b32 on $n operands), each FMA rounded to fp32."""
    values = dict(enumerate(operands))
    for stmt in asm.strip("{} ").split(";"):
        if not stmt.strip():
            continue
        op, args = stmt.split(None, 1)
        n = [int(a.strip().lstrip("$")) for a in args.split(",")]
        if op == "fma.rn.f32":
            values[n[0]] = float(torch.tensor(values[n[1]] * values[n[2]] + values[n[3]], dtype=torch.float32))
        else:
            assert op == "mov.b32", op
            values[n[0]] = values[n[1]]
    return [values[k] for k in range(regs)]


@pytest.mark.parametrize("order", [3, 5])
@pytest.mark.parametrize("num_warps,n", [(4, 64), (8, 64), (8, 32)])   # the forward's, dQ's and dK/dV's tiles
@pytest.mark.parametrize("sign", [1, -1])   # dK/dV's transposed tiles: e a function of col - row
def test_diag_asm_evaluates_each_register_at_its_own_offset(order, num_warps, n, sign):
    """The "diag" variant's asm, emulated on every thread's registers placed as Triton's layout of
    the wgmma accumulator places them, gives each register the polynomial at its own in-tile
    offset e = +-(row - col), bit for bit as `_w_poly`'s Horner (same FMAs, fp32 rounding)."""
    regs = n // 2
    asm, constraints = gluon_tapa.diag_poly_asm(order, regs), gluon_tapa.diag_constraints(order, regs)
    assert constraints.count("=r") == regs and len(constraints.split(",")) == regs * (order + 3)
    coef = [0.75, -0.03125, 0.0078125, -0.0013, 2.5e-4, -4.1e-5][: order + 1]   # f, g_1 .. g_order
    for cells in _wgmma_register_cells(num_warps, n)[:: 13]:
        e = [float(sign * (r - c)) for r, c in cells]
        got = _run_asm(asm, [0.0] * regs + e + [g for g in coef for _ in range(regs)], regs)
        for k, ek in enumerate(e):
            w = coef[order]
            for g in reversed(coef[:order]):
                w = float(torch.tensor(w * ek + g, dtype=torch.float32))
            assert got[k] == w, (k, cells[k], got[k], w)


# ----------------------------------------------------------------------------- GPU


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _on_hopper(), reason="the Gluon TAPA forward needs an sm_90 GPU")
RATIO = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def make_inputs(B, H, G, T, S, D, dtype, seed=42, phase_std=1.0):
    gen = generator(seed, "cuda")
    q, k, v, do = (torch.randn(*shape, generator=gen, device="cuda")
                   for shape in ((B, H, T, D), (B, G, S, D), (B, G, S, D), (B, H, T, D)))
    q[..., D // 2:] *= phase_std  # scales |Phi| (the cosine's argument; MATH §4.5)
    return q.to(dtype), k.to(dtype), v.to(dtype), do.to(dtype)


def positions(T, S, offset=0):
    """Index positions (the T queries are the last T of the S keys) shifted by `offset`, int64."""
    pos_k = torch.arange(S, device="cuda", dtype=torch.int64)[None] + offset
    return torch.arange(S - T, S, device="cuda", dtype=torch.int64)[None] + offset, pos_k


def ref_out_lse(q, k, v, params, causal, offset=0):
    """float64 out and lse (log2 units, +inf for a row that sees no key) of the reference."""
    T, S = q.shape[2], k.shape[2]
    pos_q, pos_k = positions(T, S, offset)
    mod = ScoreMod(kind="tapa", params=params)
    q64, k64, v64 = q.double(), k.double(), v.double()
    out = reference.attention(q64, k64, v64, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0, causal=causal,
                              score_mod=mod, compute_dtype=torch.float64)
    logits = reference.logits(q64, k64, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0, score_mod=mod,
                              compute_dtype=torch.float64)
    if causal:
        logits = logits.masked_fill(~reference.visibility(pos_q, pos_k), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1) / LN2
    return out, torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


def gluon_forward(q, k, v, params, causal, tile=None, variants=None, programs=None):
    """out, lse of the Gluon kernel into NaN-poisoned buffers (a row it skips stays NaN and fails)."""
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    return gluon_tapa.gluon_tapa_fwd(q, k, v, causal=causal, out=out, lse=lse, tile=tile, variants=variants,
                                     programs=programs, **params)


def tl_config(params, D, causal):
    return {"d_amp": D // 2, "alpha": params.get("alpha", 0.1), "phase_scale": params.get("phase_scale", 2 * math.pi),
            "linear": params.get("phase", "quadratic") == "linear", "scale": 1.0, "causal": causal}


def check_forward(q, k, v, params, *, causal, tile=None, label="gluon-tapa", offset=0, variants=None, programs=None):
    T, S, D = q.shape[2], k.shape[2], q.shape[-1]
    out, lse = gluon_forward(q, k, v, params, causal, tile, variants, programs)
    ref, want = ref_out_lse(q, k, v, params, causal, offset)
    err = assert_close(f"{label}-out", ref, out, RATIO[q.dtype])
    empty = torch.isposinf(want)
    assert torch.equal(torch.isposinf(lse), empty) and not lse.isnan().any()
    assert (out[empty] == 0).all()
    if (~empty).any():
        assert_close(f"{label}-lse", want[~empty], lse[~empty], 1e-5)
    if T <= S:  # the tl forward's own error at the same dtype
        pos_q, pos_k = positions(T, S)
        tl_out, _ = triton_tapa.tapa_fwd(q, k, v, pos_q, pos_k, **tl_config(params, D, causal))
        tl_err = rel_rms(ref, tl_out)
        assert err <= 1.25 * tl_err + 1e-4, f"{label}: error {err:.3e} vs the tl forward's {tl_err:.3e}"
    return out, lse


CASES = [  # (B, H, G, T, S, D, causal, params, dtype)
    (2, 4, 4, 1, 1, 128, True, {}, torch.bfloat16),
    (1, 8, 2, 77, 77, 128, True, {"phase": "linear"}, torch.bfloat16),
    (1, 8, 2, 1000, 1000, 128, True, {}, torch.bfloat16),
    (1, 4, 4, 4099, 4099, 128, True, {"alpha": 0.5, "phase_scale": 1.0}, torch.float16),
    (2, 4, 2, 4099, 4099, 64, False, {}, torch.bfloat16),
    (1, 4, 2, 4099, 4099, 64, True, {}, torch.bfloat16),  # the 124M model's heads, every kind of block
    (1, 4, 4, 4099, 4099, 128, False, {"phase": "linear"}, torch.float16),
    (1, 4, 4, 100, 733, 128, True, {}, torch.bfloat16),
    (1, 8, 2, 1, 1000, 64, True, {"phase": "linear"}, torch.float16),
    (1, 4, 2, 77, 1000, 128, False, {"alpha": 1.0}, torch.float16),
    (1, 4, 4, 300, 77, 64, True, {}, torch.bfloat16),  # T > S: the first 223 rows see no key
    # no series; |m - n|^7.5 reaches 3e22 at these distances, so phase_scale keeps the phase
    # within a few turns, where fp32 (and float64) still resolve it
    (1, 4, 2, 1000, 1003, 128, True, {"alpha": 7.5, "phase_scale": 1e-21}, torch.bfloat16),
    (2, 16, 16, 1024, 1024, 128, True, {}, torch.bfloat16),
]


def _case_id(c):
    return shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5], causal=c[6], phase=c[7].get("phase", "quadratic"),
                    alpha=c[7].get("alpha", 0.1), dtype=c[8])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("tile", [(128, 64, 1, 8), (128, 64, 2, 8), (64, 64, 2, 4)], ids=["1-stage", "2-stage", "pair"])
def test_gluon_tapa_fws_smoke(tile):
    """The "fws" producer partition on a small causal launch (every ring slot reused several
    times; "pair": one consumer warpgroup under gluon_tapa_host.FWS_PAIR_REGS, two CTAs an SM): run
    this first, with a short timeout, where a handshake could hang."""
    q, k, v, _ = make_inputs(1, 2, 1, 700, 700, 128, torch.bfloat16)
    check_forward(q, k, v, {}, causal=True, tile=tile, variants={"order3", "fws"},
                  label=f"gluon-tapa-fws-{'x'.join(map(str, tile))}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("programs", [1, 3, None], ids=["1-program", "3-programs", "default-grid"])
@pytest.mark.parametrize("B,H,G,T,S,D,causal", [(1, 2, 1, 700, 700, 128, True), (2, 3, 1, 333, 333, 128, True),
                                                (1, 2, 2, 130, 400, 64, False), (1, 2, 1, 300, 4099, 128, True),
                                                (1, 2, 1, 4099, 300, 64, True)],
                         ids=["700", "ragged", "nocausal", "T<S", "T>S"])
def test_gluon_tapa_pingpong_smoke(B, H, G, T, S, D, causal, programs):
    """The "pingpong" kernel's two consumer warpgroups, their turns, the shared rings and the Q
    buffers on small launches, with one program running every item (each ring slot, Q buffer and
    turn barrier reused across items of every length), three, and the default grid: 6 items a
    head (the last one's second query block has rows only past T), 3 (each item's second block
    one key block more than its first), every key block shared (non-causal), T < S and T > S.
    Run this first, with a short timeout, where a handshake could hang."""
    q, k, v, _ = make_inputs(B, H, G, T, S, D, torch.bfloat16)
    check_forward(q, k, v, {}, causal=causal, variants={"order3", "pingpong"}, programs=programs,
                  label=f"gluon-tapa-pingpong-{T}-{programs}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("variants", [frozenset({"order3", "interleave"}), frozenset({"order3", "fws", "interleave"}),
                                      None], ids=["interleave", "fws+interleave", "default"])
@pytest.mark.parametrize("B,H,G,T,S,D,causal", [(2, 3, 1, 333, 333, 128, True), (3, 3, 3, 1000, 1000, 64, True),
                                                (1, 5, 1, 130, 130, 128, False), (1, 1, 1, 700, 700, 64, True)],
                         ids=["BH6-D128", "BH9-D64", "BH5-nocausal", "BH1"])
def test_gluon_tapa_interleaved_heads_cover_every_block(B, H, G, T, S, D, causal, variants):
    """"interleave" where B*H is not a multiple of INTERLEAVE_HEADS (6, 9 and 5 heads: a last
    group of 2, 1 and 1) and with one head alone: every query block of every head runs once, at
    its own rows (out and lse poisoned, against float64)."""
    q, k, v, _ = make_inputs(B, H, G, T, S, D, torch.bfloat16)
    check_forward(q, k, v, {}, causal=causal, variants=variants, label=f"gluon-tapa-interleave-B{B}H{H}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("kernel", ["persistent", "pingpong"])
@pytest.mark.parametrize("programs", [1, 3, None], ids=["1-program", "3-programs", "default-grid"])
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", CASES, ids=[_case_id(c) for c in CASES])
def test_gluon_tapa_persistent_matches_float64(B, H, G, T, S, D, causal, params, dtype, programs, kernel):
    """The persistent kernels ("persistent", "pingpong"): one program running every item (each
    ring slot and Q buffer reused across items of every length, hi = 1 among them), three, and
    the default grid."""
    q, k, v, _ = make_inputs(B, H, G, T, S, D, dtype)
    variants = gluon_tapa_host.DEFAULT_VARIANTS[D] | {kernel}
    check_forward(q, k, v, params, causal=causal, variants=variants, programs=programs,
                  label=f"gluon-tapa-{kernel}-{programs}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", CASES, ids=[_case_id(c) for c in CASES])
def test_gluon_tapa_forward_matches_float64(B, H, G, T, S, D, causal, params, dtype):
    q, k, v, _ = make_inputs(B, H, G, T, S, D, dtype)
    check_forward(q, k, v, params, causal=causal)


TILES = [(64, 64, 2, 4), (64, 64, 1, 4), (64, 64, 3, 4), (128, 64, 2, 8)]
# lengths past r_3 (1344 for alpha 0.1 at 64 x 64), so that every kind of block runs: third- and
# fifth-order series, the table or the exact power near the diagonal, the masked blocks
VARIANT_SETS = [frozenset(), frozenset({"table"}), frozenset({"order3"}), frozenset({"table", "order3"}),
                frozenset({"order3", "coef"}), frozenset({"order3", "lazy"}), frozenset({"order3", "diag"}),
                frozenset({"coef", "lazy", "diag"}), frozenset({"order3", "coef", "lazy", "diag"}),
                frozenset({"order3", "fws"}), frozenset({"order3", "coef", "lazy", "diag", "fws"}),
                frozenset({"order3", "coef", "lazy", "diag", "occupancy"}),
                frozenset({"order3", "coef", "lazy", "diag", "table"}),
                frozenset({"order3", "coef", "lazy", "diag", "persistent"}),
                frozenset({"order3", "coef", "lazy", "diag", "occupancy", "persistent"}),
                frozenset({"order3", "interleave"}), frozenset({"order3", "fws", "interleave"}),
                frozenset({"order3", "coef", "lazy", "diag", "table", "pingpong", "interleave"})]
VARIANT_CASES = [
    (1, 4, 2, 4099, 4099, 128, True, {}, torch.bfloat16),
    (1, 4, 4, 4099, 4099, 64, False, {"phase": "linear"}, torch.float16),
    (1, 4, 2, 300, 4099, 128, True, {"alpha": 0.5}, torch.bfloat16),  # T < S
    (1, 4, 2, 4099, 300, 64, True, {}, torch.bfloat16),  # T > S
    # r_3 = 1575 here; phase_scale keeps |W S_P| (W ~ d^2.5, 1e9 at 4099) within a few turns
    (1, 4, 2, 3001, 3001, 128, False, {"alpha": 2.5, "phase_scale": 1e-8}, torch.bfloat16),
]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("variants", VARIANT_SETS, ids=["+".join(sorted(v)) or "none" for v in VARIANT_SETS])
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", VARIANT_CASES, ids=[_case_id(c) for c in VARIANT_CASES])
def test_gluon_tapa_variants_match_float64(B, H, G, T, S, D, causal, params, dtype, variants):
    q, k, v, _ = make_inputs(B, H, G, T, S, D, dtype)
    check_forward(q, k, v, params, causal=causal, variants=variants, label=f"gluon-tapa-{'+'.join(sorted(variants))}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("variants", [None, frozenset({"order3", "coef", "lazy", "diag"}),
                                      frozenset({"order3", "coef", "lazy", "diag", "fws"}),
                                      frozenset({"order3", "coef", "lazy", "diag", "persistent"})],
                         ids=["default", "coef+lazy+diag", "coef+lazy+diag+fws", "coef+lazy+diag+persistent"])
@pytest.mark.parametrize("tile", TILES, ids=["x".join(map(str, t)) for t in TILES])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("phase_kind", ["quadratic", "linear"])
def test_gluon_tapa_every_tile(tile, D, phase_kind, variants):
    q, k, v, _ = make_inputs(1, 8, 2, 1000, 1003, D, torch.bfloat16)
    check_forward(q, k, v, {"phase": phase_kind}, causal=True, tile=tile, variants=variants,
                  label=f"gluon-tapa-{'x'.join(map(str, tile))}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("coef", [False, True], ids=["in-kernel", "coef"])
@pytest.mark.parametrize("tile", [(64, 64, 2, 4), (128, 64, 2, 8)], ids=["64x64x2x4", "128x64x2x8"])
@pytest.mark.parametrize("D,phase_kind", [(128, "quadratic"), (64, "quadratic"), (128, "linear")])
def test_gluon_tapa_diag_is_bitwise_the_series(D, phase_kind, tile, coef):
    """The "diag" schedule evaluates the same FMAs once per diagonal (`diag_poly_asm`): out and lse
    are bitwise those without it, over lengths whose tiles take both series orders."""
    q, k, v, _ = make_inputs(1, 4, 2, 3000, 3000, D, torch.bfloat16)
    base = {"order3", "coef"} if coef else {"order3"}
    (out, lse), (out_d, lse_d) = (gluon_forward(q, k, v, {"phase": phase_kind}, True, tile, var)
                                  for var in (base, base | {"diag"}))
    assert torch.equal(out, out_d) and torch.equal(lse, lse_d)


def _lazy_reference_updates(q, k, params, block_n=64):
    """[B, H, T] bool: rows whose reference max, kept as the "lazy" softmax keeps it (replaced only
    by a key block's max above it by more than 8 in log2 units), is replaced after block 0."""
    T, S = q.shape[2], k.shape[2]
    pos_q, pos_k = positions(T, S)
    logits = reference.logits(q.double(), k.double(), pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0,
                              score_mod=ScoreMod(kind="tapa", params=params), compute_dtype=torch.float64)
    logits = logits.masked_fill(~reference.visibility(pos_q, pos_k), float("-inf")) / LN2
    blocks = torch.nn.functional.pad(logits, (0, -S % block_n), value=float("-inf"))
    blocks = blocks.unflatten(-1, (-1, block_n)).amax(-1)
    ref, updated = blocks[..., 0], torch.zeros_like(blocks[..., 0], dtype=torch.bool)
    for j in range(1, blocks.shape[-1]):
        up = blocks[..., j] > ref + 8
        ref, updated = torch.where(up, blocks[..., j], ref), updated | up
    return updated


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("D", [64, 128])
def test_gluon_tapa_lazy_rescale_as_logits_grow(D):
    """Keys whose amplitude halves grow eightfold along the sequence raise the row maxima block
    after block: the "lazy" variant's reference max is replaced (O rescaled) in some rows and
    kept (the rescale skipped) in others of one launch, and its out and lse stay as close to
    float64 as the tl forward's."""
    T = S = 2048
    q, k, v, _ = make_inputs(1, 4, 2, T, S, D, torch.bfloat16)
    growth = torch.linspace(1.0, 8.0, S, device="cuda")[:, None]
    k[..., : D // 2] = (k[..., : D // 2].float() * growth).to(k.dtype)
    updated = _lazy_reference_updates(q, k, {})
    assert 0.05 < updated.float().mean().item() < 0.95, updated.float().mean().item()
    check_forward(q, k, v, {}, causal=True, variants={"order3", "lazy"}, label=f"gluon-tapa-lazy-D{D}")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("offset", [2**24 + 7, 2**31 - 100, 2**50 + 3])
def test_gluon_tapa_large_absolute_offsets(offset):
    """The kernel takes no positions (index-only); the reference at absolute positions offset by
    `offset` (int64, beyond fp32's integers) gives the same out and lse: TAPA sees only |m - n|."""
    q, k, v, _ = make_inputs(1, 4, 2, 300, 1000, 128, torch.bfloat16)
    check_forward(q, k, v, {"alpha": 0.5}, causal=True, offset=offset, label=f"gluon-tapa-offset{offset}")


@pytest.mark.gpu
@hopper
def test_gluon_tapa_large_phase():
    """|w Phi| in the hundreds (MATH §7.4): the range reduction in turns keeps the kernel as close
    to float64 as the tl forward."""
    q, k, v, _ = make_inputs(1, 4, 2, 700, 700, 128, torch.bfloat16, phase_std=10.0)
    check_forward(q, k, v, {}, causal=True, label="gluon-tapa-bigphase")


def _chunked_reference(q, k, v, params, chunk=2**20):
    """float64 out, lse (log2) of causal index-position TAPA over a long S, key chunk by chunk."""
    T, S = q.shape[2], k.shape[2]
    pos_q, _ = positions(T, S)
    lses, parts = [], []
    for s0 in range(0, S, chunk):
        pos_k = torch.arange(s0, min(S, s0 + chunk), device="cuda")[None]
        kc = reference.repeat_kv(k[:, :, s0:s0 + chunk].double(), q.shape[1])
        logit = tapa_scores(q.double(), kc, pos_q, pos_k, ScoreMod(kind="tapa", params=params).params, torch.float64)
        logit = logit.masked_fill(~reference.visibility(pos_q, pos_k), float("-inf"))
        lses.append(torch.logsumexp(logit, -1))
        parts.append((logit, s0))
    lse = torch.logsumexp(torch.stack(lses), 0)
    out = sum(torch.exp(lg - lse[..., None]) @ reference.repeat_kv(v[:, :, s0:s0 + chunk].double(), q.shape[1])
              for lg, s0 in parts)
    return out, lse / LN2


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("variants", [frozenset(), frozenset({"order3"}), frozenset({"order3", "coef", "diag"})],
                         ids=["fifth-order", "order3", "order3+coef+diag"])
def test_gluon_tapa_series_holds_its_bound_at_large_phases(variants, monkeypatch):
    """The phase halves in {-1, 0, 1} (S_P exact in fp32) and phase_scale 5000 put |W S_P| near a
    thousand turns, so a relative error e of W moves the phase by ~1000 e turns: each schedule's
    series (tail below 1.4e-7 of W) keeps fp16 outputs near float64, and the third order taken at
    r_min instead (its tail ~8e-6 at the tile's edge) is measurably further away: on the H200
    3.07e-4 against 5.86e-4 (with r_3 = r_min both schedules ran the latter)."""
    B, H, G, N, D = 1, 4, 2, 2048, 128   # T = S = N
    gen = generator(7, "cuda")
    q, k, v = (torch.randn(B, n, N, D, generator=gen, device="cuda") for n in (H, G, G))
    for t in (q, k):
        t[..., D // 2:] = torch.randint(-1, 2, t[..., D // 2:].shape, generator=gen, device="cuda").float()
    q, k, v = q.half(), k.half(), v.half()
    params = {"alpha": 0.1, "phase_scale": 5000.0}
    ref, _ = ref_out_lse(q, k, v, params, True)
    err = rel_rms(ref, gluon_forward(q, k, v, params, True, variants=variants)[0])
    monkeypatch.setattr(gluon_tapa_host, "order3_radius", lambda alpha, bm, bn, r_min: r_min)
    monkeypatch.setattr(gluon_tapa, "_PLANS", {})   # a plan made before the patch would keep the old r_3
    err_3 = rel_rms(ref, gluon_forward(q, k, v, params, True, variants={"order3"})[0])
    assert err <= 1e-3 and err_3 >= 1.5 * err, f"series {err:.3e}, third order from r_min {err_3:.3e}"


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("variants", [None, frozenset({"table", "order3"}),
                                      frozenset({"order3", "coef", "lazy", "diag"})],
                         ids=["default", "table+order3", "order3+coef+lazy+diag"])
def test_gluon_tapa_distances_beyond_fp32_integers(variants):
    """S = 2**24 + 77 keys, the last 3 as queries: distances up to 2**24 + 76, where fp32 stops
    holding every integer, are subtracted in int32 and converted once; far tiles take the series
    at central distances near 2**24. Against a chunked float64 reference."""
    S, params = 2**24 + 77, {"alpha": 0.5}
    q, k, v, _ = make_inputs(1, 2, 1, 3, S, 64, torch.bfloat16)
    out, lse = gluon_forward(q, k, v, params, True, variants=variants)
    ref, want = _chunked_reference(q, k, v, params)
    tl_out, tl_lse = triton_tapa.tapa_fwd(q, k, v, *positions(3, S), **tl_config(params, 64, True))
    for name, r, g, t in (("out", ref, out, tl_out), ("lse", want, lse, tl_lse)):
        err, tl_err = rel_rms(r, g), rel_rms(r, t)   # no further from float64 than the tl forward
        assert torch.isfinite(g).all() and err <= 1.25 * tl_err + 1e-4, f"{name}: {err:.3e} vs tl {tl_err:.3e}"


BWD_CASES = [(1, 8, 2, 1000, 1000, 128, True, {}, torch.bfloat16),
             (1, 4, 4, 77, 300, 128, True, {"phase": "linear"}, torch.float16),
             (1, 4, 2, 513, 513, 64, False, {"alpha": 0.5}, torch.bfloat16)]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("B,H,G,T,S,D,causal,params,dtype", BWD_CASES, ids=[_case_id(c) for c in BWD_CASES])
def test_gluon_tapa_lse_feeds_tl_backward(B, H, G, T, S, D, causal, params, dtype):
    """triton_tapa.tapa_bwd on the Gluon forward's (out, lse) gives the tl path's gradients: within
    bf16/fp16 rounding of them, and no further from float64 than they are."""
    q, k, v, do = make_inputs(B, H, G, T, S, D, dtype)
    pos_q, pos_k = positions(T, S)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    reference.attention(*leaves, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0, causal=causal,
                        score_mod=ScoreMod(kind="tapa", params=params),
                        compute_dtype=torch.float64).backward(do.double())
    cfg = tl_config(params, D, causal)
    g_out, g_lse = gluon_forward(q, k, v, params, causal)
    t_out, t_lse = triton_tapa.tapa_fwd(q, k, v, pos_q, pos_k, **cfg)
    grads_gluon = triton_tapa.tapa_bwd(do, q, k, v, g_out, g_lse, pos_q, pos_k, **cfg)
    grads_tl = triton_tapa.tapa_bwd(do, q, k, v, t_out, t_lse, pos_q, pos_k, **cfg)
    # the Gluon lse is within 1e-5 of float64 (check_forward); the tl one differed from it by
    # 4.2e-5 and 5.1e-5 relative RMS on these cases on the H200
    assert_close("gluon-vs-tl-lse", t_lse, g_lse, 1e-4)
    for name, ref, g, t in zip(("dq", "dk", "dv"), (x.grad for x in leaves), grads_gluon, grads_tl):
        assert_close(f"gluon-vs-tl-{name}", t.float(), g.float(), RATIO[dtype])
        err, tl_err = rel_rms(ref, g), rel_rms(ref, t)
        assert err <= 1.25 * tl_err + 1e-4, f"{name}: error {err:.3e} vs the tl path's {tl_err:.3e}"


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("D,T", [(128, 1000), (64, 77)])
def test_gluon_tapa_cached_launch_matches_float64(D, T, monkeypatch):
    """A launch like an earlier one runs from gluon_common.launch's cache (no new entry) with the
    earlier one's plan (gluon_tapa._PLANS, no new entry): its result on new inputs matches float64
    as the first launch's does; another alpha takes a new plan."""
    monkeypatch.setattr(gluon_tapa, "_PLANS", {})   # counted from empty: a full cache would be cleared
    for seed in (1, 2):
        q, k, v, _ = make_inputs(1, 4, 2, T, T, D, torch.bfloat16, seed=seed)
        entries, plans = len(gluon_tapa.gluon_common._LAUNCHES), len(gluon_tapa._PLANS)
        check_forward(q, k, v, {}, causal=True, label=f"gluon-tapa-launch-{seed}")
        if seed == 2:
            assert len(gluon_tapa.gluon_common._LAUNCHES) == entries, "the second launch was not a cache hit"
            assert len(gluon_tapa._PLANS) == plans, "the second launch computed its plan again"
    check_forward(q, k, v, {"alpha": 0.3}, causal=True, label="gluon-tapa-launch-alpha")
    assert len(gluon_tapa._PLANS) == plans + 1
