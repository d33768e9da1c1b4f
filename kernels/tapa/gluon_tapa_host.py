"""The host side of the Gluon Hopper TAPA kernels (gluon_tapa.py forward, gluon_tapa_bwd.py
backward): their tiles and optional schedules, the routing check `supported`, the TMA descriptors,
the series' scalars and radii, and the tables the "table" and "coef" schedules read. Nothing here
needs Gluon, so it imports on any machine; the launchers (`gluon_tapa.gluon_tapa_fwd`,
`gluon_tapa_bwd.gluon_tapa_bwd`) combine it with their kernels.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from phaselab.kernels.common.score_mod import tapa_split
from phaselab.kernels.common.triton_common import LOG2E
from phaselab.kernels.flash import gluon_common
from phaselab.kernels.flash.gluon_common import descriptor_at
from phaselab.kernels.tapa.phase import _taylor, series_radius

# (BLOCK_M, BLOCK_N, STAGES, warps) per head dim. Two fp32 score accumulators (S_A, S_P) live
# beside O, so the plain core's 64x128 tile spills (D = 128: 564 / 972 B, D = 64: 156 / 248 B of
# spill stores / loads); the tiles below compile without spills for sm_90a with triton 3.6.0 (D = 128:
# 255 registers, D = 64: 225; benchmarks/gluon_compile_tapa.py); on the H200 the wider 128x64x2x8
# was no faster at D = 128 and 10-19 % slower at D = 64 (benchmarks/results/gluon-tapa-fwd-h200.md).
TILES = {64: (64, 64, 2, 4), 128: (64, 64, 2, 4)}
# The "fws" kernel's tile: Triton gives a warp-specialised kernel whole warpgroups (the producer
# warp's takes 4 warps of the launch). At 64x64x2x4 (D = 128) the launch's cap FWS_PAIR_REGS
# (below, `launch_regs`) lets two CTAs share an SM (uncapped: 8 warps at 255 registers, one CTA);
# at D = 64, where "fws" is not the default, 128x64x2x8 launches 12 warps at 168 registers and
# raises its two consumer warpgroups to 240 (setmaxnreg), one CTA and 8 softmax warps an SM; both
# without spills (benchmarks/gluon_compile_tapa.py).
TILES_FWS = {64: (128, 64, 2, 8), 128: (64, 64, 2, 4)}
# The "pingpong" kernel's tile: one consumer warpgroup's (BLOCK_M = BLOCK_N, so that the two
# warpgroups' key blocks differ by at most one); a program runs two such query blocks
TILES_PP = {64: (64, 64, 2, 4), 128: (64, 64, 2, 4)}
# Optional schedules of the kernels, each a constexpr (`gluon_tapa.gluon_tapa_fwd(variants=...)`), each cutting
# the instructions a score costs (benchmarks/gluon_compile_tapa.py prints the key-block loops' SASS
# counts):
#   "table":  W of tiles near the diagonal (|D_c| < r_min, unmasked; in the forward also the causal
#             masked tiles past block 0) read from a table of k_turn d^alpha (float64, rounded once;
#             `distance_table`) instead of exp2(alpha lg2 d): no MUFU;
#   "order3": tiles far enough from the diagonal that three terms reach the series' bound
#             (|D_c| >= r_3, `phase.series_radius(alpha, 3)`) take three FMAs instead of five;
#   "ws":     the backward's dK/dV kernel loads its query blocks in a one-warp producer partition
#             (gluon_tapa_bwd.gluon_tapa_bwd_dkdv_ws_kernel): one CTA barrier a step instead of five;
#   "coef":   the series tiles of the forward and of dQ read their coefficients (f, g_1 .. g_5) from
#             a table of the launch's tiles (`coefficient_table`, float64 rounded once) instead of
#             computing them (a reciprocal, an accurate log2, an exp2 and products: ~33
#             instructions a tile; dK/dV's transposed tiles compute them);
#   "lazy":   the forward keeps a row's max until a block exceeds it by 8 (log2 units) and skips
#             O's rescale in warps whose rows all kept theirs (gluon_hopper._softmax, _rescale;
#             FlashAttention-4's conditional rescaling, https://modal.com/blog/reverse-engineer-flash-attention-4):
#             64 FMULs a step become a vote and four branches;
#   "fws":    the forward's loads in a one-warp producer partition (`gluon_tapa.gluon_tapa_fwd_ws_kernel`, as
#             "ws" does for dK/dV; tile TILES_FWS): the softmax warps release ring slots instead
#             of issuing TMA: 60 instructions a step fewer at the third order;
#   "occupancy": the D = 64 forward compiled for at most OCCUPANCY_REGS[64] registers a thread, so
#             that three 4-warp CTAs share an SM (12 softmax warps instead of 8): with "coef",
#             "lazy" and "diag" it needs no spill in the quadratic phase (176 registers uncapped;
#             4 / 4 B with "interleave", one value across the loop; 40 / 48 B of spills in the
#             linear one); the default schedule spills 1172 B under the
#             cap and ran 2.95 / 2.81x cuDNN so, against 2.29 / 2.04x uncapped (gluon-tapa-fwd-h200.md).
#             No effect at D = 128, where three CTAs' shared memory does not fit, nor with "fws",
#             whose cap is set by its partitions (`launch_regs`);
#   "interleave": the grid runs each query block of INTERLEAVE_HEADS heads in turn before the next
#             shorter one (`gluon_tapa._program`) instead of all of one head's blocks, longest
#             first, before the next head's: a causal launch then ends on its shortest rows, not
#             on a last head's long ones, while the K and V of about as many heads as before are
#             in flight; no effect with "persistent", which claims its items in its own order;
#   "persistent": the forward as a persistent kernel (`gluon_tapa.gluon_tapa_fwd_persistent_kernel`,
#             PERSISTENT_CTAS programs an SM), each program claiming query blocks through an atomic
#             count in the order a one-block-a-program grid runs them and running them through one
#             sequence of ring slots: once an item's K blocks retire, its slots take the next item's
#             first blocks, and the next Q loads into a second buffer, so the load latency of each
#             query block's prologue overlaps the previous one (FlashAttention-3's persistent
#             scheduling, https://arxiv.org/abs/2407.08608 section 3.1); no effect with "fws"; off
#             (kernels/attention/README.md has its timings);
#   "diag":   the series polynomial once per diagonal of a thread's tile (18 of its 32 scores at
#             64x64; `gluon_tapa.diag_poly_asm`), bit for bit the same W: in the forward 42 FMAs a step fewer at
#             the third order, 70 at the fifth, and 24 registers fewer; in dQ 17 / 29 fewer (D=128)
#             and its D=64 spills gone; dK/dV unchanged (the compiler already shares its offsets);
#   "pingpong": the forward as a persistent kernel of one program an SM (`gluon_tapa.gluon_tapa_fwd_pp_kernel`)
#             whose items are pairs of query blocks (TILES_PP's BLOCK_M rows each): two consumer
#             warpgroups, one a block, read one set of K and V rings filled by one producer warp and
#             take turns issuing their products, so that one's softmax overlaps the other's products
#             (FlashAttention-3's ping-pong, https://arxiv.org/abs/2407.08608 section 3.1), and Q
#             sits in two buffers; PINGPONG_REGS a thread, PINGPONG_CONSUMER_REGS for the
#             consumers; takes precedence over "fws" and "persistent". Off: on an H100 it ran the
#             D = 128 forward at 1.93 / 1.52x cuDNN against the defaults' 1.56 / 1.49x (4k / 16k;
#             benchmarks/results/gluon-tapa-fwd-h100-pingpong.md).
# Timed on the H200 (benchmarks/results/gluon-tapa-{fwd,bwd}-h200.md): "ws" is 3-6 % faster in
# forward+backward, and "order3" makes the D = 128 forward 4 % faster at 16k (12.91 against 13.42
# ms with every series tile at the fifth order); "table" gains nothing beyond the timing noise (at
# most 2 %). Timed on an H100 (benchmarks/results/gluon-tapa-{fwd,bwd}-h100.md): "coef", "lazy"
# and "diag" together make the D = 128 forward 11 % / 8.5 % faster at 4k / 16k, and "occupancy"
# with them the D = 64 one 9 % / 10 %; "fws" at 128x64x2x8 is 4-8 % slower than the same schedules
# without it;
# beside those, "persistent" is on par at D = 128 and 7-17 % slower at D = 64
# (benchmarks/results/gluon-tapa-fwd-h100-4k.md), and "table", in five interleaved rounds, 3.3 % /
# 0 % faster at D = 128 and 4.2 % / 3.0 % at D = 64 (4k / 16k; the same file, section 5).
# Timed on the H200 (benchmarks/results/gluon-tapa-fwd-h200-fws.md): "fws" at 64x64x2x4 under the pair
# cap makes the D = 128 forward 3.8 % faster at 4k (3.184 against 3.309 ms) and equal at 16k
# (11.62 / 11.60 ms); at D = 64 it is 1.6 % / 4.0 % slower than "occupancy". "interleave", timed on
# two H100s (benchmarks/results/gluon-tapa-fwd-h100-interleave.md), moves the forward by less than
# the rounds' spread; it is on for the tail of a synced launch (INTERLEAVE_HEADS).
VARIANTS = ("table", "order3", "ws", "coef", "lazy", "diag", "fws", "occupancy", "persistent", "interleave",
            "pingpong")
OCCUPANCY_REGS = {64: 168}
# Heads whose query blocks "interleave" runs in turn: 4 at 4k (B*H = 256, 64 blocks a head) puts the
# greedy schedule of the launch's blocks over 2 x 132 CTA slots within 0.2 % of its work's bound,
# against 1.7 % in head order (costs: a block's key blocks plus 3 for its prologue and epilogue)
INTERLEAVE_HEADS = 4
# The "fws" kernel at a tile of one consumer warpgroup (4 warps): Triton launches the producer's
# warpgroup beside it, 8 warps, at 255 registers a thread uncapped, one CTA an SM. Capped at
# FWS_PAIR_REGS, two CTAs share an SM (2 x 256 threads x 128 = the SM's 65536 registers) and
# setmaxnreg gives the producer's registers to the consumers: 24 a thread against 232, above the
# 221 the D = 128 default schedules take without "fws" (benchmarks/gluon_compile_tapa.py: no spills)
FWS_PAIR_REGS = 128
# The "pingpong" kernel: two consumer warpgroups and the producer's, 384 threads at PINGPONG_REGS
# (168 x 384 <= 65536); setmaxnreg lowers the producer to PRODUCER_REGS and raises each consumer to
# PINGPONG_CONSUMER_REGS: (168 x 384 - 24 x 128) / 256 = 240, the 232 of "fws" and more
PINGPONG_REGS = 168
PINGPONG_CONSUMER_REGS = 240
# CTAs an SM of the default tiles (registers: two of 4 warps at up to 255 a thread; shared
# memory of the persistent kernel at D = 128: two Q buffers 32 KiB and rings 64 KiB), the
# persistent forward's programs an SM
PERSISTENT_CTAS = {64: 2, 128: 2}
# The schedules a launch takes unless told, per head dim (from the timings above)
DEFAULT_VARIANTS: dict[int, frozenset[str]] = {
    64: frozenset({"ws", "order3", "coef", "lazy", "diag", "occupancy", "table", "interleave"}),
    128: frozenset({"ws", "order3", "coef", "lazy", "diag", "table", "fws", "interleave"}),
}
# r_min is capped so that the in-kernel block arithmetic (index + r_min) stays within int32
_R_MIN_CAP = 2**29
_MAX_LEN = 2**29


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_q=None, pos_k=None, *,
              theta: float = 0.5, scale: float = 1.0, what: str = "the Gluon TAPA forward") -> str | None:
    """None when the Gluon TAPA forward can run on these inputs, else a short reason: the TAPA
    split and scale first, then gluon_common.supported (index positions, dtypes, widths, machine)."""
    if pos_q is None and pos_k is None and all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (q, k, v)):
        D = q.shape[-1]
        if 2 * int(theta * D) != D:
            return f"theta={theta} with head dim {D} gives D_A={int(theta * D)} ({what} needs D_A = D / 2)"
        if not scale > 0:
            return f"scale={scale} ({what} needs scale > 0: the row max is taken before scaling)"
        if max(q.shape[2], k.shape[2]) >= _MAX_LEN or max(q.shape[:3].numel(), k.shape[:3].numel()) >= 2**31:
            return f"lengths T={q.shape[2]}, S={k.shape[2]} (int32 block arithmetic and TMA rows)"
    return gluon_common.supported(q, k, v, pos_q, pos_k, what=what)


def descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int, block_n: int) -> tuple:
    """TMA descriptors of the amplitude and phase halves of q [B,H,T,D] and k [B,G,S,D] and of the
    whole v (all contiguous): [rows, D/2] matrices of row stride D at each half's address (no
    copy, no view), and [rows, D]; `gluon_common.descriptor_at`'s, kept by address."""
    D, itemsize = q.shape[-1], q.dtype.itemsize
    half, q_rows, kv_rows, q_ptr, k_ptr = D // 2, q.numel() // D, k.numel() // D, q.data_ptr(), k.data_ptr()
    return (descriptor_at(q_ptr, q.dtype, q_rows, half, D, block_m),
            descriptor_at(q_ptr + half * itemsize, q.dtype, q_rows, half, D, block_m),
            descriptor_at(k_ptr, k.dtype, kv_rows, half, D, block_n),
            descriptor_at(k_ptr + half * itemsize, k.dtype, kv_rows, half, D, block_n),
            descriptor_at(v.data_ptr(), v.dtype, kv_rows, D, D, block_n))


