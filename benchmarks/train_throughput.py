"""Training throughput: tokens/s and MFU of the 124M OpenWebText-shape model for RoPE,
PoPE and TAPA on Tiny Shakespeare (GPT-2 BPE), sequence length 1024, bf16 autocast.

Every encoding runs the real training loop, ``workloads.train.loop.train`` with ``TorchEngine``
(batch fetch, H2D copy, autocast forward, NaN/Inf check, backward, clip, AdamW, PoPE projection),
one process, one device. A tracker logs every step and synchronises the device before it
timestamps, so step k's time is the interval between two complete steps. The first ``--warmup``
steps (Triton autotune / compilation, allocator growth, ``--compile``) are excluded.

FLOPs per trained token (a multiply-add = 2 FLOPs), "model FLOPs" as in PaLM's MFU:
    dense     6·N, N = Transformer.num_params() (the tied embedding counted once: it is the
              lm_head matmul; the input lookup costs no FLOPs; norms and PoPE δ are negligible)
    attention n_layer · n_head · c · T · D / 2 with c the per-head forward+backward coefficient of
              L²D WITHOUT recompute from MATH §6 (plain/RoPE 12, PoPE 18: its QK is 2D wide,
              TAPA 12; its cos per score is not a FLOP), halved for causal masking.
MFU = FLOPs per token · tokens/s / peak. The peak is the card's dense bf16 peak (``--peak-tflops``,
default 989.5 = H200 SXM dense bf16); a FlashAttention-style backward also recomputes S
(MATH §6: 14 / 22 L²D), which costs time but is not counted, as MFU requires.

Backends: ``rope`` runs on sdpa; ``pope`` and ``tapa`` on triton on CUDA (the fused kernels,
kernels/attention/function.py), else the reference; ``--encodings pope:sdpa`` picks one
explicitly. Any other registered encoding (an entry point, or ``module:Class`` with its folder on
PYTHONPATH: the examples xPos and KERPLE) runs on ``auto`` on CUDA (KERPLE's and ALiBi's distance
tables on the bias-table kernel, kernels/relbias). The backend that ran (read from the built model)
is recorded in every row.

Usage (on a GPU machine: benchmarks/README.md, "Training throughput"):
    benchmarks/run_on_gpu.sh train_throughput --compile --warmup 15 --out train-h200
    python benchmarks/train_throughput.py --tiny --device cpu --out /tmp/tt   # CPU smoke (seconds)
    PYTHONPATH=examples/encodings python benchmarks/train_throughput.py --compile --warmup 15 \
        --encodings rope,phaselab_xpos:XPos,phaselab_kerple:Kerple,alibi --out train-h200-examples
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import step_profile
import torch

from phaselab.kernels.common.options import options_used, reset_options
from phaselab.workloads.config import to_dict
from phaselab.workloads.data import DataConfig, TextConfig, build_dataset
from phaselab.workloads.models.presets import preset
from phaselab.workloads.train.config import TrainConfig
from phaselab.workloads.train.loop import TorchEngine, resolve_device, train
from phaselab.workloads.train.optim import build_optimizer

H200_DENSE_BF16_TFLOPS = 989.5
ATTN_FWD_BWD_COEF = {"pope": 18}  # MATH §6, "forward + backward without recompute"; others 12
DEFAULT_BACKEND = {"rope": ("sdpa", "sdpa"), "pope": ("triton", "reference"), "tapa": ("triton", "reference")}


@dataclass(frozen=True, kw_only=True)
class Case:
    """One measured configuration: an encoding on an attention backend."""

    encoding: str
    backend: str

    @property
    def key(self) -> str:
        return f"{self.encoding}:{self.backend}"


def parse_cases(text: str, device: torch.device) -> list[Case]:
    """``rope,pope,tapa`` or ``pope:sdpa,...`` -> Cases (default backends by device, module doc).
    Any kind the encoding registry names is accepted (docs/EXTENDING.md): an entry point (``kerple``)
    or ``"module:Class"`` (``phaselab_kerple:Kerple``, its folder on PYTHONPATH), with a backend
    after a last ``:`` (``phaselab_kerple:Kerple:triton``); such kinds default to ``auto`` on CUDA."""
    from phaselab.kernels.registry import AUTO, registered
    from phaselab.workloads.models import pe_registry

    cases = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        enc, _, backend = item.rpartition(":")
        if not enc or (backend not in registered() and backend != AUTO):
            enc, backend = item, ""
        if enc not in DEFAULT_BACKEND:
            try:
                pe_registry.target(enc)
            except pe_registry.EncodingError as err:
                raise ValueError(f"--encodings: {err}") from None
        cuda_pick, other_pick = DEFAULT_BACKEND.get(enc, (AUTO, "reference"))
        cases.append(Case(encoding=enc, backend=backend or (cuda_pick if device.type == "cuda" else other_pick)))
    if not cases:
        raise ValueError(f"--encodings {text!r} names no encoding")
    return cases


def flops_per_token(cfg: Any, n_params: int, seq_len: int) -> dict[str, float]:
    """Model FLOPs per trained token (module docstring): {"dense", "attention", "total"}."""
    coef = ATTN_FWD_BWD_COEF.get(cfg.pe.kind, 12)
    attention = cfg.n_layer * cfg.n_head * coef * seq_len * cfg.head_dim / 2
    dense = 6.0 * n_params
    return {"dense": dense, "attention": float(attention), "total": dense + attention}


class StepClock:
    """Tracker that timestamps each logged training step: on CUDA with an event recorded on the
    stream (no synchronise: a per-step sync of the benchmark's own would idle the GPU while the
    host prepares the next step, a cost real runs do not pay), resolved by `finish()`; on the CPU
    with the host clock."""

    def __init__(self, device: torch.device, profiler: Any = None) -> None:
        self.device, self.times, self.losses, self.peak_gib = device, {}, {}, None
        self.profiler = profiler  # step_profile's profiler, stepped once per training step
        self._events: dict[int, Any] = {}

    def finish(self) -> None:
        """Turn the recorded CUDA events into seconds (one synchronise, after the run)."""
        if not self._events:
            return
        torch.cuda.synchronize(self.device)
        first = min(self._events)
        for step, event in self._events.items():
            self.times[step] = self._events[first].elapsed_time(event) / 1e3

    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        # the loop resets CUDA's peak counter after each log step and logs the window's peak, so
        # the run's peak is the max over the logged values (max_memory_allocated at the end would
        # only see the last step)
        if "train/peak_mem_gib" in metrics:
            self.peak_gib = max(self.peak_gib or 0.0, float(metrics["train/peak_mem_gib"]))
        if "train/loss" in metrics:
            if self.device.type == "cuda":
                self._events[step] = torch.cuda.Event(enable_timing=True)
                self._events[step].record()
            else:
                self.times[step] = time.perf_counter()
            self.losses[step] = float(metrics["train/loss"])
            if self.profiler is not None:
                self.profiler.step()

    def log_params(self, params: Any) -> None: ...
    def log_records(self, records: Any) -> None: ...
    def log_artifact(self, path: Any, *, name: str) -> None: ...
    def set_tags(self, tags: Any) -> None: ...


def window_stats(times: dict[int, float], *, warmup: int, tokens_per_step: int,
                 last: int | None = None) -> dict[str, float]:
    """Throughput over steps warmup+1 .. last (default: the last logged; 1-based step numbers as
    logged by the loop): step k's time is times[k] - times[k-1]; the first ``warmup`` steps are
    excluded (and any profiled steps after ``last``)."""
    last = max(times) if last is None else last
    if warmup < 1 or last <= warmup:
        raise ValueError(f"need warmup >= 1 and more steps than warmup, got warmup={warmup}, steps={last}")
    step_s = [times[k] - times[k - 1] for k in range(warmup + 1, last + 1)]
    seconds = times[last] - times[warmup]
    return {"steps_measured": len(step_s), "seconds": seconds,
            "tokens_per_s": len(step_s) * tokens_per_step / seconds,
            "step_ms_median": 1e3 * statistics.median(step_s), "step_ms_max": 1e3 * max(step_s)}


def measure(case: Case, args: argparse.Namespace, device: torch.device, dataset: Any) -> dict[str, Any]:
    """Train ``args.warmup + args.steps`` steps of one case; returns its result row."""
    from phaselab.workloads.models.transformer import Transformer

    cfg = preset(args.preset, block_size=args.seq_len, pe={"kind": case.encoding},
                 attention={"backend": case.backend, "autotune": args.autotune})
    if cfg.vocab_size < dataset.vocab_size:
        raise ValueError(f"preset {args.preset} has vocab_size {cfg.vocab_size} < the data's {dataset.vocab_size}")
    timed = args.warmup + args.steps
    extra = args.profile + 1 if args.profile else 0  # profiled steps after the timed window (+1 warm-up)
    tcfg = TrainConfig(steps=timed + extra, batch_size=args.batch_size, grad_accum=args.grad_accum,
                       lr=args.lr, min_lr=args.lr, warmup=0, schedule="constant", eval_every=0,
                       eval_batches=1, ckpt_every=0, log_every=1, precision=args.precision,
                       compile=args.compile, seed=0, device=str(device))
    torch.manual_seed(0)
    model = Transformer(cfg, device_type=device.type).to(device)
    backends = sorted({block.attn.backend.name for block in model.h})
    n_params = model.num_params()
    engine = TorchEngine(model, build_optimizer(model, tcfg.optim), device=device, precision=tcfg.precision,
                         grad_clip=tcfg.grad_clip, grad_accum=tcfg.grad_accum, compile=tcfg.compile,
                         fused_loss=args.loss == "fused")
    profiler = step_profile.make_profiler(device, skip=timed, steps=args.profile) if args.profile else None
    clock = StepClock(device, profiler)
    reset_options()   # what the kernels ran with (e.g. TAPA's core, tl or gluon) is this case's alone
    with profiler if profiler is not None else contextlib.nullcontext():
        train(engine, dataset, tcfg, tracker=clock, start_step=0, save=lambda step, metrics: None)
    clock.finish()
    tokens_per_step = args.batch_size * args.seq_len
    stats = window_stats(clock.times, warmup=args.warmup, tokens_per_step=tokens_per_step, last=timed)
    flops = flops_per_token(cfg, n_params, args.seq_len)
    row = {"case": case.key, "encoding": case.encoding, "backend_requested": case.backend,
           "backend_ran": ",".join(backends), "n_params": n_params, "tokens_per_step": tokens_per_step,
           **stats, "flops_per_token": flops,
           "model_tflops_per_s": flops["total"] * stats["tokens_per_s"] / 1e12,
           "mfu": flops["total"] * stats["tokens_per_s"] / (args.peak_tflops * 1e12),
           "loss_first": clock.losses[1], "loss_last": clock.losses[max(clock.losses)],
           "peak_mem_gib": clock.peak_gib if device.type == "cuda" else None,
           "model": to_dict(cfg), "kernels_ran": options_used(), "error": None}
    if profiler is not None:
        last = max(clock.times)
        wall_ms = 1e3 * (clock.times[last] - clock.times[last - args.profile]) / args.profile
        row["profile"] = step_profile.summary(profiler, device=device, steps=args.profile, wall_ms_per_step=wall_ms)
    del engine, model
    return row


def card_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def versions() -> dict[str, str | None]:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | backend ran | tokens/s | step ms (median) | model TFLOP/s | MFU | attn share | peak GiB "
            "| loss first→last |\n|---|---|---:|---:|---:|---:|---:|---:|---|")
    lines = [head]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['case']} | — | error: {r['error'][:120]} | | | | | | |")
            continue
        f = r["flops_per_token"]
        mem = "—" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
        lines.append(f"| {r['case']} | {r['backend_ran']} | {r['tokens_per_s']:,.0f} | {r['step_ms_median']:.1f} "
                     f"| {r['model_tflops_per_s']:.3g} | {100 * r['mfu']:.3g} % | "
                     f"{100 * f['attention'] / f['total']:.1f} % | {mem} | {r['loss_first']:.3f}→{r['loss_last']:.3f} |")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    return (f"# Training throughput: {m['preset']}, T={m['seq_len']}, {m['precision']} "
            f"({m['card']})\n\n"
            f"- date: {m['date']}\n- command: `{m['command']}`\n- commit: {m.get('commit', 'unknown')}\n"
            f"- versions: {json.dumps(m['versions'])}\n"
            f"- data: {m['data']}; batch {m['batch_size']} x {m['seq_len']} tokens per step, "
            f"grad_accum {m['grad_accum']}, torch.compile {m['compile']}, "
            f"Triton autotune {m['triton_autotune']}, loss {m.get('loss', 'torch')}\n"
            f"- {m['steps']} timed steps after {m['warmup']} warm-up steps (excluded)\n"
            f"- MFU against {m['peak_tflops']} TFLOP/s; FLOPs per token = 6·N + causal attention "
            f"fwd+bwd without recompute (MATH §6: 12 L²D per head, PoPE 18), see the module docstring\n\n"
            f"{table(result['rows'])}\n" + profiles(result["rows"]))


def profiles(rows: list[dict[str, Any]]) -> str:
    """The --profile sections (empty without it)."""
    parts = [step_profile.markdown(r["case"], r["profile"]) for r in rows if r.get("profile")]
    return "".join(f"\n{p}\n" for p in parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--encodings", default="rope,pope,tapa", help="rope,pope,tapa, any registered kind (kerple, phaselab_kerple:Kerple); ENC:BACKEND to pick one")
    p.add_argument("--preset", default="owt-124m")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per optimiser step")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=50, help="timed steps (after the warm-up)")
    p.add_argument("--warmup", type=int, default=10, help="excluded steps (Triton compile, autotune, --compile)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--precision", choices=["bf16", "fp32", "auto"], default="bf16")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (TrainConfig.compile)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--loss", choices=["fused", "torch"], default="fused",
                   help="fused: linear + cross-entropy kernel on CUDA (kernels/loss); torch: the logits path")
    p.add_argument("--autotune", action="store_true",
                   help="model.attention.autotune: time every Triton config in the first (warm-up) steps")
    p.add_argument("--peak-tflops", type=float, default=H200_DENSE_BF16_TFLOPS,
                   help="the card's dense bf16 peak (default: H200, 989.5)")
    p.add_argument("--tokenizer", choices=["gpt2", "char"], default="gpt2", help="Tiny Shakespeare tokenizer")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed steps, profile N more (torch.profiler; OUT.md gets where a step's "
                        "time goes; the timed numbers are not affected)")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke: preset tiny, char tokens, T=64, batch 4, 3 steps after 1 warm-up")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    if args.tiny:   # char-level: the GPT-2 vocabulary's lm_head alone takes ~0.5 s a step on 2 CPU cores
        args.preset, args.seq_len, args.batch_size, args.steps, args.warmup = "tiny", 64, 4, 3, 1
        args.tokenizer = "char"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    cases = parse_cases(args.encodings, device)
    data_cfg = DataConfig(kind="text", block_size=args.seq_len, text=TextConfig(tokenizer=args.tokenizer))
    dataset = build_dataset(data_cfg)
    command = " ".join(shlex.quote(a) for a in ["python", "benchmarks/train_throughput.py",
                                                   *(sys.argv[1:] if argv is None else argv)])
    meta = {"card": card_name(device), "device": str(device), "date": datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"), "command": command, "commit": os.environ.get("PHASELAB_GIT_COMMIT", "unknown"),
            "versions": versions(), "preset": args.preset,
            "seq_len": args.seq_len, "batch_size": args.batch_size, "grad_accum": args.grad_accum,
            "steps": args.steps, "warmup": args.warmup, "precision": args.precision, "compile": args.compile,
            "loss": args.loss,
            "triton_autotune": args.autotune,
            "peak_tflops": args.peak_tflops, "data": f"{dataset.name} ({len(dataset.tokens('train')):,} train tokens)",
            "mfu_flops": "6*N + n_layer*n_head*c*T*D/2 per token, c = 12 (rope, tapa) / 18 (pope)"}
    rows = []
    for case in cases:
        try:
            row = measure(case, args, device, dataset)
        except Exception as exc:  # noqa: BLE001 - one failing case (OOM, compile) must not lose the others
            row = {"case": case.key, "encoding": case.encoding, "backend_requested": case.backend,
                   "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        shown = {k: row.get(k) for k in ("case", "backend_ran", "tokens_per_s", "mfu", "step_ms_median", "error")}
        print(f"[train_throughput] {json.dumps(shown)}", flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result = {"meta": meta, "rows": rows}
    print(table(rows))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{out}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        Path(f"{out}.md").write_text(markdown(result))
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
