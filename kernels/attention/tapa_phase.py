"""TAPA's per-tile math inside the fused kernels (triton_tapa.py; MATH §4.2, §7.5): the
distance weight |m - n|^alpha, exact by lg2/ex2 on the special-function unit or, for forward
tiles away from the diagonal, a per-row exact power times a binomial series in the in-tile offset
on the FMA pipe; the score tile (`_tapa_score`) and its gradients (`_tapa_grads`).
Tests: tests/kernels/test_triton_tapa.py (`_tapa_turns` against float64, the series' tail bound).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from phaselab.kernels.attention.triton_common import EXP2_MODE, _cos_sin_reduced, _exp2_tile, _log2, _rint

# The off-diagonal binomial series runs in the forward only: on the H200 it made the forward 3-8 %
# faster and the backward (fwd+bwd minus fwd) 16-21 % slower (kernels/attention/README.md,
# "Measured and not shipped").
# PHASELAB_TAPA_SERIES=0 switches it off (read at import, for A/B timing in benchmarks/attention.py).
FWD_SERIES = tl.constexpr(os.environ.get("PHASELAB_TAPA_SERIES", "1") != "0")


@triton.jit
def _dist_pow(pq, pk, alpha, FAST: tl.constexpr):
    """|m - n|^alpha [BM, BN] in fp32 by exp2(alpha log2 d), 0 on the diagonal (0^alpha = 0).

    pq, pk are fp32 positions (exact below 2**24, as in every phaselab angle), so the difference
    of two exact integers is exact.
    """
    d = tl.abs(pq[:, None] - pk[None, :])
    pw = tl.exp2(alpha * _log2(tl.maximum(d, 1.0), FAST))
    return tl.where(d > 0.0, pw, 0.0)


@triton.jit
def _tapa_turns(b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                MASKED: tl.constexpr, SERIES: tl.constexpr, FAST: tl.constexpr):
    """W [BM, BN] = k_turn |m - n|^alpha: the phase weight in turns (cycles) per unit of <q_P, k_P>.

    Unmasked tiles try the series: write m - n = R_i + e_j with R_i = m_i - n_c and e_j = n_c - n_j
    about the tile's key centre n_c. The tile's position ranges [q_lo, q_hi], [k_lo, k_hi] come in
    as fp32 scalars (block ends of sorted positions, or a once-per-program reduction: a reduction
    per tile costs a barrier, measured slower on the H200); callers pass u_max < 0 when the ends
    are not the extremes (unsorted positions). If every |e_j| <= u_max |R_i| (one sign of R),
    |m - n|^alpha = |R_i|^alpha (1 + u)^alpha with u = e_j / R_i, and the binomial series to u^5
    (c_k = binom(alpha, k), host-chosen u_max keeps the tail < 1.4e-7 relative, `_taylor`) costs
    6 FMA-pipe ops per score instead of lg2 + ex2 on the special-function unit, this kernel's
    busiest pipe (42 % in the forward at 16k, Nsight Compute, benchmarks/results/ncu/tapa-16k.csv).
    Per-row |R_i|^alpha stays exact. Other tiles (near the diagonal, a key block that spans too
    many positions, padding rows read as position 0) take the exact path.
    """
    pq = b_pq.to(tl.float32)
    pk = b_pk.to(tl.float32)
    if MASKED:
        w = k_turn * _dist_pow(pq, pk, alpha, FAST)
    elif SERIES:
        n_c = 0.5 * (k_lo + k_hi)  # a half-integer: exact in fp32
        r = pq - n_c
        r_lo = q_lo - n_c
        r_hi = q_hi - n_c
        one_sign = ((r_lo > 0.0) | (r_hi < 0.0)) & (u_max >= 0.0)  # u_max < 0: ends may be unordered
        if one_sign & (0.5 * (k_hi - k_lo) <= u_max * tl.minimum(tl.abs(r_lo), tl.abs(r_hi))):
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
            w = k_turn * _dist_pow(pq, pk, alpha, FAST)
    else:
        w = k_turn * _dist_pow(pq, pk, alpha, FAST)
    return w


@triton.jit
def _block_ends(p_pos, start, BLOCK: tl.constexpr, L):
    """(pos[start], pos[start + BLOCK - 1]) as fp32 scalars (0 past the end, i.e. masked blocks,
    which take the exact path anyway): the extremes of a block of sorted positions."""
    lo = tl.load(p_pos + start, mask=start < L, other=0)
    hi = tl.load(p_pos + start + BLOCK - 1, mask=start + BLOCK - 1 < L, other=0)
    return lo.to(tl.float32), hi.to(tl.float32)


@triton.jit
def _row_range(b_pos, m_r, srt, u_max):
    """(lo, hi, u, pos) of a program's own block of positions, once per program: masked rows take
    the block's smallest valid position; u = u_max where the other side's positions are sorted,
    else -1 (block ends are then not extremes: the series is never taken)."""
    lowest = tl.min(tl.where(m_r, b_pos, 2**62), 0)
    pos = tl.where(m_r, b_pos, lowest)
    return (tl.min(pos, 0).to(tl.float32), tl.max(pos, 0).to(tl.float32), tl.where(srt, u_max, -1.0),
            pos)


def _taylor(alpha: float) -> tuple[float, ...]:
    """(u_max, c_1 ... c_5) of `_tapa_turns`: c_k = binom(alpha, k); u_max such that the series'
    tail sum_{k>=6} |c_k| u^k stays below 1.4e-7 (relative, about one fp32 ulp): for alpha <= 6
    the ratio |c_{k+1} / c_k| = |alpha - k| / (k + 1) is <= 1, so the tail is <= |c_6| u^6 / (1 - u).
    Larger alpha gets u_max = 0 (exact path everywhere but for a key block of one position)."""
    c = [1.0]
    for k in range(1, 7):
        c.append(c[-1] * (alpha - k + 1) / k)
    if alpha > 6.0:
        u_max = 0.0
    elif c[6] == 0.0:  # alpha in {1, ..., 5}: the series is exact
        u_max = 0.25
    else:
        u_max = min(0.25, (1e-7 / abs(c[6])) ** (1.0 / 6.0))
    return (u_max, *c[1:6])


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
                FAST: tl.constexpr, DOT_PREC: tl.constexpr):
    """Recompute P [BM, BN] and return (P, gA, gP): d loss / d <q_A,k_A> and / d <q_P,k_P> (or the
    linear phase's sums), each already multiplied by its 1/sqrt(D_x)."""
    b_a, w, c, s = _tapa_score(b_qa, b_qp, sq, b_ka, b_kp, sk, b_pq, b_pk, q_lo, q_hi, k_lo, k_hi,
                               alpha, k_turn, u_max,
                               c1, c2, c3, c4, c5, LINEAR, MASKED, False, FAST, DOT_PREC)
    b_p = _exp2_tile(b_a * c * (c_a * qk_scale) - b_lse[:, None], EXP2_MODE)
    if MASKED:
        b_p = tl.where(vis, b_p, 0.0)
    # [BM, BV] @ [BV, BN] -> [BM, BN]
    b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
    b_ds = b_p * (b_dp - b_dlt[:, None]) * sm_scale  # d loss / d (A cos(2 pi t))
    g_a = b_ds * c * c_a
    # d (A cos 2 pi t) / d <q_P, k_P> = -A sin(2 pi t) 2 pi W, A = c_a <q_A, k_A>
    g_p = b_ds * b_a * w * s * (-6.283185307179586 * c_a)
    return b_p, g_a, g_p
