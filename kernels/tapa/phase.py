"""TAPA's per-tile math inside the fused kernels (tapa/triton_tapa.py; MATH §4.2, §7.5): the
distance weight |m - n|^alpha, exact by lg2/ex2 on the special-function unit or, for forward
tiles away from the diagonal, a per-row exact power times a binomial series in the in-tile offset
on the FMA pipe; the score tile (`_tapa_score`) and its gradients (`_tapa_grads`).
Tests: tests/kernels/tapa/test_triton_tapa.py (`_tapa_turns` against float64, the series' tail bound).
"""

from __future__ import annotations

import triton
import triton.language as tl

from phaselab.kernels.common.triton_common import _cos_sin_reduced, _exp2_tile, _log2, _rint

# The off-diagonal binomial series runs in the forward only (the SERIES constexpr of
# `_tapa_score`, `AttentionOptions.tapa_series`): on the H200 it made the forward 3-8 % faster and
# the backward (fwd+bwd minus fwd) 16-21 % slower (kernels/attention/README.md, "Measured and not
# shipped").


# fp32 holds every integer of magnitude <= 2**24 exactly, so the difference of two such values is
# the correctly rounded |m - n| (exact below 2**24)
_EXACT_F32 = tl.constexpr(2**24)


@triton.jit
def _dist_pow(pq, pk, pq_i, pk_i, fits, alpha, FAST: tl.constexpr):
    """|m - n|^alpha [BM, BN] in fp32 by exp2(alpha log2 d), 0 on the diagonal (0^alpha = 0).

    pq_i, pk_i are int64 positions relative to the tile's base, pq, pk the same in fp32. Where the
    tile `fits` (every relative position within 2**24, exact in fp32) the distance is one fp32
    subtraction; otherwise it is subtracted in int64 and converted once, so |m - n| is always the
    correctly rounded distance, as in the reference's int64 subtraction (MATH §7.2, §7.5).
    """
    if fits:
        d = tl.abs(pq[:, None] - pk[None, :])
    else:
        d = tl.abs(pq_i[:, None] - pk_i[None, :]).to(tl.float32)
    pw = tl.exp2(alpha * _log2(tl.maximum(d, 1.0), FAST))
    return tl.where(d > 0.0, pw, 0.0)


