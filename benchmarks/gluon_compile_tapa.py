"""Offline compile check of the Gluon Hopper TAPA forward (kernels/tapa/gluon_tapa.py): compiles each
variant for sm_90a with the Triton in this environment (no GPU needed: Triton's bundled ptxas) and
prints ptxas' registers, spills and shared memory per variant, the CTA barriers (bar.sync) and
wgmma waits in its PTX, and any ptxas performance warning (C7514: wgmma serialised).

The GPU machine runs Triton 3.6.0; check against it where the local Triton is another version:

    PYTHONPATH=/tmp/triton36 python benchmarks/gluon_compile_tapa.py
    python benchmarks/gluon_compile_tapa.py --dims 128 --tiles 64x64x2x4 128x64x2x8 --phases quadratic
    python benchmarks/gluon_compile_tapa.py --dims 128 --causal 1 --phases quadratic --variants none table \
        table+order3

`--variants` names combinations of gluon_tapa_host.VARIANTS joined by "+" ("none": no optional
schedule; "default", the default: each head dim's DEFAULT_VARIANTS); each row also prints the
SASS instructions an iteration of every key-block loop, and with `--opcodes` each loop's
instructions by opcode (the per-score accounting in kernels/attention/README.md):

    python benchmarks/gluon_compile_tapa.py --dims 128 --causal 1 --phases quadratic --opcodes

On an sm_90 GPU, `--time N [N ...]` also times each variant's forward (bf16, H = 16, 65536 tokens a
batch, CUDA events, median of 30) against SDPA cuDNN (the plain attention, gluon_compile.time_forward)
and the Triton `tl` TAPA forward at those lengths. The variants of one (D, tile, causal, phase) are
timed in turn, `--repeats R` rounds of cuDNN then every variant, so that a drift of the card's
speed within the process reaches every variant alike; each variant's line gives the median of its
rounds, their range, and the median of its per-round ratios to cuDNN:

    python benchmarks/gluon_compile_tapa.py --dims 128 --causal 1 --phases quadratic \
        --variants default order3+ws+coef+lazy+diag+table --time 4096 16384 --repeats 5
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from functools import partial

import torch
from gluon_compile import (  # the sibling script (benchmarks/ is on sys.path)
    compile_report,
    median_ms,
    parse_tile,
    report_variant,
    require_gluon,
    time_forward,
)

from phaselab.kernels.tapa import gluon_tapa, gluon_tapa_host

PHASES = ("quadratic", "linear")


def signature(D: int, tile: tuple[int, int, int, int], dtype: torch.dtype) -> dict:
    """The run-time arguments' types of one variant, from descriptors over small CPU tensors (the
    shapes are run-time values; only the block shapes and layouts enter the signature)."""
    from triton.runtime.jit import mangle_type

    block_m, block_n, _, _ = tile
    q = torch.zeros(1, 1, 256, D, dtype=dtype)
    names = ("qa_desc", "qp_desc", "ka_desc", "kp_desc", "v_desc")
    sig = {n: mangle_type(d) for n, d in zip(names, gluon_tapa_host.descriptors(q, q, q, block_m, block_n))}
    sig |= {"o_ptr": mangle_type(q), "lse_ptr": "*fp32", "T": "i32", "S": "i32", "H": "i32", "GROUP": "i32"}
    sig |= {n: "fp32" for n in ("qk_scale", "alpha", "k_turn", "c1", "c2", "c3", "c4", "c5")}
    sig |= {"r_min": "i32", "r_3": "i32", "w_table": "*fp32", "w_coef": "*fp32", "coef_base": "i32"}
    return sig


def compile_variant(D: int, tile: tuple[int, int, int, int], causal: bool, linear: bool,
                    dtype: torch.dtype = torch.bfloat16, variants: frozenset[str] = frozenset()) -> dict:
    """ptxas' report of one TAPA forward variant for sm_90a (`gluon_compile.compile_report`);
    variants: names from gluon_tapa_host.VARIANTS ("order3" changes no code, only r_3; "ws" is the
    backward's)."""
    sig = signature(D, tile, dtype)
    kernel, consts = gluon_tapa.forward_launch(D, tile, gluon_tapa_host.variant_flags(variants, D), causal, linear)
    if kernel is gluon_tapa.gluon_tapa_fwd_persistent_kernel:
        sig["n_items"], sig["claim_ptr"] = "i32", "*i32"
    if kernel is gluon_tapa.gluon_tapa_fwd_pp_kernel:
        sig["n_items"], sig["n_bh"] = "i32", "i32"
    cap = consts.pop("maxnreg", None)   # a launch option, as the launcher applies it; num_warps is also a constexpr
    return compile_report(kernel, sig, consts, consts["num_warps"], maxnreg=cap)


def time_tapa(D: int, N: int, tile: tuple[int, int, int, int] | None, causal: bool, phase: str,
              variants: frozenset[str] = frozenset()) -> float:
    """Median ms of one TAPA forward at B = 65536 // N, H = 16, bf16: the Gluon kernel with `tile`
    and `variants`, or (tile None) the Triton `tl` forward (triton_tapa.tapa_fwd, its defaults)."""
    from phaselab.kernels.tapa import triton_tapa

    gen = torch.Generator(device="cuda").manual_seed(0)
    B = max(1, 65536 // N)
    q, k, v = (torch.randn(B, 16, N, D, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if tile is None:
        pos = torch.arange(N, device="cuda")[None]
        return median_ms(lambda: triton_tapa.tapa_fwd(q, k, v, pos, pos, d_amp=D // 2, alpha=0.1,
                                                       phase_scale=2 * math.pi, linear=phase == "linear",
                                                       scale=1.0, causal=causal))
    return median_ms(lambda: gluon_tapa.gluon_tapa_fwd(q, k, v, phase=phase, causal=causal, tile=tile,
                                                       variants=variants))


def interleaved(lengths: list[int], n_rows: int, repeats: int, time_row, time_ref) -> dict[int, dict]:
    """Per length N: {"ref": [cuDNN ms a round], "rows": [[ms a round] per row]} from `repeats`
    rounds of time_ref(N) then time_row(i, N) for every row i in turn."""
    out = {}
    for N in lengths:
        ref, rows = [], [[] for _ in range(n_rows)]
        for _ in range(repeats):
            ref.append(time_ref(N))
            for i in range(n_rows):
                rows[i].append(time_row(i, N))
        out[N] = {"ref": ref, "rows": rows}
    return out


def timing_lines(names: list[str], timings: dict[int, dict]) -> list[str]:
    """One line per length and row: the median ms of its rounds, their range, and the median of
    its per-round ratios to cuDNN."""
    lines = []
    for N, t in timings.items():
        lines.append(f"  N={N}: cuDNN {statistics.median(t['ref']):.3f} ms (median of {len(t['ref'])} rounds)")
        for name, ms in zip(names, t["rows"]):
            ratio = statistics.median(m / r for m, r in zip(ms, t["ref"]))
            lines.append(f"  N={N} {name}: {statistics.median(ms):.3f} ms ({min(ms):.3f}-{max(ms):.3f}), "
                         f"x cuDNN {ratio:.2f}")
    return lines


def _print_timings(D: int, rows: list[tuple[frozenset[str], tuple]], causal: bool, phase: str,
                   lengths: list[int], repeats: int) -> None:
    """Times the compiled rows (variants, tile) of one group in turn, and the `tl` forward once."""
    for N in lengths:
        print(f"  N={N}: tl TAPA {time_tapa(D, N, None, causal, phase):.3f} ms")
    timings = interleaved(lengths, len(rows), repeats,
                          lambda i, N: time_tapa(D, N, rows[i][1], causal, phase, rows[i][0]),
                          lambda N: time_forward(D, N, None, causal))
    names = [f"{'+'.join(sorted(v)) or 'none'} {'x'.join(map(str, t))}" for v, t in rows]
    print("\n".join(timing_lines(names, timings)))


def parse_variants(text: str) -> frozenset[str] | None:
    """A "+"-joined set of gluon_tapa_host.VARIANTS; "none": the empty set; "default": None, each head
    dim's gluon_tapa_host.DEFAULT_VARIANTS (`resolve`)."""
    if text == "default":
        return None
    chosen = frozenset() if text == "none" else frozenset(text.split("+"))
    if not chosen <= set(gluon_tapa_host.VARIANTS):
        raise argparse.ArgumentTypeError(f"variants {text!r}: 'none', 'default' or names from "
                                         f"{', '.join(gluon_tapa_host.VARIANTS)} joined by '+'")
    return chosen


def resolve(variants: frozenset[str] | None, D: int) -> frozenset[str]:
    return gluon_tapa_host.DEFAULT_VARIANTS[D] if variants is None else variants


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=list(gluon_tapa_host.TILES))
    p.add_argument("--tiles", type=parse_tile, nargs="+", default=None,
                   help="BLOCK_MxBLOCK_NxSTAGESxWARPS (default: gluon_tapa_host.forward_tile)")
    p.add_argument("--causal", type=int, nargs="+", default=[1, 0], choices=[0, 1])
    p.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    p.add_argument("--variants", type=parse_variants, nargs="+", default=[None],
                   help="combinations of " + ", ".join(gluon_tapa_host.VARIANTS) + " joined by '+', 'none' or "
                   "'default' (each head dim's DEFAULT_VARIANTS)")
    p.add_argument("--time", type=int, nargs="+", default=[], metavar="N",
                   help="on an sm_90 GPU, also time each variant's forward at these lengths")
    p.add_argument("--repeats", type=int, default=1, metavar="R",
                   help="with --time: rounds of cuDNN then every variant in turn (default 1)")
    p.add_argument("--opcodes", action="store_true",
                   help="also print each key-block loop's SASS instructions by opcode")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    require_gluon("gluon_compile_tapa.py", gluon_tapa.gluon_common.IMPORT_ERROR)
    import triton

    print(f"triton {triton.__version__}, sm_90a")
    print("| D | tile (MxNxstagesxwarps) | variants | causal | phase | dtype | regs | spill st/ld B | smem B | "
          "bar.sync | wgmma.wait | ex2 | cos |\n|---:|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    failed = 0
    for D, tile_arg, causal, phase, dt in itertools.product(args.dims, args.tiles or [None], args.causal,
                                                            args.phases, args.dtypes):
        rows = []
        for variants in args.variants:
            variants = resolve(variants, D)
            tile = tile_arg or gluon_tapa_host.forward_tile(D, gluon_tapa_host.variant_flags(variants, D))
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
            label = f"| {D} | {'x'.join(map(str, tile))} | {'+'.join(sorted(variants)) or 'none'} | {causal} | {phase} | {dt} |"
            if report_variant(label, partial(compile_variant, D, tile, bool(causal), phase == "linear", dtype,
                                             variants), extra=("ex2", "cos"), opcodes=args.opcodes) is None:
                failed += 1
            else:
                rows.append((variants, tile))
        if dt == "bf16" and args.time and rows:
            _print_timings(D, rows, bool(causal), phase, args.time, args.repeats)
    if failed:
        raise SystemExit(f"{failed} variant(s) failed to compile")


if __name__ == "__main__":
    main()
