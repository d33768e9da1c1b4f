"""Attention kernel benchmark (EXPERIMENTS §3.6): fused PoPE / TAPA vs PyTorch SDPA.

Methods, each timed forward and forward+backward (CUDA events, median of `--iters` after
`--warmup`):
    sdpa-flash     F.scaled_dot_product_attention, FLASH_ATTENTION backend (FlashAttention-2)
    sdpa-cudnn     the same, CUDNN_ATTENTION backend
    pope-fused     phaselab's Triton PoPE kernel (raw D-wide q/k, delta learnable), impl="fused"
    pope-unfused   pope_reference.pope_expand (2D-wide q/k in HBM) + SDPA flash with v zero-padded to 2D
    pope-expand    phaselab's expand path, impl="expand": Triton prologue (2D-wide q_hat/k_hat in
                   HBM) + the Triton flash core (q/k 2D wide, v D wide) + the Triton chain rule
    pope-cudnn     phaselab's impl="cudnn" (the `triton` backend's default where it runs): the same
                   prologue and chain rule around cuDNN's core with v D wide, out and lse saved, the
                   backward by head groups (kernels/pope/cudnn.py)
    pope-expand-cudnn  the same prologue and chain rule around SDPA cuDNN, v zero-padded to 2D
    pope-expand-cudnn-dv  the same with v D wide (no padding): cuDNN's attention supports a value
                   head dim other than q's and k's; an "error" row says torch would not route it
    pope-expand-gluon  the same prologue and chain rule around the Gluon core (flash-gluon) at
                   2D, v zero-padded to 2D (the core takes one head dim); sm_90 only, else an error row
    pope-expand-flex   the same prologue and chain rule around compiled FlexAttention (v D wide;
                   compiled once per length and mode, the compile excluded from the timing)
    flash-plain    the Triton flash core on plain q, k, v (D wide, index-causal): the skeleton
                   the PoPE expand path runs on, against cuDNN / FlashAttention-2
    flash-gluon    the Gluon Hopper forward of the same core (kernels/flash/gluon_hopper.py: TMA,
                   async wgmma, FA3's intra-warpgroup overlap); its fwd+bwd row runs the backward
                   chosen per head dim (gluon_hopper_bwd.BACKWARD_BY_D: the Triton one at D=64, the Gluon
                   one at 128) on the Gluon forward's out and lse; sm_90 only, else an error row
    flex-plain     compiled FlexAttention, causal block mask, no score_mod (the score-mod baseline)
    flex-alibi     the same with ALiBi as a score_mod (fixed slopes: 2**(-8j/H))
    flex-learned   the same with a score_mod reading a learnable per-head slope (requires_grad): the
                   captured-gradient path (11.7x / 823x cuDNN at 4k on an H200, torch 2.11; slow, not in the set)
    relbias-alibi  phaselab's bias-table kernel (kernels/relbias) with ALiBi's fixed table
    relbias-learned  the same with a KERPLE-log table of learnable r1, r2 (requires_grad): the table
                   built in torch inside the timed call, its gradient reduced by the kernel
    (`--methods distance-bias` runs sdpa-cudnn, flex-plain, flex-alibi, relbias-alibi, relbias-learned)
    tapa-fused     phaselab's Triton `tl` TAPA kernels (alpha 0.1, theta 0.5, phase_scale 2 pi)
    tapa-fused-atomic  the same with deterministic=False (dQ by fp32 atomics in one backward kernel)
    tapa-gluon     phaselab's Gluon Hopper TAPA kernels, forward and backward (kernels/tapa/gluon_tapa.py,
                   gluon_tapa_bwd.py), as the model runs them (index positions declared, `trivial_pos`);
                   sm_90 only, else an error row
    tapa-material  the reference (fp32 logits materialised) where it fits in memory
    tapa-public    the TAPA authors' forward-only Triton kernel (AIMRelease/tapa-attention,
                   `tapa_attention_triton`, theta 0.5, alpha 0.1, their default 32 x 32 tiles), loaded
                   at run time from the checkout named by --tapa-public DIR (none of its code is
                   ours or committed); forward rows only, its fwd+bwd rows say "forward only"
TFLOP/s count each method's real FLOPs (MATH §6): plain 4/14 L^2 D, PoPE 6/22 (every PoPE path; the
padded-v SDPA paths do more work than that),
TAPA 4/14 (forward / forward+backward), halved for causal masking. Ratios are to each SDPA backend
at the same shape and mode. Peak memory is the allocator's peak above the inputs. Host ms is what
one call costs the CPU while the GPU is held busy (`host_ms`): near the ms column, a method is
bound by its launches; queued ms is the device time of those calls, queued back to back behind
the busy GPU, so ms - queued ms is about what the host's work before the first launch adds to a
synced call. SM MHz is the card's mean SM clock while the synced calls ran and while the queued
ones did, W its mean power reading during the synced calls (`gpu_clocks.py`, NVML or
nvidia-smi; the reading averages about the last second, so a row shorter than that reads below
its draw): a card at its power limit lowers its clock, so these say at what clock each timing ran
(the queued calls follow a quiet spin). `--profile K` adds K profiled calls per row, kernels by
device time (`step_profile.py`). `--rounds R` times each shape and mode's methods in R interleaved rounds
(every method once a round): a row's ms is the median of its rounds, its ratios the median of
its per-round ratios, so that a drift of the card's clocks between one method's calls and the
next's moves neither.

Usage (on a GPU machine; benchmarks/README.md):
    benchmarks/run_on_gpu.sh attention --out attention-h200
    python benchmarks/attention.py --head-dims 64 --methods sdpa-cudnn pope-fused --out benchmarks/results/attention-h200-d64
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import step_profile
import torch
import torch.nn.functional as F
from gpu_clocks import ClockSampler, device_uuid
from torch.nn.attention import SDPBackend, sdpa_kernel

from phaselab.kernels.attention import reference
from phaselab.kernels.common.options import EXP2_CHOICES, AttentionOptions
from phaselab.kernels.common.score_mod import ScoreMod, alibi_slopes, alibi_table, pope_inv_freq
from phaselab.kernels.flash.function import flash_attention
from phaselab.kernels.pope import reference as pope_reference
from phaselab.kernels.pope import triton_expand
from phaselab.kernels.pope.function import pope_attention
from phaselab.kernels.tapa.function import tapa_attention

FLOPS_PER_L2D = {"plain": (4, 14), "pope": (6, 22), "tapa": (4, 14)}  # MATH §6 (fwd, fwd+bwd)
# how our kernels run (autotuned unless --untuned; --exp2, --no-tapa-series for A/B rows), set by main
OPTIONS = AttentionOptions(autotune=True)
# the GPU's SM clock and power while rows are timed (gpu_clocks.py); main starts it, inactive until then
CLOCKS = ClockSampler()
METHOD_KIND = {"sdpa-flash": "plain", "sdpa-cudnn": "plain", "pope-fused": "pope", "pope-unfused": "pope",
               "pope-expand": "pope", "pope-cudnn": "pope", "pope-expand-cudnn": "pope", "pope-expand-cudnn-dv": "pope",
               "pope-expand-gluon": "pope", "pope-expand-flex": "pope",
               "flash-plain": "plain", "flash-gluon": "plain",
               "tapa-fused": "tapa", "tapa-fused-atomic": "tapa", "tapa-gluon": "tapa", "tapa-material": "tapa",
               "tapa-public": "tapa", "flex-plain": "plain", "flex-alibi": "plain", "flex-learned": "plain",
               "relbias-alibi": "plain", "relbias-learned": "plain"}


def sdpa(backend):
    def run(q, k, v, pos, ctx):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


def pope_fused(q, k, v, pos, ctx):
    return pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=ctx["inv_freq"], delta_HD=ctx["delta"],
                          impl="fused", options=ctx["options"])


def pope_expand(q, k, v, pos, ctx):
    return pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=ctx["inv_freq"], delta_HD=ctx["delta"],
                          impl="expand", options=ctx["options"])


def pope_cudnn(q, k, v, pos, ctx):
    return pope_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=ctx["inv_freq"], delta_HD=ctx["delta"],
                          impl="cudnn", trivial_pos=True, deterministic=False, options=ctx["options"])


def _expanded(q, k, pos, ctx):
    return triton_expand.pope_expand(q, k, pos, pos, ctx["inv_freq"], ctx["delta"])


def pope_expand_cudnn(q, k, v, pos, ctx):
    qh, kh = _expanded(q, k, pos, ctx)
    v_pad = F.pad(v, (0, v.shape[-1]))  # SDPA's fused kernels need one head dim for q, k and v
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qh, kh, v_pad, is_causal=True, scale=q.shape[-1] ** -0.5)
    return out[..., : v.shape[-1]]


def pope_expand_cudnn_dv(q, k, v, pos, ctx):
    qh, kh = _expanded(q, k, pos, ctx)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qh, kh, v, is_causal=True, scale=q.shape[-1] ** -0.5)


def pope_expand_gluon(q, k, v, pos, ctx):   # PoPE's expanded form on the Gluon core (D 2D, v padded)
    qh, kh = _expanded(q, k, pos, ctx)
    v_pad = F.pad(v, (0, v.shape[-1]))  # the Gluon core takes one head dim for q, k and v
    out = flash_attention(qh, kh, v_pad, causal=True, scale=q.shape[-1] ** -0.5,
                          options=with_impl(ctx["options"], "gluon"))
    return out[..., : v.shape[-1]]


_FLEX: dict = {}


def pope_expand_flex(q, k, v, pos, ctx):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    N = q.shape[2]
    if "fn" not in _FLEX:
        # one compile per length and grad mode; past dynamo's recompile limit (8) flex_attention
        # would fall back to its unfused form, which materialises the scores (OOM at 128k)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    if N not in _FLEX:
        # built block by block where compiled: eager, it evaluates the mask at all N^2 pairs
        # (over 40 GiB at N=64k, out of memory at 128k), which no user would pay for
        _FLEX[N] = create_block_mask(lambda b, h, m, n: n <= m, None, None, N, N, device=q.device,
                                     _compile=q.is_cuda)
    qh, kh = _expanded(q, k, pos, ctx)
    return _FLEX["fn"](qh, kh, v, block_mask=_FLEX[N], scale=q.shape[-1] ** -0.5)


def _flex(q, k, v, score_mod=None):
    """Compiled FlexAttention with the causal block mask, built and compiled as `pope_expand_flex`'s."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    N = q.shape[2]
    if "fn" not in _FLEX:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    if N not in _FLEX:
        _FLEX[N] = create_block_mask(lambda b, h, m, n: n <= m, None, None, N, N, device=q.device, _compile=True)
    return _FLEX["fn"](q, k, v, score_mod=score_mod, block_mask=_FLEX[N], scale=q.shape[-1] ** -0.5)