@triton.jit
def _tapa_turns(b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                MASKED: tl.constexpr, SERIES: tl.constexpr, FAST: tl.constexpr):
    """W [BM, BN] = k_turn |m - n|^alpha: the phase weight in turns (cycles) per unit of <q_P, k_P>.

    Positions (int64 [BM], [BN]) and the tile's position ranges [q_lo, q_hi], [k_lo, k_hi] (int64
    scalars: block ends of sorted positions, or a once-per-program reduction: a reduction per tile
    costs a barrier, measured slower on the H200) are taken relative to the key block's first
    position k_lo in int64 before any conversion, so absolute positions of any size (beyond 2**24,
    where fp32 stops holding every integer) give exact distances. The ranges bound every relative
    position when they are the extremes; callers pass u_max < 0 when they may not be (unsorted
    positions), and such tiles, like tiles spanning more than 2**24 positions, subtract in int64.

    Unmasked tiles try the series: write m - n = R_i + e_j with R_i = m_i - n_c and e_j = n_c - n_j
    about the tile's key centre n_c. If every |e_j| <= u_max |R_i| (one sign of R),
    |m - n|^alpha = |R_i|^alpha (1 + u)^alpha with u = e_j / R_i, and the binomial series to u^5
    (c_k = binom(alpha, k), host-chosen u_max keeps the tail < 1.4e-7 relative, `_taylor`) costs
    6 FMA-pipe ops per score instead of lg2 + ex2 on the special-function unit, this kernel's
    busiest pipe (42 % in the forward at 16k, Nsight Compute, benchmarks/results/ncu/tapa-16k.csv).
    Per-row |R_i|^alpha stays exact. Other tiles (near the diagonal, a key block that spans too
    many positions, masked tiles) take the exact path.
    """
    pq_i = b_pq - k_lo
    pk_i = b_pk - k_lo
    pq = pq_i.to(tl.float32)
    pk = pk_i.to(tl.float32)
    fits = (u_max >= 0.0) & (tl.maximum(q_hi, k_hi) - k_lo <= _EXACT_F32) & (k_lo - q_lo <= _EXACT_F32)
    if MASKED:
        w = k_turn * _dist_pow(pq, pk, pq_i, pk_i, fits, alpha, FAST)
    elif SERIES:
        n_c = 0.5 * (k_hi - k_lo).to(tl.float32)  # a half-integer below 2**23 where the tile fits: exact
        r = pq - n_c
        r_lo = (q_lo - k_lo).to(tl.float32) - n_c
        r_hi = (q_hi - k_lo).to(tl.float32) - n_c
        one_sign = ((r_lo > 0.0) | (r_hi < 0.0)) & fits  # fits needs u_max >= 0: ends are extremes
        if one_sign & (n_c <= u_max * tl.minimum(tl.abs(r_lo), tl.abs(r_hi))):
            f = k_turn * tl.exp2(alpha * _log2(tl.abs(r), FAST))  # [BM]
            # [BN] x [BM] -> [BM, BN]
            u = (n_c - pk)[None, :] * (1.0 / r)[:, None]
            p = c5 * u + c4
            p = p * u + c3
            p = p * u + c2
            p = p * u + c1
            p = p * u + 1.0
            w = f[:, None] * p
        else:
            w = k_turn * _dist_pow(pq, pk, pq_i, pk_i, fits, alpha, FAST)
    else:
        w = k_turn * _dist_pow(pq, pk, pq_i, pk_i, fits, alpha, FAST)
    return w


@triton.jit
def _block_pos(p_pos, start, BLOCK: tl.constexpr, L, MASKED: tl.constexpr):
    """(pos [BLOCK], lo, hi) of positions p_pos[start : start + BLOCK], int64: lo, hi are the first
    and the last valid position (the extremes when positions are sorted). In masked blocks the
    rows past L read lo, so their distances are those of a valid row: a padding position far from
    the tile could overflow W to inf, and 0 * inf would put NaN into a masked gradient."""
    o = start + tl.arange(0, BLOCK)
    m = o < L
    lo = tl.load(p_pos + start)
    hi = tl.load(p_pos + tl.minimum(start + BLOCK - 1, L - 1))
    pos = tl.load(p_pos + o, mask=m, other=0)
    if MASKED:
        pos = tl.where(m, pos, lo)
    return pos, lo, hi


@triton.jit
def _row_range(b_pos, m_r, srt, u_max):
    """(lo, hi, u, pos) of a program's own block of positions, once per program: masked rows take
    the block's smallest valid position; lo, hi int64; u = u_max where the other side's positions
    are sorted, else -1 (block ends are then not extremes: the series is never taken and
    distances are subtracted in int64)."""
    lowest = tl.min(tl.where(m_r, b_pos, 2**62), 0)
    pos = tl.where(m_r, b_pos, lowest)
    return tl.min(pos, 0), tl.max(pos, 0), tl.where(srt, u_max, -1.0), pos


def series_radius(alpha: float, order: int = 5) -> float:
    """The radius u_max of the binomial series of (1 + u)^alpha to `order` (terms c_0 .. c_order,
    c_k = binom(alpha, k)): its tail sum_{k>order} |c_k| u^k stays below 1.4e-7 (relative, about
    one fp32 ulp) for |u| <= u_max. For alpha <= 6 and order >= 3 the ratio |c_{k+1} / c_k| =
    |alpha - k| / (k + 1) is <= 1 past the order, so the tail is <= |c_{order+1}| u^{order+1} / (1 - u);
    u_max <= 0.25, and 0.25 where the series is exact (alpha an integer <= order). Larger alpha gets
    u_max = 0 (the exact path everywhere but for a key block of one position)."""
    c = 1.0
    for k in range(1, order + 2):
        c *= (alpha - k + 1) / k
    if alpha > 6.0:
        return 0.0
    if c == 0.0:
        return 0.25
    return min(0.25, (1e-7 / abs(c)) ** (1.0 / (order + 1)))


