"""Where the fused kernels' time goes: time PoPE / TAPA variants that leave one stage
of the per-element / per-score math out, at fixed tile configs, and take differences.

The variants compute WRONG attention: they exist only to place time inside a kernel (hardware
counters say how busy each pipe is and why warps stall, not what one stage costs: "time variants
that leave one stage out"). Each runs in its own
process, because a variant swaps one of the kernels' jit helpers before the first compile
(Triton binds a kernel's global helpers when it compiles).

    pope full           the shipped kernel (softplus amplitude, fp32 angle, range reduction, cos/sin)
    pope no-softplus    amplitude "identity" (a real code path: mu = x)
    pope no-trig        cos/sin replaced by the unreduced angle itself (no MUFU, no reduction)
    pope no-transform   both: a flash attention with a 2D-wide QK and D-wide PV, in our structure
    tapa full           the shipped kernel
    tapa no-cos         the phase's cos/sin replaced by the phase in turns (no reduction, no MUFU)
    tapa no-weight      |m - n|^alpha replaced by the constant k_turn
    tapa plain          both: the two dots and the softmax only

Usage (on a GPU machine; benchmarks/README.md):
    benchmarks/run_on_gpu.sh attention_ablation --lengths 4096 16384 --out ablation-h200
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

import triton
import triton.language as tl

from phaselab.kernels.pope import phase as pope_phase
from phaselab.kernels.pope import triton_pope
from phaselab.kernels.tapa import phase as tapa_phase
from phaselab.kernels.tapa import triton_tapa
from phaselab.kernels.tapa.phase import _tapa_turns

VARIANTS = {"pope": ["full", "no-softplus", "no-trig", "no-transform"],
            "tapa": ["full", "no-cos", "no-weight", "plain"]}
# the tiles the H200 autotuner chose for these shapes when benchmarks/results/ablation-h200.md was
# measured (TAPA's dQ has picked 64x32 since the 32-key tiles joined the autotune list:
# benchmarks/results/attention-h200-tapa-d128.md)
CONFIGS = {"pope": {"pope_fwd_kernel": (256, 64, 8, 2), "pope_bwd_kernel_dkdv": (64, 128, 8, 2),
                    "pope_bwd_kernel_dq": (128, 64, 8, 2)},
           "tapa": {"tapa_fwd_kernel": (128, 64, 8, 2), "tapa_bwd_kernel_dkdv": (32, 64, 4, 2),
                    "tapa_bwd_kernel_dq": (64, 64, 4, 2)}}
HEAD_DIM = {"pope": 64, "tapa": 128}


@triton.jit
def _angle_only(pos, theta, bias, FAST: tl.constexpr):
    """PoPE no-trig: the fp32 angle in place of both cos and sin."""
    a = pos.to(tl.float32)[:, None] * theta[None, :] - bias[None, :]
    return a, a


@triton.jit
def _turns_const(b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                 MASKED: tl.constexpr, SERIES: tl.constexpr, FAST: tl.constexpr):
    """TAPA no-weight: k_turn everywhere instead of k_turn |m - n|^alpha."""
    return k_turn + (b_pq.to(tl.float32)[:, None] - b_pk.to(tl.float32)[None, :]) * 0.0


@triton.jit
def _score_no_cos(b_qa, b_qp, sq, b_ka, b_kp, sk, b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn,
                  u_max, c1, c2, c3, c4, c5, LINEAR: tl.constexpr, MASKED: tl.constexpr,
                  SERIES: tl.constexpr, FAST: tl.constexpr, DOT_PREC: tl.constexpr):
    """TAPA no-cos: both dots and the weight, the phase in turns in place of cos and sin."""
    b_a = tl.dot(b_qa, tl.trans(b_ka), input_precision=DOT_PREC)
    b_phi = tl.dot(b_qp, tl.trans(b_kp), input_precision=DOT_PREC)
    w = _tapa_turns(b_pq, b_pk, q_lo, q_hi, k_lo, k_hi, alpha, k_turn, u_max, c1, c2, c3, c4, c5,
                    MASKED, SERIES, FAST)
    t = w * b_phi
    return b_a, w, t, t


def patch(family: str, variant: str) -> dict:
    """Fix the tile configs and swap the helpers for `variant`; returns extra keyword arguments
    for the attention call. Must run before the first launch in this process."""
    global _tapa_turns
    modules = {"pope": triton_pope, "tapa": triton_tapa}
    for name, (bm, bn, warps, stages) in CONFIGS[family].items():
        getattr(modules[family], name).configs = [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)]
    if family == "pope":
        if variant in ("no-trig", "no-transform"):
            triton_pope._phase_cos_sin = _angle_only
            pope_phase._phase_cos_sin = _angle_only
        return {"amplitude": "identity"} if variant in ("no-softplus", "no-transform") else {}
    if variant in ("no-weight", "plain"):
        tapa_phase._tapa_turns = _turns_const
        _tapa_turns = _turns_const
    if variant in ("no-cos", "plain"):
        tapa_phase._tapa_score = _score_no_cos
        triton_tapa._tapa_score = _score_no_cos
    return {}


def time_length(family: str, N: int, extra: dict, warmup: int, iters: int) -> dict:
    """fwd and fwd+bwd milliseconds of one variant at length N (65536 tokens, H = 16, bf16), on
    the kernels' measured tiles (`AttentionOptions()`: no autotuning)."""
    import math

    import torch
    from attention import time_ms

    from phaselab.kernels.common.score_mod import pope_inv_freq
    from phaselab.kernels.pope.function import pope_attention
    from phaselab.kernels.tapa.function import tapa_attention

    D, H, B = HEAD_DIM[family], 16, max(1, 65536 // N)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    do = torch.randn_like(q)
    pos = torch.arange(N, device="cuda")[None]
    delta = (-2 * math.pi * torch.rand(H, D, device="cuda")).requires_grad_()
    inv_freq = pope_inv_freq(D).cuda()

    def call():
        if family == "pope":
            return pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=inv_freq, delta_HD=delta, **extra)
        return tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5)

    def fwd():
        with torch.no_grad():
            call()

    def fwd_bwd():
        for t in (q, k, v, delta):
            t.grad = None
        call().backward(do)

    row = {"N": N, "B": B, "H": H, "D": D, "fwd_ms": time_ms(fwd, warmup, iters),
           "fwd_bwd_ms": time_ms(fwd_bwd, warmup, iters)}
    row["bwd_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
    return row


def child(family: str, variant: str, lengths: list[int], warmup: int, iters: int) -> None:
    """Time one variant in this process (fixed configs, autotuning off); prints one JSON row per N."""
    extra = patch(family, variant)
    for N in lengths:
        row = {"family": family, "variant": variant, **time_length(family, N, extra, warmup, iters)}
        print(json.dumps(row), flush=True)


def checksum(family: str, variant: str) -> dict:
    """Sums of squares of one variant's output and dq, and of the float64 reference output, on a
    tiny causal case (N=37, D=32) on the CPU under TRITON_INTERPRET=1: the smoke test's evidence
    that "full" is the shipped kernel and that a variant's helpers were swapped in."""
    import torch

    from phaselab.kernels.attention import reference
    from phaselab.kernels.common.score_mod import ScoreMod, pope_inv_freq
    from phaselab.kernels.pope.function import pope_attention
    from phaselab.kernels.tapa.function import tapa_attention

    extra = patch(family, variant)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 32, generator=gen).requires_grad_() for _ in range(3))
    pos, inv_freq, delta = torch.arange(37)[None], pope_inv_freq(32), torch.full((2, 32), -0.5)
    if family == "pope":
        out = pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=inv_freq, delta_HD=delta, **extra)
        mod, scale = ScoreMod(kind="pope", params={"inv_freq": inv_freq, "delta": delta}), 32 ** -0.5
    else:
        out = tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5)
        mod, scale = ScoreMod(kind="tapa", params={"alpha": 0.1, "theta": 0.5}), 1.0
    ref = reference.attention(q.detach(), k.detach(), v.detach(), pos_q_BT=pos, pos_k_BS=pos, scale=scale,
                              score_mod=mod, compute_dtype=torch.float64)
    out.sum().backward()
    return {"out": float(out.double().square().sum()), "dq": float(q.grad.double().square().sum()),
            "reference_out": float(ref.double().square().sum())}


