"""Offline compile check of the Gluon Hopper flash backward (kernels/flash/gluon_hopper_bwd.py):
compiles the dK/dV and dQ kernels for sm_90a with the Triton in this environment (no GPU needed:
Triton's bundled ptxas), then prints ptxas' registers, spills and shared memory per variant.

The GPU machine runs Triton 3.6.0, whose Gluon API differs from later releases; check against it
where the local Triton is another version, e.g. with a 3.6.0 install on PYTHONPATH:

    PYTHONPATH=/tmp/triton36 python benchmarks/gluon_compile_bwd.py
    python benchmarks/gluon_compile_bwd.py --dims 128 --kernels dkdv --tiles 64x128x2x8 128x128x2x8

On an sm_90 GPU, `--time N [N ...]` also times forward+backward (causal, bf16, H = 16, 65536 tokens
a batch, CUDA events, median of 30) against SDPA cuDNN's forward+backward on the same inputs in the
same process: the Gluon forward with each backward (the `tl` one, the Gluon deterministic one, the
Gluon atomic-dQ one and the warp-specialised dK/dV), so the ratios read directly against the target.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from gluon_compile import (  # the sibling script (benchmarks/ is on sys.path)
    compile_report,
    median_ms,
    parse_tile,
    report_variant,
    require_gluon,
)

from phaselab.kernels.flash import gluon_hopper_bwd as bwd


def _signature(kernel_name: str, D: int, tile: tuple[int, int, int, int], dtype: torch.dtype) -> dict:
    """Argument types of one variant, from descriptors over small CPU tensors (shapes are run-time
    values; only the block shapes and layouts enter the signature)."""
    from triton.runtime.jit import mangle_type

    block_m, block_n, _, _ = tile
    x = torch.zeros(1, 1, 256, D, dtype=dtype)
    qd, kd = mangle_type(bwd.descriptor(x, block_m)), mangle_type(bwd.descriptor(x, block_n))
    ptr = mangle_type(x)
    sig = {"q_desc": qd, "do_desc": qd, "k_desc": kd, "v_desc": kd, "lse_ptr": "*fp32", "dlt_ptr": "*fp32",
           "T": "i32", "S": "i32", "H": "i32", "GROUP": "i32", "qk_scale": "fp32", "sm_scale": "fp32"}
    if kernel_name == "dq":
        return {**sig, "dq_ptr": ptr}
    return {**sig, "dk_ptr": ptr, "dv_ptr": ptr, "dq_ptr": "*fp32"}


def compile_variant(kernel_name: str, D: int, tile: tuple[int, int, int, int], causal: bool,
                    dtype: torch.dtype = torch.bfloat16) -> dict:
    """ptxas' report of one backward variant for sm_90a (`gluon_compile.compile_report`)."""
    ws = kernel_name.endswith("-ws")
    kernel = {"dq": bwd.gluon_flash_bwd_dq_kernel, False: bwd.gluon_flash_bwd_dkdv_kernel,
              True: bwd.gluon_flash_bwd_dkdv_ws_kernel}["dq" if kernel_name == "dq" else ws]
    consts = {"CAUSAL": causal, "STAGES": tile[2], "num_warps": tile[3]}
    if kernel_name != "dq":  # "-atomic": the dK/dV kernel that also adds dQ shares; "-ws": producer warp
        consts["ATOMIC_DQ"] = "-atomic" in kernel_name
    if ws:
        consts["PRODUCER_REGS"] = bwd.PRODUCER_REGS
    return compile_report(kernel, _signature(kernel_name, D, tile, dtype), consts, tile[3])


KERNELS = ("dkdv", "dq", "dkdv-atomic", "dkdv-ws", "dkdv-atomic-ws")


