"""Seed ensembles as one training step: K Indirect Indexing models stacked and vectorised.

One graph-captured ``ii-8l512`` step (8 layers x 512, batch 64 x 48, bf16) leaves most of an H200
idle between small kernels, and packing stages as processes under MPS barely helps
(``small_models.py --pack``). Here the K seeds of one grid cell train as ONE model: their
parameters are stacked ([K, ...], ``torch.func.stack_module_state``), the forward is
``torch.func.vmap(functional_call(model))`` over members, and one backward, a per-member gradient
clip and one fused AdamW over the stacked tensors complete the step, so every kernel does K
members' work for one launch.

Per encoding and K (``--ks``), one process, one GPU:
- members are built as a grid's stages would (``TrainSession``: ``seed_everything(seed)``, the
  dataset of ``data.seed = seed``, the model; the recipe of ``small_models.spec_for``), and member
  k reads its own dataset in its own seed's order (``get_batch(..., seed=k)``);
- the step: forward (vmap), loss (``logits=True``: the fused linear + cross-entropy kernel is an
  autograd Function without a vmap rule), backward, per-member clipping (each member's own total
  norm, as ``clip_grad_norm_`` computes it for one model), AdamW (fused and capturable on CUDA,
  the platform's parameter groups, lr read from a device tensor), PoPE's δ projection, losses and
  norms written to device buffers (checked for NaN/Inf on the host after each row);
- on CUDA: ``fast_step.WARMUP_STEPS`` eager steps on a side stream, then one CUDA graph capture
  (``--compile`` adds rows whose forward runs through ``torch.compile``), as ``fast_step.py`` does;
  on CPU the same step runs eagerly;
- batches: ``WINDOW`` steps of every member's batches are built once and kept on the device; the
  graph reads step ``cursor`` of them (a real engine would refill them while replaying, as
  ``fast_step.py`` does; note that a K-member step needs K batches of host Python);
- timing: CUDA events around ``--steps`` replays (perf_counter on CPU); steps/s = 1 / step time,
  member-steps/s = K x steps/s; peak memory = ``max_memory_allocated`` from building the ensemble
  to its capture and first replays (the graph's pool included), less what was allocated before
  (the K members' own models and the batches);
- parity: after ``--check-steps`` steps (warm-up and replays), member k against a single model
  trained alone from the same seed on the same batches (the platform's ``TorchEngine``, torch
  loss): max over members and parameters of |p_ens - p_single| / |p_single| (norms per tensor),
  the same for the update p - p_init, and the max relative loss difference.
- baseline: the platform's graph step of one model (``small_models.measure``, mode ``graphs``),
  run in the same process (``--baselines``); ``x platform`` = member-steps/s over its steps/s.

The Triton PoPE / TAPA kernels run under vmap through their custom ops' vmap rule (members
folded into the heads: one launch for K members, kernels/common/ops.py `fold`). An encoding whose
step fails records the error in its row, and the remaining Ks of that encoding are skipped.

Usage (GPU; results in benchmarks/results/ensemble-h200.{json,md}):
    python benchmarks/ensemble.py --out benchmarks/results/ensemble-h200
    python benchmarks/ensemble.py --device cpu --tiny --ks 1,2 --encodings rope:sdpa --out /tmp/ens
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import small_models
import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from phaselab.workloads.data import Batch, build_dataset
from phaselab.workloads.train.api import build_model, parse_spec
from phaselab.workloads.train.checkpoint import seed_everything
from phaselab.workloads.train.fast_step import WARMUP_STEPS
from phaselab.workloads.train.loop import TorchEngine, autocast_for, batch_index, resolve_device
from phaselab.workloads.train.optim import build_optimizer, is_delta, param_groups

MODEL = "ii-8l512"
ENCODINGS = "rope:sdpa,pope:triton,tapa:triton,pope:sdpa,tapa:reference"
SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
WINDOW = 16   # steps of batches kept on the device; the timed replays cycle through them


def member_spec(encoding: str, seed: int, *, steps: int, tiny: bool) -> dict[str, Any]:
    """The stage spec of seed ``seed``: small_models' II recipe with the recipe's own seeding
    (``data.seed`` and ``train.seed`` both = seed: own examples, own order, own init)."""
    spec = small_models.spec_for(MODEL, encoding, "graphs", steps=steps, tiny=tiny)
    spec["data"]["seed"] = spec["train"]["seed"] = seed
    if tiny:   # spec_for's tiny model runs the reference backend; keep the one asked for
        spec["model"]["attention"] = {"backend": encoding.partition(":")[2] or small_models.BACKEND[encoding]}
    return spec


def build_members(encoding: str, seeds: range, *, steps: int, tiny: bool, device: torch.device) -> list[tuple]:
    """(model, dataset, TrainConfig) per seed, in TrainSession's order: seed, data, model."""
    members = []
    for seed in seeds:
        parsed = parse_spec(member_spec(encoding, seed, steps=steps, tiny=tiny))
        seed_everything(parsed.train.seed)
        dataset = build_dataset(parsed.data)
        members.append((build_model(parsed, dataset, None).to(device), dataset, parsed.train))
    return members


