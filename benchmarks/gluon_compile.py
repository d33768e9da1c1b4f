"""Offline compile check of the Gluon Hopper flash forward (kernels/flash/gluon_hopper.py): compiles
each variant for sm_90a with the Triton in this environment (no GPU needed: Triton's bundled
ptxas), then prints ptxas' registers, spills and shared memory per variant, and the CTA barriers
(bar.sync) and wgmma waits in its PTX.

The GPU machine runs Triton 3.6.0, whose Gluon API differs from later releases; check against it
where the local Triton is another version, e.g. with a 3.6.0 install on PYTHONPATH:

    PYTHONPATH=/tmp/triton36 python benchmarks/gluon_compile.py
    python benchmarks/gluon_compile.py --dims 128 --tiles 128x64x2x8 128x128x2x8 --causal 1

On an sm_90 GPU, `--time N [N ...]` also times each variant's forward (bf16, H = 16, 65536 tokens
a batch, CUDA events, median of 30) against SDPA cuDNN at those lengths: the tile sweep behind
gluon_hopper.TILES.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from functools import partial
from pathlib import Path

import kernel_sass  # the sibling script (benchmarks/ is on sys.path)
import torch

from phaselab.kernels.flash import gluon_hopper


def signature(kernel, D: int, tile: tuple[int, int, int, int], dtype: torch.dtype, ws: bool) -> tuple[dict, dict]:
    """(signature, constexprs) of one variant, from descriptors over small CPU tensors (the shapes
    are run-time values; only the block shapes and layouts enter the signature)."""
    from triton.runtime.jit import mangle_type

    block_m, block_n, stages, warps = tile
    q = torch.zeros(1, 1, 256, D, dtype=dtype)
    descs = gluon_hopper.descriptors(q, q, q, block_m, block_n)
    ptr = mangle_type(q)
    sig = {"q_desc": mangle_type(descs[0]), "k_desc": mangle_type(descs[1]), "v_desc": mangle_type(descs[2]),
           "o_ptr": ptr, "lse_ptr": "*fp32", "T": "i32", "S": "i32", "H": "i32", "GROUP": "i32", "qk_scale": "fp32"}
    consts = {"STAGES": stages, "num_warps": warps}
    if ws:
        consts["PRODUCER_REGS"] = gluon_hopper.PRODUCER_REGS
    return sig, consts


def compile_report(kernel, sig: dict, consts: dict, num_warps: int, maxnreg: int | None = None) -> dict:
    """Compile one Gluon kernel for sm_90a (``sig``: argument types, ``consts``: constexpr values;
    ``maxnreg``: a register cap a thread, as the launch option) and read ptxas' report: registers,
    spill bytes, shared memory, and counts in its PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = kernel.arg_names
    sig = {n: ("constexpr" if n in consts else sig[n]) for n in names}
    src = GluonASTSource(kernel, sig, constexprs={(names.index(n),): c for n, c in consts.items()})
    options = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptx_text = compiled.asm["ptx"]
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(ptx_text)
        report = subprocess.run([str(ptxas), "-v", "-arch=sm_90a", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
                                capture_output=True, text=True, check=True).stderr
        sass = sass_listing(ptxas.parent / "cuobjdump", Path(tmp) / "k.cubin")
    bodies = key_block_loops(sass)
    regs = re.findall(r"Used (\d+) registers", report)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"regs": max(map(int, regs)) if regs else None,
            "spill_st": sum(int(s) for s, _ in spill), "spill_ld": sum(int(ld) for _, ld in spill),
            "smem": compiled.metadata.shared, "bar_sync": len(re.findall(r"\bbar\.sync\b|barrier\.sync", ptx_text)),
            "wgmma_wait": len(re.findall(r"wgmma\.wait_group", ptx_text)),
            "ex2": len(re.findall(r"ex2\.approx", ptx_text)), "cos": len(re.findall(r"cos\.approx", ptx_text)),
            "warnings": [ln.strip() for ln in report.splitlines() if "Performance" in ln or "warning" in ln],
            "loops": loop_counts(sass, bodies), "opcodes": loop_opcodes(bodies)}