def flex_plain(q, k, v, pos, ctx):
    return _flex(q, k, v)


def flex_alibi(q, k, v, pos, ctx):
    slopes = ctx["slopes"]
    return _flex(q, k, v, lambda s, b, h, m, n: s - slopes[h] * (m - n))


def flex_learned(q, k, v, pos, ctx):
    slope = torch.nn.functional.softplus(ctx["bias_raw"][0])
    return _flex(q, k, v, lambda s, b, h, m, n: s - slope[h] * (m - n))


def relbias_alibi(q, k, v, pos, ctx):
    from phaselab.kernels.relbias import relbias_attention

    N = q.shape[2]
    table = alibi_table(ctx["slopes"], torch.arange(N, device=q.device), torch.float32)
    return relbias_attention(q, k, v, table, pos_q_BT=pos, pos_k_BS=pos, trivial_pos=True,
                             autotune=getattr(ctx.get("options"), "autotune", True))


def relbias_learned(q, k, v, pos, ctx):
    from phaselab.kernels.relbias import relbias_attention

    r1, r2 = torch.nn.functional.softplus(ctx["bias_raw"])[:, :, None]
    table = -r1 * torch.log1p(r2 * torch.arange(q.shape[2], device=q.device, dtype=torch.float32))
    return relbias_attention(q, k, v, table, pos_q_BT=pos, pos_k_BS=pos, trivial_pos=True,
                             autotune=getattr(ctx.get("options"), "autotune", True))


