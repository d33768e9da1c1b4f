"""Helpers shared by the fused PoPE and TAPA kernels (kernels/pope/triton_pope.py, kernels/tapa/triton_tapa.py):
fp32 range reduction and MUFU transcendentals, the causal block ranges found by bisection over
sorted positions, autotuning configs and host-side conventions. Spec of the kernels: MATH §3, §4,
§7; verification: tests/kernels/{pope,tapa}/test_triton_{pope,tapa}.py.
"""

from __future__ import annotations

import inspect
import math
import os

import torch
import triton
import triton.language as tl

from phaselab.kernels.common.options import EXP2_CHOICES

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2

# How the score tiles' softmax exponentials run (`AttentionOptions.exp2`, the kernels' EXP2
# constexpr): "mufu" ex2.approx on the special-function unit, which PoPE's transform and TAPA's
# cosine also load; "poly" 2**x as 2**j * p(f) on the FMA/ALU pipes (FlashAttention-4's trick for
# MUFU-bound tiles); "split" half of each tile's columns each way. On the H200 PoPE's forward took
# 21-23 % (poly) and 11-13 % (split) longer than with "mufu" at 4k and 16k: the kernels are
# latency-bound (Nsight Compute, results/ncu/pope-16k.csv: 2 warps per scheduler, issue slots
# 29-34 % busy, the MUFU pipe 29-43 %), so more instructions cost more than a busier MUFU
# (kernels/attention/README.md, "Measured and not shipped"); "mufu" is the default, the others
# stay as an A/B choice for other GPUs.
EXP2_MODES = {name: code for code, name in enumerate(EXP2_CHOICES)}


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU tensors, numpy semantics; DESIGN §6 tier 2)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"



# ----------------------------------------------------------------------------- jit helpers


@triton.jit
def _rint(x, FAST: tl.constexpr):
    """x rounded to an integer (fp32): one cvt.rni on the GPU (ties to even) instead of
    floor(x + 0.5), an add and a round (kernel_sass.py); the interpreter rounds half up."""
    if FAST:
        y = tl.inline_asm_elementwise("cvt.rni.f32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        y = tl.floor(x + 0.5)
    return y


@triton.jit
def _reduce_2pi(x, FAST: tl.constexpr):
    """x - 2 pi k with k = rint(x / 2 pi), in fp32 (Cody-Waite, MATH §7.4).

    6.28125 has 8 significant bits, so k * 6.28125 is exact for |k| < 2**16 (|x| < 4e5) and the
    first subtraction is exact; the fp32 tail constant carries the rest of 2 pi to 1.0e-11, so the
    reduction adds at most |k| 1.0e-11 < 7e-7 rad, far below the half ulp of x itself (2**-6 rad
    already at |x| = 2**17). A third constant would cost one more FMA per key element per query
    block (kernel_sass.py) for nothing.
    """
    k = _rint(x * 0.15915494309189535, FAST)
    r = x - k * 6.28125
    r = r - k * 0.0019353071693331003  # 2 pi - 6.28125 rounded to fp32
    return r


@triton.jit
def _cos_sin(x, FAST: tl.constexpr):
    """(cos x, sin x) for fp32 x of any size: reduce to [-pi, pi], then `_cos_sin_reduced`."""
    c, s = _cos_sin_reduced(_reduce_2pi(x, FAST), FAST)
    return c, s


@triton.jit
def _cos_sin_reduced(r, FAST: tl.constexpr):
    """(cos r, sin r) for fp32 r in [-pi, pi]: MUFU approx (FAST, GPU only; abs error ~5e-7 on
    [-pi, pi]) or the precise libdevice/numpy routine."""
    if FAST:
        c = tl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=r,r", [r], dtype=tl.float32,
                                      is_pure=True, pack=1)
        s = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [r], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        c = tl.cos(r)
        s = tl.sin(r)
    return c, s


@triton.jit
def _log2(x, FAST: tl.constexpr):
    if FAST:
        y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def _exp2_poly(x):
    """2**x for fp32 x <= 0 without the special-function unit; exactly 0 below -125 (and at -inf),
    where the bit-level scaling would reach the denormals; 2**-125 is 2.4e-38 of the row's max.

    x = j + f with j = rint(x) taken by the 1.5 * 2**23 shifter (two adds, no conversion
    instruction) and f in [-0.5, 0.5]; 2**f by a degree-5 fit
    (relative error 7.5e-8, fp32 level); 2**j added to the exponent bits: t's bits are
    0x4B400000 + j, and since 0x4B400000 has its low 9 bits clear, (t's bits) << 23 is j << 23
    modulo 2**32.
    """
    xc = tl.maximum(x, -125.0)
    t = xc + 12582912.0
    f = xc - (t - 12582912.0)
    p = 0.0013276452373323089 * f + 0.009675541728738538
    p = p * f + 0.05550713338967638
    p = p * f + 0.24022119717615786
    p = p * f + 0.693146967021685
    p = p * f + 1.0000000716555055
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return tl.where(x < -125.0, 0.0, bits.to(tl.float32, bitcast=True))