def sass_listing(cuobjdump: Path, cubin: Path) -> str:
    """A cubin's SASS; empty where Triton ships no cuobjdump."""
    if not cuobjdump.is_file():
        return ""
    return subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def key_block_loops(sass: str) -> list[list[tuple[int, str, str]]]:
    """The instructions (address, opcode, modifiers) of each innermost SASS loop that issues wgmma
    (HGMMA), in code order: the key-block loops of these kernels (`kernel_sass.loops`' backward-
    branch ranges, less the branches back from after the kernel's EXIT: an mbarrier wait's retry)."""
    found = [body for body in kernel_sass.loops(sass)
             if any(op == "HGMMA" for _, op, _ in body) and not any(op == "EXIT" for _, op, _ in body)]
    spans = [(body[0][0], body[-1][0]) for body in found]
    return [body for body, (lo, hi) in zip(found, spans)
            if not any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in spans)]


def loop_counts(sass: str, bodies: list | None = None) -> list[tuple[int, int, int]]:
    """(instructions, of which MUFU, of which skippable) per iteration of each `key_block_loops`
    loop (bodies: those loops, where the caller has them already). Skippable: jumped over by a forward branch within the loop (gluon_hopper._rescale's), so
    an iteration that takes every such branch issues instructions - skippable. An offline proxy of
    their cost where the non-tensor pipes, not the tensor cores, bound a tile (issue slots per
    score)."""
    branches = [(int(src, 16), int(dst, 16)) for src, dst in kernel_sass.BACK_BRANCH.findall(sass)]
    loops = []
    for body in key_block_loops(sass) if bodies is None else bodies:
        lo, hi = body[0][0], body[-1][0]
        skips = [(src, dst) for src, dst in branches if lo <= src < dst <= hi]
        skippable = sum(any(src < addr < dst for src, dst in skips) for addr, _, _ in body)
        loops.append((len(body), sum(op == "MUFU" for _, op, _ in body), skippable))
    return loops


def loop_opcodes(bodies: list) -> list[collections.Counter]:
    """Each of `key_block_loops`' loops by opcode and modifiers (`kernel_sass.opcode_mix`), static:
    where the phase math of a score goes (kernels/attention/README.md)."""
    return [kernel_sass.opcode_mix(body, modifiers=True) for body in bodies]


def compile_variant(D: int, tile: tuple[int, int, int, int], causal: bool, dtype: torch.dtype = torch.bfloat16,
                    ws: bool = False) -> dict:
    """ptxas' report of one forward variant for sm_90a (`compile_report`)."""
    kernel = gluon_hopper.gluon_flash_fwd_ws_kernel if ws else gluon_hopper.gluon_flash_fwd_kernel
    sig, consts = signature(kernel, D, tile, dtype, ws)
    return compile_report(kernel, sig, consts | {"CAUSAL": causal}, tile[3])


def median_ms(fn) -> float:
    """Median of 30 CUDA-event timings of ``fn()`` after 5 warm-up calls."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def time_forward(D: int, N: int, tile: tuple[int, int, int, int] | None, causal: bool, ws: bool = False) -> float:
    """Median ms of one forward (tile None: SDPA cuDNN) at B = 65536 // N, H = 16, bf16."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(max(1, 65536 // N), 16, N, D, generator=gen, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    if tile is None:
        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        def fn():
            gluon_hopper.gluon_flash_fwd(q, k, v, scale=D**-0.5, causal=causal, tile=tile, warp_specialize=ws)
    return median_ms(fn)