def table(rows: list[dict]) -> str:
    full = {(r["family"], r["N"]): r for r in rows if r["variant"] == "full"}
    out = ["| family | N | variant | fwd ms | bwd ms | fwd+bwd ms | fwd saved | bwd saved |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = full.get((r["family"], r["N"]))
        saved = [f"{1 - r[k] / f[k]:.0%}" if f else "-" for k in ("fwd_ms", "bwd_ms")]
        out.append(f"| {r['family']} | {r['N']} | {r['variant']} | {r['fwd_ms']:.2f} | {r['bwd_ms']:.2f} | "
                   f"{r['fwd_bwd_ms']:.2f} | {saved[0]} | {saved[1]} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=["pope", "tapa"], choices=list(VARIANTS))
    p.add_argument("--variants", nargs="+", default=None, help="default: all of each family")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--child", nargs=2, metavar=("FAMILY", "VARIANT"), help=argparse.SUPPRESS)
    p.add_argument("--checksum", nargs=2, metavar=("FAMILY", "VARIANT"),
                   help="print one variant's output checksum on a tiny CPU case (TRITON_INTERPRET=1)")
    p.add_argument("--out", type=str, default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    if args.child:
        child(*args.child, args.lengths, args.warmup, args.iters)
        return
    if args.checksum:
        print(json.dumps(checksum(*args.checksum)))
        return
    rows = []
    for family in args.families:
        for variant in args.variants or VARIANTS[family]:
            if variant not in VARIANTS[family]:
                continue
            cmd = [sys.executable, __file__, "--child", family, variant, "--warmup", str(args.warmup),
                   "--iters", str(args.iters), "--lengths", *map(str, args.lengths)]
            res = subprocess.run(cmd, check=False, capture_output=True, text=True)
            if res.returncode != 0:
                print(f"{family} {variant} failed:\n{res.stderr[-3000:]}", flush=True)
                continue
            rows += [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    import torch

    meta = {"card": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "torch": torch.__version__, "triton": __import__("triton").__version__,
        "command": "python benchmarks/attention_ablation.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "configs": {f: {k: list(v) for k, v in c.items()} for f, c in CONFIGS.items()}, "dtype": "bf16", "causal": True}
    print(table(rows))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        md = "\n".join(f"- {k}: {v}" for k, v in meta.items())
        Path(args.out + ".md").write_text(f"# Attention ablation (wrong results by design; timing only)\n\n{md}\n\n"
                                          f"{table(rows)}")


if __name__ == "__main__":
    main()