@functools.lru_cache(maxsize=64)
def kernel_scalars(D: int, alpha: float, phase_scale: float, scale: float, block_m: int, block_n: int) -> tuple:
    """(qk_scale, alpha, k_turn, c_1 .. c_5, r_min) of the kernel: qk_scale = scale log2 e / sqrt(D_A),
    k_turn = phase_scale / (2 pi sqrt(D_P)), the series' coefficients binom(alpha, k) and the
    smallest |D_c| at which the series' radius u_max covers a tile's spread (BM + BN - 2) / 2."""
    d_amp, d_phase = tapa_split(D, 0.5)
    u_max, *coef = _taylor(float(alpha))
    spread = (block_m + block_n - 2) / 2
    r_min = _R_MIN_CAP if u_max <= 0 else min(_R_MIN_CAP, math.ceil(spread / u_max))
    return (scale * LOG2E / math.sqrt(d_amp), float(alpha), phase_scale / (2.0 * math.pi * math.sqrt(d_phase)),
            *coef, r_min)


def order3_radius(alpha: float, block_m: int, block_n: int, r_min: int) -> int:
    """r_3: the smallest |D_c| at which the third-order series' radius (`phase.series_radius(alpha,
    3)`) covers a tile's spread (BM + BN - 2) / 2; never below r_min (the fifth order's)."""
    u_3 = series_radius(float(alpha), 3)
    spread = (block_m + block_n - 2) / 2
    return max(r_min, _R_MIN_CAP if u_3 <= 0 else min(_R_MIN_CAP, math.ceil(spread / u_3)))


