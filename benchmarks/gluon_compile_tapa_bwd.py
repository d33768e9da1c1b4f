"""Offline compile check of the Gluon Hopper TAPA backward (kernels/tapa/gluon_tapa_bwd.py): compiles
the dK/dV and dQ kernels for sm_90a with the Triton in this environment (no GPU needed: Triton's
bundled ptxas) and prints ptxas' registers, spills and shared memory per variant, the CTA barriers
(bar.sync), wgmma waits and the ex2 / cos instructions in its PTX, and any ptxas performance warning
(C7514: wgmma serialised).

The GPU machine runs Triton 3.6.0, whose Gluon API differs from later releases; check against it
where the local Triton is another version:

    PYTHONPATH=/tmp/triton36 python benchmarks/gluon_compile_tapa_bwd.py
    python benchmarks/gluon_compile_tapa_bwd.py --dims 128 --kernels dkdv --tiles 32x128x2x8 64x64x2x4
    python benchmarks/gluon_compile_tapa_bwd.py --dims 128 --causal 1 --phases quadratic --variants none table+order3

`--variants` as in gluon_compile_tapa.py (gluon_tapa_host.VARIANTS joined by "+", or "none"); each row
also prints the SASS instructions an iteration of every query- or key-block loop. On an sm_90 GPU,
`--time N [N ...]` times the Gluon TAPA forward + backward with each variant (both kernels take it;
bf16, causal, H = 16, 65536 tokens a batch, CUDA events, median of 30) against SDPA cuDNN's at
those lengths, in one process; with one kernel named and `--tiles`, each of its tiles too:

    python benchmarks/gluon_compile_tapa_bwd.py --dims 128 --kernels dkdv --causal 1 --phases quadratic \
        --tiles 16x128x2x8 32x128x2x8 --variants none ws table+order3+ws --time 4096 16384
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import gluon_compile_bwd  # the sibling script: the cuDNN reference and the inputs
import torch
from gluon_compile import (  # the sibling script (benchmarks/ is on sys.path)
    compile_report,
    median_ms,
    parse_tile,
    report_variant,
    require_gluon,
)
from gluon_compile_tapa import parse_variants, resolve

from phaselab.kernels.tapa import gluon_tapa_bwd as bwd
from phaselab.kernels.tapa import gluon_tapa_host

KERNELS = ("dkdv", "dq")
PHASES = ("quadratic", "linear")


def signature(kernel_name: str, D: int, tile: tuple[int, int, int, int], dtype: torch.dtype) -> dict:
    """Argument types of one variant, from descriptors over small CPU tensors (shapes are run-time
    values; only the block shapes and layouts enter the signature)."""
    from triton.runtime.jit import mangle_type

    block_m, block_n, _, _ = tile
    x = torch.zeros(1, 1, 256, D, dtype=dtype)
    names = ("qa_desc", "qp_desc", "ka_desc", "kp_desc", "v_desc")
    sig = {n: mangle_type(d) for n, d in zip(names, gluon_tapa_host.descriptors(x, x, x, block_m, block_n))}
    sig |= {"do_desc": mangle_type(bwd.descriptor(x, block_m)), "lse_ptr": "*fp32", "dlt_ptr": "*fp32"}
    outs = ("dq_ptr",) if kernel_name == "dq" else ("dk_ptr", "dv_ptr")
    sig |= {n: mangle_type(x) for n in outs} | {"T": "i32", "S": "i32", "H": "i32", "GROUP": "i32"}
    sig |= {n: "fp32" for n in ("qk_scale", "alpha", "k_turn", "c1", "c2", "c3", "c4", "c5", "ds_scale")}
    sig |= {"r_min": "i32", "r_3": "i32", "w_table": "*fp32", "w_coef": "*fp32", "coef_base": "i32"}
    return sig


def compile_variant(kernel_name: str, D: int, tile: tuple[int, int, int, int], causal: bool, linear: bool,
                    dtype: torch.dtype = torch.bfloat16, variants: frozenset[str] = frozenset()) -> dict:
    """ptxas' report of one backward variant for sm_90a (`gluon_compile.compile_report`)."""
    ws = kernel_name == "dkdv" and "ws" in variants
    kernel = (bwd.gluon_tapa_bwd_dq_kernel if kernel_name == "dq"
              else bwd.gluon_tapa_bwd_dkdv_ws_kernel if ws else bwd.gluon_tapa_bwd_dkdv_kernel)
    bwd.check_tile(tile, 0 if kernel_name == "dq" else 1)
    consts = {"CAUSAL": causal, "LINEAR": linear, "STAGES": tile[2], "num_warps": tile[3],
              "TABLE": "table" in variants, "DIAG": "diag" in variants}
    consts |= {"PRODUCER_REGS": bwd.PRODUCER_REGS} if ws else {}
    consts |= {"COEF": "coef" in variants} if kernel_name == "dq" else {}
    return compile_report(kernel, signature(kernel_name, D, tile, dtype), consts, tile[3])