@triton.jit
def _exp2_tile(x, MODE: tl.constexpr):
    """2**x of a [BM, BN] fp32 score tile (arguments <= 0): MODE an `EXP2_MODES` code."""
    if MODE == 0:
        y = tl.exp2(x)
    elif MODE == 1:
        y = _exp2_poly(x)
    else:
        # even columns on the FMA pipe, odd ones on the special-function unit: a column pair sits
        # in one thread in Triton's MMA layouts, so the split and join move no data (kernel_sass.py:
        # no shuffles or shared-memory traffic added)
        a, b = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
        y = tl.reshape(tl.join(_exp2_poly(a), tl.exp2(b)), [x.shape[0], x.shape[1]])
    return y


@triton.jit
def _count_le(p_pos, n, value, n_iter):
    """How many entries of the non-decreasing int vector p_pos[0:n] are <= value (bisection)."""
    lo = n * 0
    hi = n + 0
    for _ in range(n_iter):
        mid = (lo + hi) // 2
        active = lo < hi
        x = tl.load(p_pos + mid, mask=active, other=0)
        lo = tl.where(active & (x <= value), mid + 1, lo)
        hi = tl.where(active & (x > value), mid, hi)
    return lo


@triton.jit
def _causal_key_range(p_posq, p_posk, b_pq, m_m, k_sorted, i_b, s_srt, i_m, S, n_iter_s,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(mid, hi): key blocks [0, mid) are fully visible to this query block, [mid, hi) partly."""
    first = tl.load(p_posq + i_m * BLOCK_M)
    srt = tl.load(k_sorted + i_b * s_srt) != 0
    n_lo = _count_le(p_posk, S, tl.min(tl.where(m_m, b_pq, first), 0), n_iter_s)
    n_hi = _count_le(p_posk, S, tl.max(tl.where(m_m, b_pq, first), 0), n_iter_s)
    mid = tl.where(srt, n_lo // BLOCK_N, 0)
    hi = tl.where(srt, tl.cdiv(n_hi, BLOCK_N), tl.cdiv(S, BLOCK_N))
    return mid, hi


@triton.jit
def _causal_query_range(p_posq, pos_k_block, b_pk, m_n, q_sorted, i_b, s_srt, T, n_iter_t,
                        BLOCK_M: tl.constexpr):
    """(lo, mid) for a key block: query blocks [0, lo) see none of its keys, [lo, mid) some, and
    from mid on (up to the last full block) all of them (sorted query positions; else (0, all))."""
    first = tl.load(pos_k_block)
    srt = tl.load(q_sorted + i_b * s_srt) != 0
    r_lo = _count_le(p_posq, T, tl.min(tl.where(m_n, b_pk, first), 0) - 1, n_iter_t)
    r_full = _count_le(p_posq, T, tl.max(tl.where(m_n, b_pk, first), 0) - 1, n_iter_t)
    lo = tl.where(srt, r_lo // BLOCK_M, 0)
    mid = tl.where(srt, tl.cdiv(r_full, BLOCK_M), tl.cdiv(T, BLOCK_M))
    return lo, mid


# ----------------------------------------------------------------------------- autotuning


def _fwd_configs() -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    # Measured on the H200 and left out: one-stage variants. ptxas serialises every wgmma of
    # PoPE's two-stage forward (C7515, one wait per MMA): the masked loop's tl.where on the score
    # tile after the pipelined unmasked loop triggers it (benchmarks/kernel_sass.py). One stage, or
    # the masked loop first, issues them in groups of eight, yet neither was faster (masked-first
    # spills at 256x64: 15.3 vs 14.2 ms at 16k, benchmarks/results/attention-h200-d64-maskedfirst.md);
    # Nsight Compute puts the wgmma stalls at 0.14 per issued instruction, against 1.2 on barriers
    # (benchmarks/results/ncu/pope-16k.csv; kernels/attention/README.md).
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in [(128, 64, 8, 2), (128, 128, 8, 2), (256, 64, 8, 2)]]


def _bwd_configs(first: tuple[int, int, int, int] | None = None) -> list[triton.Config]:
    """The backward kernels' autotune list; `first` (BLOCK_M, BLOCK_N, warps, stages) moves one of
    them to the front, where `prune_configs` takes it without autotuning."""
    if interpreting():
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    # 32-key tiles: TAPA's D=128 dQ kernel spills at its tuned 64x64/4-warp tile (69M local loads
    # at 16k, benchmarks/results/ncu/tapa-16k.csv) and not at 64x32 or 128x32 (kernel_sass.py);
    # with 64x32 TAPA's fwd+bwd went from 2.04x to 1.96x FlashAttention-2
    # (benchmarks/results/attention-h200-tapa-d128.md)
    tiles = [(64, 64, 4, 2), (64, 64, 8, 2), (32, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2),
             (128, 32, 8, 2)]
    if first is not None:
        tiles.remove(first)
        tiles.insert(0, first)
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in tiles]


# Untuned tiles (BLOCK_M, BLOCK_N, warps, stages) by kernel and register widths (q/k, v): the
# autotuner's picks on the H200 for bf16 causal attention at N 1k-128k (the `configs` of every
# autotuned row in benchmarks/results/attention-h200*.json; where picks differ by N, the
# one at 4k and 16k). fp16 moves the same bytes and takes the same tiles; fp32 (and any width not
# listed) keeps the first-config rule of `untuned_pick`. Checked against the autotuner in one run:
# benchmarks/results/attention-h200-defaults.md.
TUNE_DEFAULTS: dict[tuple[str, int, int], tuple[int, int, int, int]] = {
    ("flash_fwd", 64, 64): (128, 64, 8, 3), ("flash_fwd", 128, 128): (128, 64, 8, 3),
    ("flash_fwd", 128, 64): (128, 64, 4, 3),  # PoPE's expanded q_hat/k_hat (2D wide), v D wide
    ("flash_dkdv", 64, 64): (32, 64, 4, 3), ("flash_dkdv", 128, 128): (32, 128, 8, 3),
    ("flash_dkdv", 128, 64): (32, 64, 4, 3),
    ("flash_dq", 64, 64): (128, 64, 8, 3), ("flash_dq", 128, 128): (128, 64, 8, 3),
    ("flash_dq", 128, 64): (128, 64, 8, 3),
    ("pope_fwd", 64, 64): (256, 64, 8, 2), ("pope_fwd", 128, 128): (128, 128, 8, 2),
    ("pope_dkdv", 64, 64): (64, 128, 8, 2), ("pope_dkdv", 128, 128): (64, 128, 8, 2),
    ("pope_dq", 64, 64): (128, 64, 8, 2), ("pope_dq", 128, 128): (128, 64, 8, 2),
    ("tapa_fwd", 64, 64): (128, 64, 8, 2), ("tapa_fwd", 128, 128): (128, 64, 8, 2),
    ("tapa_dkdv", 64, 64): (32, 64, 4, 2), ("tapa_dkdv", 128, 128): (64, 32, 4, 2),
    ("tapa_dkdv_atomic", 64, 64): (64, 64, 4, 2), ("tapa_dkdv_atomic", 128, 128): (32, 64, 4, 2),
    ("tapa_dq", 64, 64): (64, 64, 4, 2), ("tapa_dq", 128, 128): (64, 32, 4, 2),
}

# Autotuning results kept on disk (Triton's cache directory, keyed by Triton version, GPU, kernel
# source, tuning key and config list), so a shape is tuned once per machine, not once per process.
TUNE_CACHE: dict = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def _arg(named_args, kwargs, name, default=None):
    return kwargs.get(name, named_args.get(name, default))


def autotuning(named_args, kwargs) -> bool:
    """Whether a launch asked to time every config: its AUTOTUNE constexpr
    (`AttentionOptions.autotune`), also part of every autotuned kernel's key, so an untuned pick
    is never reused for a tuned launch of the same shape or the other way round."""
    return bool(_arg(named_args, kwargs, "AUTOTUNE", False))


def default_tile(kernel: str, configs, named_args, kwargs):
    """The `TUNE_DEFAULTS` config of `kernel` among `configs` for this launch, or None.

    kernel: "flash_fwd", "pope_dq", "tapa_dkdv", ...; configs: candidate `triton.Config`s (already
    pruned to those that fit); named_args / kwargs: the launch's arguments, read for the widths
    (BLOCK_D = q/k, BLOCK_V = v; a kernel with one of them has it for both), q's dtype (16-bit only)
    and ATOMIC_DQ (TAPA's one-kernel backward has its own tiles).
    """
    bd, bv = _arg(named_args, kwargs, "BLOCK_D"), _arg(named_args, kwargs, "BLOCK_V")
    if _arg(named_args, kwargs, "ATOMIC_DQ", False):
        kernel += "_atomic"
    tile = TUNE_DEFAULTS.get((kernel, bd or bv or 0, bv or bd or 0))
    if tile is None or getattr(named_args.get("q"), "dtype", None) not in (torch.bfloat16, torch.float16):
        return None
    hit = [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) == tile]
    return hit[0] if hit else None


def untuned_pick(kernel: str, configs, named_args, kwargs) -> list:
    """The one config a PoPE or TAPA kernel runs without autotuning: [`default_tile`]
    where there is one, else [the first config], or for 128-wide heads the first with 8 warps (4
    warps spill their fp32 accumulators: benchmarks/kernel_sass.py). Arguments as `default_tile`."""
    tile = default_tile(kernel, configs, named_args, kwargs)
    if tile is not None:
        return [tile]
    width = max(_arg(named_args, kwargs, n, 0) or 0 for n in ("BLOCK_D", "BLOCK_V"))
    wide = [c for c in configs if c.num_warps == 8]
    return wide[:1] if width >= 128 and wide else list(configs[:1])


def pruner(kernel: str):
    """`early_config_prune` of the PoPE and TAPA kernel `kernel` (a `TUNE_DEFAULTS` name)."""
    def prune(configs, named_args, **kwargs):
        """Without AUTOTUNE one config (`untuned_pick`); with it, all that fit."""
        if not autotuning(named_args, kwargs):
            return untuned_pick(kernel, configs, named_args, kwargs)
        width = max(_arg(named_args, kwargs, n, 0) or 0 for n in ("BLOCK_D", "BLOCK_V"))
        # 256-row query blocks amortise PoPE's per-key-tile transcendentals, but only fit narrow heads
        return [c for c in configs if width < 128 or c.kwargs["BLOCK_M"] < 256]
    return prune



# ----------------------------------------------------------------------------- host functions


@triton.jit
def do_o_rows_kernel(o, do, dlt, s_ob, s_oh, s_ot, s_dob, s_doh, s_dot, T, H,
                      DV: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_M: tl.constexpr):
    """Delta_t = <dO_t, O_t> in fp32 [B, H, T] (one read of O and dO in their own dtype)."""
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_v = tl.arange(0, BLOCK_V)
    m = (o_m < T)[:, None] & (o_v < DV)[None, :]
    rows = o_m.to(tl.int64)[:, None]
    b_o = tl.load(o + i_b.to(tl.int64) * s_ob + i_h.to(tl.int64) * s_oh + rows * s_ot + o_v[None, :], mask=m, other=0.0)
    b_do = tl.load(do + i_b.to(tl.int64) * s_dob + i_h.to(tl.int64) * s_doh + rows * s_dot + o_v[None, :], mask=m,
                   other=0.0)
    tl.store(dlt + i_bh.to(tl.int64) * T + o_m, tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), 1), mask=o_m < T)


def _strides(*ts: torch.Tensor) -> tuple[int, ...]:
    """The batch, head and row strides of each [B, H, L, D] tensor, in order (kernel arguments)."""
    return tuple(s for t in ts for s in (t.stride(0), t.stride(1), t.stride(2)))


def do_o_rows(do: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Delta_t = <dO_t, O_t>, fp32 [B, H, T], of every flash-style backward here (last dims contiguous)."""
    B, H, T, DV = out.shape
    dlt = torch.empty((B, H, T), dtype=torch.float32, device=out.device)
    bm = 16 if interpreting() else 64
    do_o_rows_kernel[(triton.cdiv(T, bm), B * H)](out, do, dlt, *_strides(out, do), T, H, DV=DV, BLOCK_V=block_d(DV),
                                                   BLOCK_M=bm)
    return dlt


def _sorted_flags(pos_BL: torch.Tensor) -> torch.Tensor:
    """int32 [B or 1]: 1 where positions are non-decreasing (enables block skipping); no sync."""
    if pos_BL.shape[1] < 2:
        return torch.ones(pos_BL.shape[0], dtype=torch.int32, device=pos_BL.device)
    return (pos_BL[:, 1:] >= pos_BL[:, :-1]).all(dim=1).to(torch.int32)


def _pos_stride(pos_BL: torch.Tensor) -> int:
    return 0 if pos_BL.shape[0] == 1 else pos_BL.stride(0)


def _bisect_iters(n: int) -> int:
    return max(1, int(n).bit_length() + 1)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def block_d(head_dim: int) -> int:
    """Register width of a head: next power of two, at least 16 (tl.dot's minimum; D=48 -> 64)."""
    return max(16, triton.next_power_of_2(head_dim))