def require_gluon(script: str, import_error: str | None) -> None:
    """Exit with the reason where these scripts cannot compile for sm_90a."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit(f"{script} compiles for sm_90a: unset TRITON_INTERPRET")
    if import_error is not None:
        raise SystemExit(f"no Gluon here: {import_error}")


def print_row(label: str, r: dict, extra: tuple[str, ...] = (), opcodes: bool = False) -> None:
    """One table row of a compile report (``extra``: more of its counts, e.g. ex2, cos), then
    ptxas' warnings, the key-block loops' counts and (``opcodes``) each loop's opcodes."""
    cells = [r["regs"], f"{r['spill_st']}/{r['spill_ld']}", r["smem"], r["bar_sync"], r["wgmma_wait"],
             *(r[k] for k in extra)]
    print(f"{label} " + " | ".join(map(str, cells)) + " |")
    for w in r["warnings"]:
        print(f"  ptxas: {w}")
    if r.get("loops"):
        print("  SASS key-block loops, instructions (MUFU; skippable) an iteration: "
              + ", ".join(f"{n} ({mufu}" + (f"; {skip} skippable)" if skip else ")") for n, mufu, skip in r["loops"]))
    for i, ops in enumerate(r.get("opcodes", []) if opcodes else []):
        print(f"  loop {i + 1} by opcode: " + ", ".join(f"{op} {n}" for op, n in ops.most_common()))


def report_variant(label: str, compile_fn, extra: tuple[str, ...] = (), opcodes: bool = False) -> dict | None:
    """Compile one variant (``compile_fn()`` returns a `compile_report`) and print its table row
    (``label`` is the row's first cells), or the error in the row's place; None when it failed,
    so that a script reports every variant before it fails."""
    try:
        r = compile_fn()
    except Exception as exc:  # noqa: BLE001 - report every variant, then fail
        print(f"{label} error: {str(exc).strip().splitlines()[-1][:200]} |")
        return None
    print_row(label, r, extra, opcodes)
    return r


def parse_tile(text: str) -> tuple[int, int, int, int]:
    parts = tuple(int(x) for x in text.split("x"))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"tile {text!r}: BLOCK_MxBLOCK_NxSTAGESxWARPS, e.g. 128x128x2x8")
    return parts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=list(gluon_hopper.gluon_common.HEAD_DIMS))
    p.add_argument("--tiles", type=parse_tile, nargs="+", default=None,
                   help="BLOCK_MxBLOCK_NxSTAGESxWARPS (default: gluon_hopper.TILES[D], TILES_WS[D] for ws)")
    p.add_argument("--causal", type=int, nargs="+", default=[1, 0], choices=[0, 1])
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    p.add_argument("--variants", nargs="+", default=["pipelined", "ws"], choices=["pipelined", "ws"])
    p.add_argument("--time", type=int, nargs="+", default=[], metavar="N",
                   help="on an sm_90 GPU, also time each variant's forward at these lengths against cuDNN")
    args = p.parse_args(argv)
    require_gluon("gluon_compile.py", gluon_hopper.gluon_common.IMPORT_ERROR)
    import triton

    print(f"triton {triton.__version__}, sm_90a")
    print("| variant | D | tile (MxNxstagesxwarps) | causal | dtype | regs | spill st/ld B | smem B | bar.sync | "
          "wgmma.wait |\n|---|---:|---|---:|---|---:|---:|---:|---:|---:|")
    failed = 0
    for variant in args.variants:
        for D in args.dims:
            for tile in args.tiles or [(gluon_hopper.TILES_WS if variant == "ws" else gluon_hopper.TILES)[D]]:
                for causal in args.causal:
                    for dt in args.dtypes:
                        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
                        label = f"| {variant} | {D} | {'x'.join(map(str, tile))} | {causal} | {dt} |"
                        if report_variant(label, partial(compile_variant, D, tile, bool(causal), dtype,
                                                                         ws=variant == "ws")) is None:
                            failed += 1
                            continue
                        for N in args.time if dt == "bf16" else []:
                            ms, ref = time_forward(D, N, tile, bool(causal), variant == "ws"), \
                                time_forward(D, N, None, bool(causal))
                            print(f"  N={N}: {ms:.3f} ms, cuDNN {ref:.3f} ms, x cuDNN {ms / ref:.2f}")
    if failed:
        raise SystemExit(f"{failed} variant(s) failed to compile")


if __name__ == "__main__":
    main()