def compile_check(dims, kernels=KERNELS, tiles=None, causal=(1, 0), phases=PHASES, dtypes=("bf16",),
                  variants=(frozenset(),)) -> int:
    """Compile every variant, print one table row each; returns the number that failed."""
    import triton

    print(f"triton {triton.__version__}, sm_90a")
    print("| kernel | D | tile (MxNxstagesxwarps) | variants | causal | phase | dtype | regs | spill st/ld B | smem B | "
          "bar.sync | wgmma.wait | ex2 | cos |\n|---|---:|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    failed = 0
    for name, D, tile, var, c, phase, dt in itertools.product(kernels, dims, tiles or [None], variants, causal,
                                                              phases, dtypes):
        tile, var = tile or (bwd.DQ_TILES if name == "dq" else bwd.DKDV_TILES)[D], resolve(var, D)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        label = (f"| {name} | {D} | {'x'.join(map(str, tile))} | {'+'.join(sorted(var)) or 'none'} | {c} | {phase} "
                 f"| {dt} |")
        if report_variant(label, partial(compile_variant, name, D, tile, bool(c), phase == "linear", dtype, var),
                          extra=("ex2", "cos")) is None:
            failed += 1
    return failed


def time_fwd_bwd(D: int, N: int, variants: frozenset[str] | None, **tiles) -> float:
    """Median ms of one causal forward + backward at B = 65536 // N, H = 16, bf16: the Gluon TAPA
    kernels with `variants` (and tiles: dkdv_tile / dq_tile), or (None) SDPA cuDNN's
    (`gluon_compile_bwd.time_fwd_bwd`, on the same inputs)."""
    from phaselab.kernels.tapa import gluon_tapa

    if variants is None:
        return gluon_compile_bwd.time_fwd_bwd(D, N, None)
    q, k, v, do = gluon_compile_bwd.fwd_bwd_inputs(D, N)

    def fn():
        out, lse = gluon_tapa.gluon_tapa_fwd(q, k, v, causal=True, variants=variants)
        bwd.gluon_tapa_bwd(do, q, k, v, out, lse, causal=True, variants=variants, **tiles)
    return median_ms(fn)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=list(bwd.DKDV_TILES))
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--tiles", type=parse_tile, nargs="+", default=None,
                   help="BLOCK_MxBLOCK_NxSTAGESxWARPS (default: the module's tile of each kernel and D)")
    p.add_argument("--causal", type=int, nargs="+", default=[1, 0], choices=[0, 1])
    p.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    p.add_argument("--variants", type=parse_variants, nargs="+", default=[None],
                   help="combinations of " + ", ".join(gluon_tapa_host.VARIANTS) + " joined by '+', 'none' or "
                   "'default' (each head dim's DEFAULT_VARIANTS)")
    p.add_argument("--time", type=int, nargs="+", default=[], metavar="N",
                   help="on an sm_90 GPU, also time forward + backward of each variant at these lengths")
    args = p.parse_args(argv)
    require_gluon("gluon_compile_tapa_bwd.py", bwd.gluon_common.IMPORT_ERROR)
    failed = compile_check(args.dims, args.kernels, args.tiles, args.causal, args.phases, args.dtypes, args.variants)
    if failed:
        raise SystemExit(f"{failed} variant(s) failed to compile")
    # --tiles with one kernel named: time each of its tiles (the other kernel's default)
    timed_tiles = [{f"{args.kernels[0]}_tile": t} for t in args.tiles] if args.tiles and len(args.kernels) == 1 else [{}]
    for D, N in itertools.product(args.dims, args.time):
        ref = time_fwd_bwd(D, N, None)
        for var, tiles in itertools.product(args.variants, timed_tiles):
            var = resolve(var, D)
            ms = time_fwd_bwd(D, N, var, **tiles)
            label = " ".join([f"D={D} N={N}", "+".join(sorted(var)) or "none",
                              *(f"{k} {'x'.join(map(str, t))}" for k, t in tiles.items())])
            print(f"{label}: forward+backward {ms:.3f} ms, cuDNN {ref:.3f} ms, x cuDNN {ms / ref:.2f}")


if __name__ == "__main__":
    main()