METHOD_SETS = {"distance-bias": ["sdpa-cudnn", "flex-plain", "flex-alibi", "relbias-alibi", "relbias-learned"]}


@functools.lru_cache(maxsize=16)
def with_impl(options: AttentionOptions, flash_impl: str) -> AttentionOptions:
    """options with flash_impl set, built once (a model builds its options once, not a call)."""
    return dataclasses.replace(options, flash_impl=flash_impl)


def flash_plain(q, k, v, pos, ctx):
    return flash_attention(q, k, v, causal=True, options=with_impl(ctx["options"], "tl"))


def flash_gluon(q, k, v, pos, ctx):   # the Gluon forward (an error where it cannot run), the tl backward
    return flash_attention(q, k, v, causal=True, options=with_impl(ctx["options"], "gluon"))


def pope_unfused(q, k, v, pos, ctx):
    qh, kh = pope_reference.pope_expand(q, k, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=ctx["inv_freq"],
                                   delta_HD=ctx["delta"])
    v_pad = F.pad(v, (0, v.shape[-1]))  # FlashAttention needs one head dim for q, k and v
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(qh, kh, v_pad, is_causal=True, scale=q.shape[-1] ** -0.5)
    return out[..., : v.shape[-1]]


def tapa_fused(q, k, v, pos, ctx):
    return tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5,
                          options=with_impl(ctx["options"], "tl"))