@functools.lru_cache(maxsize=8)
def distance_table(length: int, alpha: float, k_turn: float, device: torch.device) -> torch.Tensor:
    """fp32 [length]: k_turn d^alpha for d = 0 .. length - 1, computed in float64 and rounded once
    (the "table" variant's W near the diagonal; the kernel reads it at d < r_min + BM + BN)."""
    d = torch.arange(length, dtype=torch.float64, device=device)
    return (k_turn * d**alpha).to(torch.float32)


@functools.lru_cache(maxsize=8)
def coefficient_table(T: int, S: int, block_m: int, block_n: int, alpha: float, k_turn: float,
                      device: torch.device) -> tuple[torch.Tensor, int]:
    """The "coef" variant's (table fp32 [rows, 8], base): row k holds (f, g_1 .. g_5, 0, 0) of the
    tiles whose central distance is D_c = base + k BLOCK_N, f = k_turn |D_c|^alpha and g_i = f
    binom(alpha, i) / D_c^i (`gluon_tapa._w_series_e`'s coefficients), in float64 rounded once. A launch's tile
    (query block from m0, key block j) has D_c = m0 + S - T + (BM - BN) / 2 - j BN, row
    m0 / BN + cdiv(S, BN) - 1 - j (`gluon_tapa._coef_row`), so the rows cover every tile; rows with |D_c| < 1
    (never read: such tiles take the exact power) hold zeros. BM must be a multiple of BN."""
    if block_m % block_n:
        raise ValueError(f"the coefficient table needs BLOCK_M ({block_m}) a multiple of BLOCK_N ({block_n})")
    kv_blocks = -(-S // block_n)
    base = S - T + (block_m - block_n) // 2 - (kv_blocks - 1) * block_n
    rows = -(-T // block_m) * (block_m // block_n) + kv_blocks
    d = base + block_n * torch.arange(rows, dtype=torch.float64, device=device)
    far = d.abs() >= 1
    d = torch.where(far, d, torch.ones_like(d))
    f = k_turn * d.abs() ** alpha
    g = [f * c / d**i for i, c in enumerate(_taylor(float(alpha))[1:], start=1)]
    table = torch.stack([f, *g, torch.zeros_like(f), torch.zeros_like(f)], dim=1)
    return torch.where(far[:, None], table, 0.0).to(torch.float32).contiguous(), base


class Variants(NamedTuple):
    """Which of VARIANTS a launch takes (field order = VARIANTS)."""
    table: bool
    order3: bool
    ws: bool
    coef: bool
    lazy: bool
    diag: bool
    fws: bool
    occupancy: bool
    persistent: bool
    interleave: bool
    pingpong: bool


def forward_tile(D: int, flags: Variants) -> tuple:
    """The forward's default tile: TILES_PP[D] with "pingpong" (one consumer warpgroup's), else
    TILES_FWS[D] with "fws", else TILES[D]."""
    return (TILES_PP if flags.pingpong else TILES_FWS if flags.fws else TILES)[D]


def query_blocks(flags: Variants) -> int:
    """Query blocks a forward program runs: 2 with "pingpong" (`gluon_tapa.gluon_tapa_fwd_pp_kernel`), else 1."""
    return 2 if flags.pingpong else 1


def interleave_heads(flags: Variants) -> int:
    """The forward kernels' HEADS constexpr (`gluon_tapa._program`): INTERLEAVE_HEADS with
    "interleave", 1 (head order) without it."""
    return INTERLEAVE_HEADS if flags.interleave else 1


def variant_flags(variants, D: int) -> Variants:
    """The flags of a set of names from VARIANTS (None: DEFAULT_VARIANTS[D]); unknown names refused."""
    chosen = DEFAULT_VARIANTS[D] if variants is None else frozenset(variants)
    unknown = sorted(chosen - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown TAPA kernel variants {unknown} (known: {', '.join(VARIANTS)})")
    return Variants(*(v in chosen for v in VARIANTS))


def variant_scalars(scalars: tuple, alpha: float, T: int, S: int, block_m: int, block_n: int, table: bool,
                    order3: bool, device: torch.device, coef: bool = False) -> tuple:
    """(r_3, w_table, w_coef, coef_base) of a launch, after `kernel_scalars` (its k_turn and r_min):
    with "coef" the `coefficient_table` and its base, else the distance table again (never read)
    and 0; r_3 = _R_MIN_CAP
    without "order3" (2**29, past the third order's own radius and every distance of a launch but
    the last few near 2**29: no third-order block; r_3 = r_min would give every series tile the
    third order), and the distance table the kernel reads only in tiles with
    |D_c| < r_min, where |m - n| < r_min + BM + BN, no distance exceeding max(S, T) + BM + BN (rows
    past T, keys past S); without "table" a one-entry table that the kernel never reads."""
    k_turn, r_min = scalars[2], scalars[-1]
    r_3 = order3_radius(alpha, block_m, block_n, r_min) if order3 else _R_MIN_CAP
    length = min(r_min, max(S, T)) + block_m + block_n if table else 1
    w_table = distance_table(length, float(alpha), k_turn, device)
    w_coef = coefficient_table(T, S, block_m, block_n, float(alpha), k_turn, device) if coef else (w_table, 0)
    return r_3, w_table, *w_coef


def launch_regs(D: int, tile: tuple, flags: Variants) -> int | None:
    """The forward's register cap a thread (Triton's `maxnreg`; None: none): "fws" at a tile of
    one consumer warpgroup FWS_PAIR_REGS (two CTAs an SM), "occupancy" without "fws"
    OCCUPANCY_REGS[D] where D has one; "pingpong" PINGPONG_REGS."""
    if flags.pingpong:
        return PINGPONG_REGS
    if flags.fws:
        return FWS_PAIR_REGS if tile[3] == 4 else None
    return OCCUPANCY_REGS.get(D) if flags.occupancy else None


def persistent_programs(n_items: int, D: int, flags: Variants, device: torch.device) -> int:
    """The persistent forwards' grid: "pingpong" one program an SM, else PERSISTENT_CTAS[D]
    ("occupancy": three at D = 64), never more than their items."""
    per_sm = 1 if flags.pingpong else 3 if flags.occupancy and D in OCCUPANCY_REGS else PERSISTENT_CTAS[D]
    return min(n_items, per_sm * torch.cuda.get_device_properties(device).multi_processor_count)
