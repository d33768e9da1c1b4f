"""Offline instruction audit of the fused attention kernels: compiles one kernel for
sm_90a with the Triton in this environment (no GPU needed: Triton's bundled ptxas/cuobjdump), then
prints ptxas' register and spill counts and the opcode histogram of each of the kernel's block loops
(unmasked first, then masked), per iteration and per score of a thread.

On the H200 these kernels are latency-bound (Nsight Compute, benchmarks/results/ncu/pope-16k.csv;
kernels/attention/README.md: one 8-warp CTA per SM at 255 registers, issue slots 29-34 % busy, warps stalled on barriers,
fixed-latency dependencies and shared-memory queues); fewer instructions per score shorten the
dependent chains, but A/B timing on the device decides (benchmarks/attention_ablation.py).

Usage:
    python benchmarks/kernel_sass.py pope_fwd --block 256 64 --warps 8
    python benchmarks/kernel_sass.py pope_dq --block 128 64 --warps 8 --exp2 poly
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path

from phaselab.kernels.common.options import DEFAULT_OPTIONS, EXP2_CHOICES, AttentionOptions

# kernel name -> (module, kernel, constexprs besides BLOCK_M/BLOCK_N, pointer element types)
KERNELS = {
    "pope_fwd": ("pope.triton_pope", "pope_fwd_kernel", {"D": 64, "BLOCK_D": 64, "CAUSAL": True, "AMP": 0,
                                                     "HAS_DELTA": True, "FAST": True, "DOT_PREC": "tf32"}),
    "pope_dkdv": ("pope.triton_pope", "pope_bwd_kernel_dkdv", {"D": 64, "BLOCK_D": 64, "CAUSAL": True, "AMP": 0,
                                                           "HAS_DELTA": True, "FAST": True, "DOT_PREC": "tf32"}),
    "pope_dq": ("pope.triton_pope", "pope_bwd_kernel_dq", {"D": 64, "BLOCK_D": 64, "CAUSAL": True, "AMP": 0,
                                                       "HAS_DELTA": True, "FAST": True, "DOT_PREC": "tf32"}),
    "tapa_fwd": ("tapa.triton_tapa", "tapa_fwd_kernel", {"D": 128, "DA": 64, "DP": 64, "BLOCK_A": 64, "BLOCK_P": 64,
                                                     "BLOCK_V": 128, "CAUSAL": True, "LINEAR": False, "FAST": True,
                                                     "DOT_PREC": "tf32"}),
    "tapa_dkdv": ("tapa.triton_tapa", "tapa_bwd_kernel_dkdv", {"D": 128, "DA": 64, "DP": 64, "BLOCK_A": 64,
                                                           "BLOCK_P": 64, "BLOCK_V": 128, "CAUSAL": True,
                                                           "LINEAR": False, "FAST": True, "DOT_PREC": "tf32"}),
    "tapa_dq": ("tapa.triton_tapa", "tapa_bwd_kernel_dq", {"D": 128, "DA": 64, "DP": 64, "BLOCK_A": 64, "BLOCK_P": 64,
                                                       "BLOCK_V": 128, "CAUSAL": True, "LINEAR": False, "FAST": True,
                                                       "DOT_PREC": "tf32"}),
}
BF16_PTRS = {"q", "k", "v", "o", "do", "dq", "dk", "dv"}
FP32_PTRS = {"lse", "dlt", "inv_freq", "delta", "dq32", "ddelta_part"}
INT_PTRS = {"pos_q": "*i64", "pos_k": "*i64", "k_sorted": "*i32", "q_sorted": "*i32"}
FLOATS = {"qk_scale", "sm_scale", "c_a", "alpha", "k_turn", "u_max", "c1", "c2", "c3", "c4", "c5"}


def compile_sass(name: str, block_m: int, block_n: int, warps: int, stages: int, *,
                 options: AttentionOptions = DEFAULT_OPTIONS) -> tuple[str, str]:
    """(ptxas -v report, SASS text) of kernel `name` for sm_90a with `options`' exp2 and
    tapa_series (the kernels' EXP2 and SERIES constexprs)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mod_name, kernel_name, consts = KERNELS[name]
    module = importlib.import_module(f"phaselab.kernels.{mod_name}")
    jit_fn = getattr(module, kernel_name).fn  # under the autotuner
    names = list(inspect.signature(jit_fn.fn).parameters)
    consts = {**consts, "BLOCK_M": block_m, "BLOCK_N": block_n, "EXP2": options.exp2_code, "AUTOTUNE": False}
    if "ATOMIC_DQ" in names:
        consts["ATOMIC_DQ"] = False
    if "SERIES" in names:
        consts["SERIES"] = options.tapa_series
    sig, attrs = {}, {}
    for i, arg in enumerate(names):
        if arg in consts:
            sig[arg] = "constexpr"
            continue
        sig[arg] = (INT_PTRS.get(arg) or ("*bf16" if arg in BF16_PTRS else None)
                    or ("*fp32" if arg in FP32_PTRS else None) or ("fp32" if arg in FLOATS else "i32"))
        # what the launcher specialises at run time: pointers and strides divisible by 16 elements' bytes
        if sig[arg].startswith("*") or arg.startswith("s_") and arg not in ("s_srt", "s_pqb", "s_pkb"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(jit_fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx.write_text(kernel.asm["ptx"])
        report = subprocess.run([str(bin_dir / "ptxas"), "-v", "-arch=sm_90a", str(ptx), "-o", str(cubin)],
                                capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    return report, sass


INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\S*)[^;]*;")
BACK_BRANCH = re.compile(r"/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?BRA\s+(?:\S+\s+)?0x([0-9a-f]+)")


def loops(sass: str, min_len: int = 200) -> list[list[tuple[int, str, str]]]:
    """Instructions (address, opcode, modifiers) of each backward-branch range of at least
    `min_len` instructions, in code order (the kernels' unmasked block loop comes first, its masked
    twin second)."""
    instrs = [(int(a, 16), op, mods) for a, op, mods in INSTR.findall(sass)]
    spans = sorted((int(dst, 16), int(src, 16)) for src, dst in BACK_BRANCH.findall(sass) if int(dst, 16) < int(src, 16))
    bodies = [[ins for ins in instrs if lo <= ins[0] <= hi] for lo, hi in spans]
    return [body for body in bodies if len(body) >= min_len]


def opcode_mix(body: list[tuple[int, str, str]], modifiers: bool = False) -> collections.Counter:
    """A loop's instructions by opcode, or (modifiers) by opcode and modifiers (FMUL.RZ, MUFU.COS)."""
    return collections.Counter(op + mods if modifiers else op for _, op, mods in body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernel", choices=sorted(KERNELS))
    p.add_argument("--block", type=int, nargs=2, default=(128, 64), metavar=("BLOCK_M", "BLOCK_N"))
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--exp2", choices=EXP2_CHOICES, default="mufu", help="AttentionOptions.exp2")
    p.add_argument("--no-tapa-series", action="store_true", help="AttentionOptions.tapa_series=False")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("kernel_sass.py compiles for sm_90a: unset TRITON_INTERPRET")
    options = AttentionOptions(exp2=args.exp2, tapa_series=not args.no_tapa_series)
    report, sass = compile_sass(args.kernel, *args.block, args.warps, args.stages, options=options)
    # registers, spills, and ptxas' performance warnings (C7515: serialised wgmma, kernels/attention/README.md)
    print("\n".join(line.strip() for line in report.splitlines()
                    if "registers" in line or "spill" in line or "Performance Loss" in line))
    tile = args.block[0] * args.block[1] / (32 * args.warps)  # scores per thread per iteration
    for i, loop in enumerate(loops(sass)):
        ops = opcode_mix(loop)
        print(f"\nloop {i}: {len(loop)} instructions per iteration, {len(loop) / tile:.1f} per score per thread "
              f"({tile:.0f} scores per thread per iteration)")
        print("| opcode | per iteration | per score |\n|---|---:|---:|")
        for op, n in ops.most_common(args.top):
            print(f"| {op} | {n} | {n / tile:.2f} |")

if __name__ == "__main__":
    main()