def device_batches(members: list[tuple], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """x_WKBT, y_WKBT (int64), m_WKBT (fp32): steps 0..WINDOW-1 of every member's own batches."""
    _, dataset, cfg = members[0]
    B, T, K = cfg.micro_batch(1), dataset.block_size, len(members)
    x, y = (torch.zeros((WINDOW, K, B, T), dtype=torch.int64) for _ in range(2))
    m = torch.zeros((WINDOW, K, B, T), dtype=torch.float32)
    for s in range(WINDOW):
        for k, (_, ds, c) in enumerate(members):
            b = ds.get_batch("train", batch_index(s, 0, grad_accum=1), B, seed=c.seed)
            t = b.x_BT.shape[1]   # padding (x, y, mask = 0) leaves the masked loss unchanged
            x[s, k, :, :t], y[s, k, :, :t], m[s, k, :, :t] = b.x_BT, b.y_BT, b.mask_BT
    return x.to(device), y.to(device), m.to(device)


def clip_per_member(grads: list[Tensor], max_norm: float) -> Tensor:
    """Clip each member's gradients by ITS total norm; returns norm_K. The arithmetic of
    ``clip_grad_norm_`` on one model: each tensor's norm, the norm of those, coef = max_norm /
    (norm + 1e-6) clamped to 1; member k's tensors are the [k] slices of the stacked grads."""
    K = grads[0].shape[0]
    per_member = [[g[k] for g in grads] for k in range(K)]
    norms = torch._foreach_norm([t for ts in per_member for t in ts])   # one multi-tensor kernel
    norm_K = torch.linalg.vector_norm(torch.stack(norms).view(K, len(grads)), dim=1)
    coef_K = torch.clamp(max_norm / (norm_K + 1e-6), max=1.0)
    for k, ts in enumerate(per_member):
        torch._foreach_mul_(ts, coef_K[k])
    return norm_K


class _AfterStep(nn.Module):
    """Runs the model's own after-step hook (PoPE's in-place δ clamp) under functional_call, so
    it acts on the stacked [K, H, D] δ exactly as on one model's [H, D] (the clamp is elementwise)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self) -> None:
        self.model.after_optimizer_step()


class EnsembleStep:
    """K members as one step on stacked parameters (module docstring); ``advance`` runs one."""

    def __init__(self, models: list[nn.Module], cfg: Any, batches: tuple[Tensor, Tensor, Tensor], *,
                 device: torch.device, compile: bool = False) -> None:
        if cfg.grad_accum != 1:
            raise ValueError("the ensemble step has no accumulation loop (the II recipe uses 1)")
        self.base, self.device, self.grad_clip = models[0], device, cfg.grad_clip
        self.params, self.buffers = stack_module_state(models)   # new leaf tensors [K, ...]
        self.deltas = {"model." + n: p for n, p in self.params.items() if is_delta(n)}
        self.after = _AfterStep(self.base)
        self.optimizer = self._adamw(cfg)
        loss_K = vmap(self._member_loss, randomness="error")   # dropout is 0: no random op may run
        self.loss_K = torch.compile(loss_K) if compile else loss_K
        self.autocast = autocast_for(cfg.precision, device, cache=False)   # cache: see fast_step
        self.x, self.y, self.m = batches
        W, K = self.x.shape[:2]
        schedule = cfg.schedule_obj()
        self.lr_W = torch.tensor([schedule.lookup(s) for s in range(W)], dtype=torch.float32, device=device)
        self.loss_WK = torch.zeros((W, K), dtype=torch.float32, device=device)
        self.norm_WK = torch.zeros((W, K), dtype=torch.float32, device=device)
        self.cursor = torch.zeros(1, dtype=torch.int64, device=device)
        self.capture, self.graph, self.done = device.type == "cuda", None, 0

    def _adamw(self, cfg: Any) -> torch.optim.AdamW:
        """build_optimizer's AdamW over the platform's groups (δ, decay, no decay), each holding
        the stacked tensors of its parameters; AdamW is elementwise, so member k's slice is
        updated exactly as its own optimiser would. lr: a device tensor per group."""
        groups = [g | {"params": [self.params[n] for n in g["param_names"]]}
                  for g in param_groups(self.base, cfg.optim)]
        cuda = self.device.type == "cuda"
        opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                fused=cuda or None)
        for group in opt.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=self.device)
            group["capturable"] = cuda
        return opt

    def _member_loss(self, params: dict, buffers: dict, x_BT: Tensor, y_BT: Tensor, m_BT: Tensor) -> Tensor:
        _, loss = functional_call(self.base, (params, buffers), (x_BT,),
                                  {"targets_BT": y_BT, "loss_mask_BT": m_BT, "logits": True})
        return loss

    def _step(self) -> None:
        """One step of every member at ``cursor`` (the captured work on CUDA)."""
        i = self.cursor
        x_KBT, y_KBT, m_KBT = (t.index_select(0, i)[0] for t in (self.x, self.y, self.m))
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss_K = self.loss_K(self.params, self.buffers, x_KBT, y_KBT, m_KBT)
        loss_K.sum().backward()   # members share no parameter: d(sum)/d(member k) = d(loss_k)
        grads = [p.grad for p in self.params.values()]
        norm_K = clip_per_member(grads, self.grad_clip if self.grad_clip > 0 else float("inf"))
        lr = self.lr_W.index_select(0, i)[0]
        for group in self.optimizer.param_groups:
            group["lr"].copy_(lr * group.get("lr_mult", 1.0))
        self.optimizer.step()
        if self.deltas:
            functional_call(self.after, self.deltas, ())
        self.loss_WK.index_copy_(0, i, loss_K.detach().float()[None])
        self.norm_WK.index_copy_(0, i, norm_K.float()[None])
        self.cursor.add_(1)

    def advance(self) -> None:
        """One step: eager on CPU; on CUDA eager warm-up steps on a side stream, then the capture
        (which does not execute, so it is replayed once), then replays (as GraphEngine)."""
        if self.done and self.done % self.x.shape[0] == 0:
            self.cursor.zero_()   # the window's batches again
        self.done += 1
        if not self.capture:
            self._step()
        elif self.graph is None and self.done <= WARMUP_STEPS:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._step()
            torch.cuda.current_stream(self.device).wait_stream(side)
        else:
            self._replay()

    def _replay(self) -> None:
        """Capture the step on the first call (after the warm-up), then replay it."""
        if self.graph is None:
            torch.cuda.synchronize(self.device)
            self.graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)   # gradients live in the graph's pool
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self._step()
        self.graph.replay()


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def parity(ens: EnsembleStep, members: list[tuple], singles: list[nn.Module], n: int) -> dict[str, Any]:
    """Member k after the ensemble's first n steps against ``singles[k]`` (a copy of member k's
    initial model) trained alone for n steps by the platform's TorchEngine on the same batches."""
    cfg, schedule = members[0][2], members[0][2].schedule_obj()
    loss_nK = ens.loss_WK[:n].cpu()
    worst = {"param_rel_diff": 0.0, "update_rel_diff": 0.0, "loss_rel_diff": 0.0}
    for k, (single, (init, _, _)) in enumerate(zip(singles, members)):
        engine = TorchEngine(single, build_optimizer(single, cfg.optim), device=ens.device,
                             precision=cfg.precision, grad_clip=cfg.grad_clip, grad_accum=1, fused_loss=False)
        for s in range(n):
            loss = engine.micro_step(Batch(ens.x[s, k], ens.y[s, k], ens.m[s, k]), step=s, last=True)
            (value,), _ = engine.optimizer_step(schedule.lookup(s), [loss], step=s)
            worst["loss_rel_diff"] = max(worst["loss_rel_diff"], abs(float(loss_nK[s, k]) - value) / abs(value))
        p0 = {name: p.detach() for name, p in init.named_parameters()}
        for name, p in single.named_parameters():
            e = ens.params[name][k].detach()
            worst["param_rel_diff"] = max(worst["param_rel_diff"], _rel(e, p.detach()))
            worst["update_rel_diff"] = max(worst["update_rel_diff"], _rel(e - p0[name], p.detach() - p0[name]))
    return worst | {"steps": n, "grad_norms_first_step": ens.norm_WK[0].tolist(), "grad_clip": cfg.grad_clip}