def compile_check(dims=bwd.gluon_common.HEAD_DIMS, kernels=KERNELS, tiles=None, causal=(1, 0), dtypes=("bf16",)) -> int:
    """Compile every variant, print one table row each; returns the number that failed."""
    import triton

    print(f"triton {triton.__version__}, sm_90a")
    print("| kernel | D | tile (MxNxstagesxwarps) | causal | dtype | regs | spill st/ld B | smem B | bar.sync | "
          "wgmma.wait |\n|---|---:|---|---:|---|---:|---:|---:|---:|---:|")
    failed = 0
    for name in kernels:
        default = bwd.DQ_TILES if name == "dq" else bwd.DKDV_TILES
        for D in dims:
            for tile in tiles or [default[D]]:
                for c in causal:
                    for dt in dtypes:
                        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
                        label = f"| {name} | {D} | {'x'.join(map(str, tile))} | {c} | {dt} |"
                        if report_variant(label, partial(compile_variant, name, D, tile, bool(c), dtype)) is None:
                            failed += 1
    return failed


BACKWARDS = {"tl": {}, "gluon": {"deterministic": True}, "gluon-atomic": {"deterministic": False},
             "gluon-ws": {"deterministic": True, "warp_specialize": True}}


def fwd_bwd_inputs(D: int, N: int) -> tuple:
    """q, k, v, dO [B, 16, N, D] bf16 on the GPU, B = 65536 // N (64k tokens a batch), seed 0."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(max(1, 65536 // N), 16, N, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                 for _ in range(4))


def time_fwd_bwd(D: int, N: int, backward: str | None, causal: bool = True) -> float:
    """Median ms of forward + backward at B = 65536 // N, H = 16, bf16: SDPA cuDNN's (backward
    None) or the Gluon forward's followed by the named backward (`BACKWARDS`)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from phaselab.kernels.flash import gluon_hopper
    from phaselab.kernels.flash.triton_flash import flash_bwd

    q, k, v, do = fwd_bwd_inputs(D, N)
    if backward is None:
        q, k, v = (t.requires_grad_() for t in (q, k, v))

        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.autograd.grad(out, (q, k, v), do)
        return median_ms(fn)

    def fn():
        out, lse = gluon_hopper.gluon_flash_fwd(q, k, v, scale=D**-0.5, causal=causal)
        if backward == "tl":
            flash_bwd(do, q, k, v, out, lse, None, None, None, scale=D**-0.5, causal=causal)
        else:
            bwd.gluon_flash_bwd(do, q, k, v, out, lse, scale=D**-0.5, causal=causal, **BACKWARDS[backward])
    return median_ms(fn)


def time_table(dims, lengths) -> None:
    """One row per (D, N): cuDNN's ms, then each backward's ms and its ratio to cuDNN."""
    print("\nforward + backward, causal bf16, H = 16, 64k tokens a batch (ms; x cuDNN)")
    print("| D | N | cuDNN ms | " + " | ".join(f"gluon fwd + {b} bwd" for b in BACKWARDS) + " |")
    print("|---:|---:|---:|" + "---|" * len(BACKWARDS))
    for D in dims:
        for N in lengths:
            ref = time_fwd_bwd(D, N, None)
            cells = []
            for name in BACKWARDS:
                try:
                    ms = time_fwd_bwd(D, N, name)
                    cells.append(f"{ms:.3f} ({ms / ref:.2f}x)")
                except Exception as exc:  # noqa: BLE001 - one failing variant must not hide the others
                    cells.append(f"error: {str(exc).strip().splitlines()[-1][:80]}")
            print(f"| {D} | {N} | {ref:.3f} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=list(bwd.gluon_common.HEAD_DIMS))
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--tiles", type=parse_tile, nargs="+", default=None,
                   help="BLOCK_MxBLOCK_NxSTAGESxWARPS (default: the module's tile of each kernel and D)")
    p.add_argument("--causal", type=int, nargs="+", default=[1, 0], choices=[0, 1])
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    p.add_argument("--time", type=int, nargs="+", default=[], metavar="N",
                   help="on an sm_90 GPU, also time forward+backward at these lengths against cuDNN")
    args = p.parse_args(argv)
    require_gluon("gluon_compile_bwd.py", bwd.gluon_common.IMPORT_ERROR)
    failed = compile_check(args.dims, args.kernels, args.tiles, args.causal, args.dtypes)
    if args.time:
        time_table(args.dims, args.time)
    if failed:
        raise SystemExit(f"{failed} variant(s) failed to compile")


if __name__ == "__main__":
    main()
