"""Offline compile check of the Gluon Hopper flash backward (kernels/flash/gluon_hopper_bwd.py):
compiles the dK/dV and dQ kernels for sm_90a with the Triton in this environment (no GPU needed:
Triton's bundled ptxas), then prints ptxas' registers, spills and shared memory per variant.

The GPU machine runs Triton 3.6.0, whose Gluon API differs from later releases; check against it
where the local Triton is another version, e.g. with a 3.6.0 install on PYTHONPATH:

    PYTHONPATH=/tmp/triton36 python benchmarks/gluon_compile_bwd.py
    python benchmarks/gluon_compile_bwd.py --dims 128 --kernels dkdv --tiles 64x128x2x8 128x128x2x8
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch

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


def _ptxas(ptx_text: str) -> str:
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(ptx_text)
        return subprocess.run([str(ptxas), "-v", "-arch=sm_90a", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, check=True).stderr


def compile_variant(kernel_name: str, D: int, tile: tuple[int, int, int, int], causal: bool,
                    dtype: torch.dtype = torch.bfloat16) -> dict:
    """ptxas' report of one variant for sm_90a: registers, spill bytes, shared memory, PTX counts."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ws = kernel_name.endswith("-ws")
    kernel = {"dq": bwd.gluon_flash_bwd_dq_kernel, False: bwd.gluon_flash_bwd_dkdv_kernel,
              True: bwd.gluon_flash_bwd_dkdv_ws_kernel}["dq" if kernel_name == "dq" else ws]
    sig = _signature(kernel_name, D, tile, dtype)
    consts = {"CAUSAL": causal, "STAGES": tile[2], "num_warps": tile[3]}
    if kernel_name != "dq":  # "-atomic": the dK/dV kernel that also adds dQ shares; "-ws": producer warp
        consts["ATOMIC_DQ"] = "-atomic" in kernel_name
    if ws:
        consts["PRODUCER_REGS"] = bwd.PRODUCER_REGS
    names = kernel.arg_names
    sig = {n: ("constexpr" if n in consts else sig[n]) for n in names}
    src = GluonASTSource(kernel, sig, constexprs={(names.index(n),): c for n, c in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": tile[3]})
    ptx_text = compiled.asm["ptx"]
    report = _ptxas(ptx_text)
    regs = re.findall(r"Used (\d+) registers", report)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"regs": max(map(int, regs)) if regs else None,
            "spill_st": sum(int(s) for s, _ in spill), "spill_ld": sum(int(ld) for _, ld in spill),
            "smem": compiled.metadata.shared, "bar_sync": len(re.findall(r"\bbar\.sync\b|barrier\.sync", ptx_text)),
            "wgmma_wait": len(re.findall(r"wgmma\.wait_group", ptx_text)),
            "warnings": [ln.strip() for ln in report.splitlines() if "Performance" in ln or "warning" in ln]}


def parse_tile(text: str) -> tuple[int, int, int, int]:
    parts = tuple(int(x) for x in text.split("x"))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"tile {text!r}: BLOCK_MxBLOCK_NxSTAGESxWARPS, e.g. 64x128x2x8")
    return parts


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
                        try:
                            r = compile_variant(name, D, tile, bool(c), dtype)
                        except Exception as exc:  # noqa: BLE001 - report every variant, then fail
                            failed += 1
                            print(f"{label} error: {str(exc).strip().splitlines()[-1][:200]} | | | | |")
                            continue
                        print(f"{label} {r['regs']} | {r['spill_st']}/{r['spill_ld']} | {r['smem']} | "
                              f"{r['bar_sync']} | {r['wgmma_wait']} |")
                        for w in r["warnings"]:
                            print(f"  ptxas: {w}")
    return failed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=list(bwd.gluon_common.HEAD_DIMS))
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--tiles", type=parse_tile, nargs="+", default=None,
                   help="BLOCK_MxBLOCK_NxSTAGESxWARPS (default: the module's tile of each kernel and D)")
    p.add_argument("--causal", type=int, nargs="+", default=[1, 0], choices=[0, 1])
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("gluon_compile_bwd.py compiles for sm_90a: unset TRITON_INTERPRET")
    if bwd.gluon_common.IMPORT_ERROR is not None:
        raise SystemExit(f"no Gluon here: {bwd.gluon_common.IMPORT_ERROR}")
    failed = compile_check(args.dims, args.kernels, args.tiles, args.causal, args.dtypes)
    if failed:
        raise SystemExit(f"{failed} variant(s) failed to compile")


if __name__ == "__main__":
    main()