def time_steps(ens: EnsembleStep, n: int) -> float:
    """Seconds per step over n steps (CUDA events around the replays; the host never waits)."""
    if ens.device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(n):
            ens.advance()
        return (time.perf_counter() - t0) / n
    torch.cuda.synchronize(ens.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        ens.advance()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / n


def measure_k(members: list[tuple], batches: tuple, K: int, *, compile: bool, args: argparse.Namespace) -> dict:
    """One row: the first K members as one ensemble (parity, then timed steps)."""
    cfg, dev = members[0][2], next(members[0][0].parameters()).device
    gc.collect()   # the previous row's ensemble and graph pool
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0   # members, batches
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ens = EnsembleStep([m for m, _, _ in members[:K]], cfg, tuple(t[:, :K] for t in batches),
                           device=dev, compile=compile)
        for _ in range(args.check_steps):
            ens.advance()
    peak = (torch.cuda.max_memory_allocated(dev) - before) / 2**30 if dev.type == "cuda" else None
    check = parity(ens, members[:K], [copy.deepcopy(m) for m, _, _ in members[:K]], args.check_steps)
    seconds = time_steps(ens, args.steps)
    if not bool(torch.isfinite(ens.loss_WK).all() and torch.isfinite(ens.norm_WK).all()):
        raise FloatingPointError("a non-finite loss or gradient norm in the timed steps")
    fallbacks = sorted({str(w.message).split("batching rule for ")[-1].split(".")[0]
                        for w in caught if "batching rule" in str(w.message)})
    return {"K": K, "captured": ens.graph is not None, "step_ms": seconds * 1e3, "steps_per_s": 1 / seconds,
            "member_steps_per_s": K / seconds, "peak_mem_gib": peak, "parity": check, "loss_mean": float(ens.loss_WK.mean()),
            "vmap_fallbacks": fallbacks, "error": None}


def run_encoding(encoding: str, ks: list[int], mode: str, args: argparse.Namespace) -> list[dict]:
    """Rows of one encoding for every K; an error (e.g. no vmap rule) ends the encoding."""
    rows, members, device = [], [], resolve_device(args.device)
    head = {"encoding": encoding, "mode": mode}
    for K in ks:
        try:   # members are built as they are needed: a failing encoding costs one
            members += build_members(encoding, range(len(members), K), steps=args.steps, tiny=args.tiny,
                                     device=device)
            batches = device_batches(members, device)
            row = head | measure_k(members, batches, K, compile=mode.endswith("compiled"), args=args)
        except Exception as exc:  # noqa: BLE001 (recorded, e.g. no vmap rule; larger Ks would fail alike)
            rows.append(head | {"K": K, "error": f"{type(exc).__name__}: {str(exc)[:600]}"})
            break
        rows.append(row)
        print(f"[ensemble] {json.dumps(row)}", flush=True)
    return rows


def baseline(pe: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """The platform's single-model step: small_models' row (real loop, GraphEngine)."""
    cuda = resolve_device(args.device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    row = small_models.measure(MODEL, pe, mode, steps=args.baseline_steps, tiny=args.tiny, device=args.device)
    return row | {"peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def add_ratios(rows: list[dict], bases: list[dict]) -> None:
    """x K=1: member-steps/s over the K=1 row of the same encoding and mode; x platform: over the
    platform's single-model step of the same pe (graphs; graphs-compiled for compiled rows)."""
    ones = {(r["encoding"], r["mode"]): r["member_steps_per_s"] for r in rows if r.get("K") == 1 and not r["error"]}
    plat = {(b["pe"], b["mode"]): b["steps_per_s"] for b in bases}
    for r in rows:
        if r["error"]:
            continue
        one, base = ones.get((r["encoding"], r["mode"])), plat.get((r["encoding"].partition(":")[0], r["mode"]))
        r["x_k1"] = r["member_steps_per_s"] / one if one else None
        r["x_platform"] = r["member_steps_per_s"] / base if base else None


def _f(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(rows: list[dict], bases: list[dict], meta: dict) -> str:
    lines = [f"# Seed ensembles as one step ({meta['card']}, {meta['date']})", "",
             (f"Command: `{meta['command']}`; commit {meta['commit']}; torch {meta['torch']}, "
             f"triton {meta['triton']}, CUDA {meta['cuda']}; {MODEL}, II recipe, {meta['precision']}; "
             f"ensemble SDPA backend: {meta['sdpa_backend']}."), "",
             "Platform single-model step (`small_models.measure`, one stage, real loop):", "",
             "| pe | backend | step | steps/s | peak GiB |", "|---|---|---|---:|---:|"]
    lines += [f"| {b['pe']} | {b['backend']} | {b['mode']} | {_f(b['steps_per_s'], '.1f')} | "
              f"{_f(b['peak_mem_gib'], '.2f')} |" for b in bases]
    lines += ["", ("| encoding | step | K | step ms | steps/s | member-steps/s | x K=1 | x platform | "
              "peak GiB | param / update / loss rel diff | vmap fallbacks |"),
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['encoding']} | {r['mode']} | {r['K']} | skipped: {r['error'][:300]} "
                         "| | | | | | | |")
            continue
        p = r["parity"]
        lines.append(f"| {r['encoding']} | {r['mode']} | {r['K']} | {r['step_ms']:.3f} | {r['steps_per_s']:.1f} | "
                     f"{r['member_steps_per_s']:.1f} | {_f(r['x_k1'], '.2f')} | {_f(r['x_platform'], '.2f')} | "
                     f"{_f(r['peak_mem_gib'], '.2f')} | {p['param_rel_diff']:.1e} / {p['update_rel_diff']:.1e} / "
                     f"{p['loss_rel_diff']:.1e} | {', '.join(r['vmap_fallbacks'])} |")
    return "\n".join(lines) + "\n"


def metadata(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    cuda = resolve_device(args.device).type == "cuda"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent, check=False)
    return {"card": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
            "date": datetime.datetime.now(datetime.UTC).date().isoformat(), "torch": torch.__version__,
            "triton": triton_version, "cuda": torch.version.cuda, "precision": "bf16" if cuda else "fp32",
            "env": {k: v for k, v in os.environ.items() if k.startswith("PHASELAB_")},
            "command": "python benchmarks/ensemble.py " + " ".join(shlex.quote(a) for a in argv),
            "sdpa_backend": args.sdpa_backend,
            "commit": os.environ.get("PHASELAB_GIT_COMMIT") or git.stdout.strip() or "unknown"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,2,4,8", help="ensemble sizes")
    ap.add_argument("--encodings", default=ENCODINGS, help="comma list of pe:backend")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per row")
    ap.add_argument("--check-steps", type=int, default=5, help="steps of the parity check (<= WINDOW)")
    ap.add_argument("--compile", action="store_true", help="also rows with the forward under torch.compile")
    ap.add_argument("--baselines", default="rope", help="pe list of the platform single-model rows ('' none)")
    ap.add_argument("--baseline-steps", type=int, default=400)
    ap.add_argument("--sdpa-backend", default="any", choices=["any", *SDPA_BACKENDS],
                    help="restrict the ensemble rows' SDPA to one backend (the baselines keep the default)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: small_models' tiny model, fp32")
    ap.add_argument("--out", required=True, type=Path, help="path prefix of the .json and .md")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if not 1 <= args.check_steps <= WINDOW:
        ap.error(f"--check-steps must be in [1, {WINDOW}]")
    ks, modes = [int(k) for k in args.ks.split(",")], ["graphs"] + (["graphs-compiled"] if args.compile else [])
    bases = [baseline(pe, mode, args) for mode in modes for pe in args.baselines.split(",") if pe]
    only = args.sdpa_backend != "any"
    with sdpa_kernel(SDPA_BACKENDS[args.sdpa_backend]) if only else contextlib.nullcontext():
        rows = [r for mode in modes for enc in args.encodings.split(",") for r in run_encoding(enc, ks, mode, args)]
    add_ratios(rows, bases)
    meta = metadata(args, argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "baselines": bases, "rows": rows}, indent=1))
    table = markdown(rows, bases, meta)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