def _taylor(alpha: float) -> tuple[float, ...]:
    """(u_max, c_1 ... c_5) of `_tapa_turns`: c_k = binom(alpha, k), u_max = `series_radius(alpha, 5)`."""
    c = [1.0]
    for k in range(1, 6):
        c.append(c[-1] * (alpha - k + 1) / k)
    return (series_radius(alpha, 5), *c[1:6])


@triton.jit
def _tapa_score(b_qa, b_qp, sq, b_ka, b_kp, sk, b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn, u_max,
                c1, c2, c3, c4, c5,
                LINEAR: tl.constexpr, MASKED: tl.constexpr, SERIES: tl.constexpr, FAST: tl.constexpr,
                DOT_PREC: tl.constexpr):
    """(<q_A, k_A>, W, cos 2 pi t, sin 2 pi t), all [BM, BN] fp32, t = W <q_P, k_P> (quadratic) or
    W (sum q_P + sum k_P) (linear): the phase in turns, so the range reduction is t - rint(t),
    exact in fp32 (MATH §7.4), then one multiply by 2 pi into [-pi, pi]."""
    # [BM, BA] @ [BA, BN] -> [BM, BN]
    b_a = tl.dot(b_qa, tl.trans(b_ka), input_precision=DOT_PREC)
    if LINEAR:
        b_phi = sq[:, None] + sk[None, :]
    else:
        # [BM, BP] @ [BP, BN] -> [BM, BN]
        b_phi = tl.dot(b_qp, tl.trans(b_kp), input_precision=DOT_PREC)
    w = _tapa_turns(b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn, u_max, c1, c2, c3, c4, c5, MASKED,
                    SERIES, FAST)
    t = w * b_phi
    c, s = _cos_sin_reduced((t - _rint(t, FAST)) * 6.283185307179586, FAST)
    return b_a, w, c, s


@triton.jit
def _tapa_grads(b_qa, b_qp, sq, b_ka, b_kp, sk, b_v, b_do, b_lse, b_dlt, b_pq, b_pk, q_lo, q_hi, k_lo, k_hi,
                vis, c_a, alpha, k_turn,
                u_max, c1, c2, c3, c4, c5, sm_scale, qk_scale, LINEAR: tl.constexpr, MASKED: tl.constexpr,
                FAST: tl.constexpr, DOT_PREC: tl.constexpr, EXP2: tl.constexpr):
    """Recompute P [BM, BN] and return (P, gA, gP): d loss / d <q_A,k_A> and / d <q_P,k_P> (or the
    linear phase's sums), each already multiplied by its 1/sqrt(D_x)."""
    b_a, w, c, s = _tapa_score(b_qa, b_qp, sq, b_ka, b_kp, sk, b_pq, b_pk, q_lo, q_hi, k_lo, k_hi,
                               alpha, k_turn, u_max,
                               c1, c2, c3, c4, c5, LINEAR, MASKED, False, FAST, DOT_PREC)
    b_p = _exp2_tile(b_a * c * (c_a * qk_scale) - b_lse[:, None], EXP2)
    if MASKED:
        b_p = tl.where(vis, b_p, 0.0)
    # [BM, BV] @ [BV, BN] -> [BM, BN]
    b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
    b_ds = b_p * (b_dp - b_dlt[:, None]) * sm_scale  # d loss / d (A cos(2 pi t))
    g_a = b_ds * c * c_a
    # d (A cos 2 pi t) / d <q_P, k_P> = -A sin(2 pi t) 2 pi W, A = c_a <q_A, k_A>
    g_p = b_ds * b_a * w * s * (-6.283185307179586 * c_a)
    return b_p, g_a, g_p