def tapa_gluon(q, k, v, pos, ctx):
    return tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5, trivial_pos=True,
                          options=with_impl(ctx["options"], "gluon"))


def tapa_fused_atomic(q, k, v, pos, ctx):
    return tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, alpha=0.1, theta=0.5, deterministic=False,
                          options=with_impl(ctx["options"], "tl"))


def tapa_material(q, k, v, pos, ctx):
    return reference.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=1.0, causal=True,
                               score_mod=ScoreMod(kind="tapa", params={"alpha": 0.1}))


_PUBLIC: dict = {}


def load_tapa_public(directory: str) -> None:
    """Import ``attention_triton.py`` of a checkout of AIMRelease/tapa-attention for tapa-public."""
    path = Path(directory) / "attention_triton.py"
    if not path.is_file():
        raise SystemExit(f"--tapa-public: no attention_triton.py in {directory}")
    spec = importlib.util.spec_from_file_location("tapa_public_attention_triton", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _PUBLIC["fn"] = module.tapa_attention_triton


def tapa_public(q, k, v, pos, ctx):
    if "fn" not in _PUBLIC:
        raise RuntimeError("tapa-public needs --tapa-public DIR")
    if torch.is_grad_enabled():
        raise RuntimeError("forward only (the public kernel has no backward)")
    return _PUBLIC["fn"](q, k, v, theta=0.5, alpha=0.1, causal=True)


METHODS = {"sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
           "pope-fused": pope_fused, "pope-unfused": pope_unfused, "pope-expand": pope_expand, "pope-cudnn": pope_cudnn,
           "pope-expand-cudnn": pope_expand_cudnn, "pope-expand-cudnn-dv": pope_expand_cudnn_dv,
           "pope-expand-gluon": pope_expand_gluon,
           "pope-expand-flex": pope_expand_flex, "flash-plain": flash_plain, "flash-gluon": flash_gluon,
           "tapa-fused": tapa_fused, "tapa-gluon": tapa_gluon,
           "tapa-fused-atomic": tapa_fused_atomic,
           "tapa-material": tapa_material,
           "tapa-public": tapa_public,
           "flex-plain": flex_plain, "flex-alibi": flex_alibi, "flex-learned": flex_learned,
           "relbias-alibi": relbias_alibi, "relbias-learned": relbias_learned}


def time_ms(fn, warmup: int, iters: int) -> float:
    """Median milliseconds of fn() over `iters` CUDA-event-timed calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_ms(fn, iters: int = 5) -> tuple[float, float, float]:
    """(host, queued) milliseconds per call of fn with the GPU held busy (a spin kernel ahead of
    the calls), so no call waits for the device. Host: what a call costs the CPU; a method whose
    host ms approaches its ms is bound by its launches, not by its kernels. Queued: the device
    time of the same calls run back to back behind the spin (CUDA events after the spin and after
    the last call), where no host work shows: ms - queued ms is about what the host's work before
    a synced call's first launch adds to it. Third: time.perf_counter() when the calls were done."""
    torch.cuda.synchronize()
    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU clock cycles ahead of the calls (a call that syncs shows it)
    start_ev.record()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = time.perf_counter() - start
    end_ev.record()
    torch.cuda.synchronize()
    return elapsed / iters * 1e3, start_ev.elapsed_time(end_ev) / iters, time.perf_counter()


def profile_calls(fn, calls: int, wall_ms: float) -> dict:
    """step_profile's summary of `calls` more calls of fn (kernels by device time per call)."""
    dev = torch.device("cuda")
    prof = step_profile.make_profiler(dev, skip=0, steps=calls)
    with prof:
        for _ in range(calls + 1):
            fn()
            torch.cuda.synchronize(dev)  # each call's kernels inside its own profiler step
            prof.step()
    return step_profile.summary(prof, device=dev, steps=calls, wall_ms_per_step=wall_ms, top=16)


def bench_one(method: str, B: int, H: int, N: int, D: int, mode: str, warmup: int, iters: int,
              profile: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(42)
    dev, dt = "cuda", torch.bfloat16
    leaves = [torch.randn(B, H, N, D, generator=gen, device=dev, dtype=dt).requires_grad_(mode == "fwd+bwd")
              for _ in range(3)]
    pos = torch.arange(N, device=dev)[None]
    ctx = {"inv_freq": pope_inv_freq(D).to(dev), "options": OPTIONS,
           "delta": (-2 * math.pi * torch.rand(H, D, device=dev)).requires_grad_(mode == "fwd+bwd"),
           "slopes": alibi_slopes(H).to(dev),
           "bias_raw": torch.full((2, H), 0.5, device=dev).requires_grad_(mode == "fwd+bwd")}
    do = torch.randn(B, H, N, D, generator=gen, device=dev, dtype=dt)
    fn = METHODS[method]

    def step():
        if mode == "fwd":
            with torch.no_grad():
                fn(*leaves, pos, ctx)
        else:
            for t in (*leaves, ctx["delta"], ctx["bias_raw"]):
                t.grad = None
            fn(*leaves, pos, ctx).backward(do)

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        t0 = time.perf_counter()
        ms = time_ms(step, warmup, iters)
        synced_clock = CLOCKS.mean(t0, time.perf_counter())
    except torch.OutOfMemoryError:
        return {"status": "OOM"}
    except RuntimeError as exc:  # e.g. an SDPA backend that refuses the shape
        return {"status": f"error: {str(exc).splitlines()[0][:120]}"}
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    fwd_c, fb_c = FLOPS_PER_L2D[METHOD_KIND[method]]
    flops = (fwd_c if mode == "fwd" else fb_c) * N * N * D * B * H * 0.5  # causal halves (MATH §6)
    # host_ms runs the calls again on the device: few of them where each is long (N >= 32k: 10 timed)
    n_queued = max(2, iters // 6)
    host, queued, done = host_ms(step, n_queued)
    queued_clock = CLOCKS.mean(done - n_queued * queued / 1e3, done)   # the queued calls' device time
    row = {"status": "ok", "ms": ms, "host_ms": host, "queued_ms": queued, "tflops": flops / ms / 1e9,
           "peak_gib": peak, "configs": tuned_configs()}
    if synced_clock[0] is not None and queued_clock[0] is not None:
        row.update(sm_mhz=synced_clock[0], power_w=synced_clock[1], queued_sm_mhz=queued_clock[0])
    if profile:
        row["profile"] = profile_calls(step, profile, ms)
    return row


def tuned_configs() -> dict[str, str]:
    """The config the autotuner last picked for each of our kernels (which tiles won, for the notes)."""
    from phaselab.kernels.flash import triton_flash
    from phaselab.kernels.pope import triton_pope
    from phaselab.kernels.tapa import triton_tapa

    out = {}
    for module in (triton_flash, triton_pope, triton_tapa):
        for name in dir(module):
            best = getattr(getattr(module, name), "best_config", None)
            if name.endswith(("_kernel", "_dkdv", "_dq")) and best is not None:
                out[name] = str(best)
    return out


def run(args, save=None) -> list[dict]:
    """All rows; `save(rows)` after each one, so a run cut short still leaves its results."""
    rows = []
    for D in args.head_dims:
        for N in args.lengths:
            B = max(1, args.tokens // N)
            for mode in ("fwd", "fwd+bwd"):
                rounds = {method: [] for method in args.methods}
                for _ in range(args.rounds):
                    for method in args.methods:
                        if method == "tapa-material" and B * args.heads * N * N * 4 > args.material_limit_gib * 2**30:
                            rounds[method].append({"status": "skipped (memory)"})
                            continue
                        big = N >= 32768
                        rounds[method].append(bench_one(method, B, args.heads, N, D, mode, 3 if big else args.warmup,
                                                        10 if big else args.iters, args.profile))
                        torch.cuda.empty_cache()
                for method in args.methods:
                    row = dict(method=method, N=N, B=B, H=args.heads, D=D, mode=mode, **merge_rounds(rounds[method]))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                if save is not None:
                    add_ratios(rows)
                    save(rows)
    add_ratios(rows)
    return rows


def merge_rounds(results: list[dict]) -> dict:
    """One row of a method's rounds (`bench_one` results): the first that failed, else the medians
    of ms, host and queued ms (ms_rounds: each round's), TFLOP/s at the median ms, the largest peak."""
    bad = [r for r in results if r["status"] != "ok"]
    if len(results) == 1 or bad:
        return (bad or results)[0]
    ms = [r["ms"] for r in results]
    row = dict(results[0], ms=statistics.median(ms), ms_rounds=ms,
               host_ms=statistics.median(r["host_ms"] for r in results),
               queued_ms=statistics.median(r["queued_ms"] for r in results),
               peak_gib=max(r["peak_gib"] for r in results))
    for key in ("sm_mhz", "power_w", "queued_sm_mhz"):   # the clock, where every round sampled it
        row.pop(key, None)
        if all(key in r for r in results):
            row[key] = statistics.median(r[key] for r in results)
    row["tflops"] = results[0]["tflops"] * results[0]["ms"] / row["ms"]
    return row


def add_ratios(rows: list[dict]) -> None:
    index = {(r["method"], r["N"], r["D"], r["mode"]): r for r in rows}
    for r in rows:
        for base in ("sdpa-flash", "sdpa-cudnn"):
            b = index.get((base, r["N"], r["D"], r["mode"]))
            if r.get("status") == "ok" and b is not None and b.get("status") == "ok":
                a_ms, b_ms = r.get("ms_rounds", [r["ms"]]), b.get("ms_rounds", [b["ms"]])
                r[f"x_{base}"] = (statistics.median(x / y for x, y in zip(a_ms, b_ms)) if len(a_ms) == len(b_ms)
                                  else r["ms"] / b["ms"])   # per round where both have the rounds


def add_versus(rows: list[dict], path: str) -> None:
    """x_versus: each row's ms over the same row (method, N, D, mode) of an earlier run's JSON,
    e.g. untuned defaults against an autotuned run on the same machine."""
    prev = {(r["method"], r["N"], r["D"], r["mode"]): r for r in json.loads(Path(path).read_text())["rows"]}
    for r in rows:
        b = prev.get((r["method"], r["N"], r["D"], r["mode"]))
        if r.get("status") == "ok" and b is not None and b.get("status") == "ok":
            r["x_versus"] = r["ms"] / b["ms"]


def table(rows: list[dict]) -> str:
    vs = any("x_versus" in r for r in rows)
    qd = any("queued_ms" in r for r in rows)   # rows from before host_ms timed the queued calls have none
    ck = any("sm_mhz" in r for r in rows)      # rows with the GPU's clock sampled (gpu_clocks.py)
    head = ("| D | N | B | mode | method | ms | TFLOP/s | x flash | x cuDNN | peak GiB | host ms |"
            + (" queued ms |" if qd else "") + (" SM MHz synced / queued | W |" if ck else "")
            + (" x --versus |" if vs else "") + "\n" + "|---" * (11 + qd + 2 * ck + vs) + "|\n")
    lines = []
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['D']} | {r['N']} | {r['B']} | {r['mode']} | {r['method']} | {r['status']} | | | | | |"
                         + (" |" if qd else "") + (" | |" if ck else "") + (" |" if vs else ""))
            continue
        fx = f"{r['x_sdpa-flash']:.2f}" if "x_sdpa-flash" in r else "-"
        cx = f"{r['x_sdpa-cudnn']:.2f}" if "x_sdpa-cudnn" in r else "-"
        qx = (f" {r['queued_ms']:.3f} |" if "queued_ms" in r else " - |") if qd else ""
        kx = ((f" {r['sm_mhz']:.0f} / {r['queued_sm_mhz']:.0f} | {r['power_w']:.0f} |" if "sm_mhz" in r
               else " - | - |") if ck else "")
        vx = (f" {r['x_versus']:.3f} |" if "x_versus" in r else " - |") if vs else ""
        lines.append(f"| {r['D']} | {r['N']} | {r['B']} | {r['mode']} | {r['method']} | {r['ms']:.3f} | "
                     f"{r['tflops']:.0f} | {fx} | {cx} | {r['peak_gib']:.2f} | {r['host_ms']:.3f} |{qx}{kx}{vx}")
    profiles = [step_profile.markdown(f"{r['method']} {r['mode']} D={r['D']} N={r['N']}", r["profile"])
                for r in rows if r.get("profile")]
    return head + "\n".join(lines) + "\n" + "".join("\n" + p + "\n" for p in profiles)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--tokens", type=int, default=65536, help="tokens per batch (B = tokens // N)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=[*METHODS, *METHOD_SETS],
                   help=f"methods, or a set of them: {METHOD_SETS}")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="interleaved rounds of the methods at each shape and mode (module docstring)")
    p.add_argument("--material-limit-gib", type=float, default=8.0,
                   help="skip tapa-material when one fp32 B*H*N*N tensor exceeds this")
    p.add_argument("--tapa-public", metavar="DIR", default=None,
                   help="a checkout of AIMRelease/tapa-attention, for the tapa-public method")
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="also profile K more calls of each row (torch.profiler; kernels by device time, "
                        "step_profile.py) and print the tables")
    p.add_argument("--versus", metavar="JSON", default=None,
                   help="an earlier run's OUT.json: adds each row's ms over the same row there (x --versus)")
    p.add_argument("--out", type=str, default=None, help="write OUT.json and OUT.md")
    p.add_argument("--untuned", action="store_true", help="our kernels' measured tiles, no autotuning")
    p.add_argument("--exp2", choices=EXP2_CHOICES, default="mufu", help="AttentionOptions.exp2")
    p.add_argument("--no-tapa-series", action="store_true", help="AttentionOptions.tapa_series=False")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.methods = list(dict.fromkeys(m for name in args.methods for m in METHOD_SETS.get(name, [name])))
    global OPTIONS, CLOCKS
    OPTIONS = AttentionOptions(autotune=not args.untuned, exp2=args.exp2, tapa_series=not args.no_tapa_series)
    if args.tapa_public:
        load_tapa_public(args.tapa_public)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/attention.py needs a CUDA GPU")
    meta = {"card": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds"), "torch": torch.__version__, "triton": __import__("triton").__version__,
        "command": "python benchmarks/attention.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "dtype": "bf16", "causal": True, "heads": args.heads, "tokens_per_batch": args.tokens,
        "timing": f"CUDA events, median of {args.iters} after {args.warmup} warm-up (N >= 32768: 10 after 3)"
                  + (f"; {args.rounds} interleaved rounds, ms the median of a row's rounds, x the median of "
                     "its per-round ratios" if args.rounds > 1 else ""),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("PHASELAB_")},
        "options": {f: getattr(OPTIONS, f) for f in ("pope_impl", "tapa_series", "exp2", "autotune")}}

    def save(rows: list[dict]) -> None:
        if args.versus:
            add_versus(rows, args.versus)
        if args.out:
            Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
            md = "\n".join(f"- {k}: {v}" for k, v in meta.items())
            Path(args.out + ".md").write_text(f"# Attention benchmark\n\n{md}\n\n{table(rows)}")

    CLOCKS = ClockSampler(device_uuid()).start()
    meta["clocks"] = CLOCKS.source or "not sampled (neither pynvml nor nvidia-smi)"
    try:
        rows = run(args, save)
    finally:
        CLOCKS.stop()
    save(rows)
    print(table(rows))


if __name__ == "__main__":
    main()
