"""The PoPE `cudnn` backward's own knobs, measured side by side on one GPU:

1. the standalone chain-rule kernel (`triton_expand.pope_chain_kernel`: d q_hat -> dq and
   d delta, d k_hat -> dk) over rows per program x warps x volatile loads, in GB/s of the bytes it
   must move (read d x_hat 2D wide, x; write dx), beside the prologue (`pope_expand_kernel`: read
   x, write x_hat) at the same shape;
2. `pope_cudnn.GROUP_BYTES` (how many heads one cuDNN backward call takes): forward+backward
   milliseconds and peak memory against SDPA cuDNN at the same shape (the bound is 1.5x its peak).

Usage (benchmarks/README.md):
    benchmarks/run_on_gpu.sh pope_backward_tuning --out pope-backward-tuning-h200
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys
from pathlib import Path

import attention
import torch
import triton

from phaselab.kernels.common.score_mod import pope_inv_freq
from phaselab.kernels.pope import cudnn as pope_cudnn
from phaselab.kernels.pope import triton_expand


def chain_rows(B: int, H: int, N: int, D: int, warmup: int, iters: int) -> list[dict]:
    """One row per chain launch variant, plus the prologue's row (variant "expand")."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, H, N, D, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dqh, dkh = (torch.randn(B, H, N, 2 * D, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    pos = torch.arange(N, device="cuda")[None]
    inv_freq = pope_inv_freq(D).cuda()
    delta = -2 * math.pi * torch.rand(H, D, device="cuda")
    unit = B * H * N * D * 2  # bytes of one [B, H, N, D] bf16 tensor
    rows = []

    def expand():
        triton_expand.pope_expand_fwd(q, k, pos, pos, inv_freq, delta)

    ms = attention.time_ms(expand, warmup, iters)
    rows.append({"variant": "expand", "ms": ms, "gbs": 6 * unit / ms / 1e6})
    for r, w, vol in itertools.product((16, 32, 64, 128), (2, 4, 8), (True, False)):
        launch = {"rows": r, "num_warps": w, "volatile": vol}

        def chain(launch=launch):
            triton_expand.pope_expand_bwd(dqh, dkh, q, k, pos, pos, inv_freq, delta, launch=launch)

        try:
            ms = attention.time_ms(chain, warmup, iters)
        except (RuntimeError, triton.runtime.errors.OutOfResources) as exc:  # a launch the compiler refuses
            rows.append({"variant": json.dumps(launch), "status": f"error: {str(exc).splitlines()[0][:100]}"})
            continue
        rows.append({"variant": json.dumps(launch), "ms": ms, "gbs": 8 * unit / ms / 1e6})
    return rows


def group_rows(lengths: list[int], tokens: int, H: int, D: int, sizes: list[int], warmup: int, iters: int) -> list[dict]:
    rows, shipped = [], pope_cudnn.GROUP_BYTES
    for N in lengths:
        B = max(1, tokens // N)
        base = attention.bench_one("sdpa-cudnn", B, H, N, D, "fwd+bwd", warmup, iters)
        for mib in sizes:
            pope_cudnn.GROUP_BYTES = mib * 2**20
            res = attention.bench_one("pope-cudnn", B, H, N, D, "fwd+bwd", warmup, iters)
            torch.cuda.empty_cache()
            groups = len(pope_cudnn.head_groups(B, H, N, N, D, 2))
            row = {"N": N, "B": B, "group_mib": mib, "groups": groups, **{k: res.get(k) for k in ("status", "ms", "peak_gib", "host_ms")}}
            if res.get("status") == "ok" and base.get("status") == "ok":
                row |= {"x_cudnn": res["ms"] / base["ms"], "peak_x_cudnn": res["peak_gib"] / base["peak_gib"],
                        "cudnn_ms": base["ms"], "cudnn_peak_gib": base["peak_gib"], "cudnn_host_ms": base["host_ms"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    pope_cudnn.GROUP_BYTES = shipped
    return rows


def markdown(meta: dict, chain: list[dict], groups: list[dict]) -> str:
    lines = ["# PoPE cudnn backward: chain kernel launch and head-group size", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "| variant | ms | GB/s |", "|---|---:|---:|"]
    for r in chain:
        lines.append(f"| {r['variant']} | {r['ms']:.3f} | {r['gbs']:.0f} |" if "ms" in r
                     else f"| {r['variant']} | {r['status']} | |")
    lines += ["", ("| N | B | GROUP_BYTES MiB | groups | fwd+bwd ms | x cuDNN | peak GiB | peak x cuDNN | host ms "
              "(cuDNN's) |"), "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in groups:
        if "x_cudnn" in r:
            lines.append(f"| {r['N']} | {r['B']} | {r['group_mib']} | {r['groups']} | {r['ms']:.3f} | "
                         f"{r['x_cudnn']:.2f} | {r['peak_gib']:.2f} | {r['peak_x_cudnn']:.2f} | "
                         f"{r['host_ms']:.3f} ({r['cudnn_host_ms']:.3f}) |")
        else:
            lines.append(f"| {r['N']} | {r['B']} | {r['group_mib']} | {r['groups']} | {r['status']} | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chain-length", type=int, default=4096)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--group-mib", type=int, nargs="+", default=[128, 256, 384, 512])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/pope_backward_tuning.py needs a CUDA GPU")
    meta = {"card": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "command": "python benchmarks/pope_backward_tuning.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "shape": f"bf16, H={args.heads}, D={args.head_dim}, {args.tokens} tokens a batch, causal",
            "timing": f"CUDA events, median of {args.iters} after {args.warmup} warm-up"}
    B = max(1, args.tokens // args.chain_length)
    chain = chain_rows(B, args.heads, args.chain_length, args.head_dim, args.warmup, args.iters)
    groups = group_rows(args.lengths, args.tokens, args.heads, args.head_dim, args.group_mib, args.warmup, args.iters)
    md = markdown(meta, chain, groups)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "chain": chain, "groups": groups}, indent=1))
        Path(args.out + ".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
