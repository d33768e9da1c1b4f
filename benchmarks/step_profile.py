"""Where a training step's time goes (what keeps the 124M model's MFU below its 40 % target):
torch.profiler over a few extra steps after the timed window of `train_throughput.py --profile N`,
summarised as device busy time per step against the step's wall time, and the kernels that take it.

The profiled steps come after the timed ones, so the profiler's own overhead never enters the
tokens/s and MFU columns. On CUDA "busy" is the union of the device-side events' intervals (kernels
of several streams are counted once) and kernels are grouped into categories (GEMM, attention,
loss, optimizer, fused elementwise); on the CPU it is the sum of the operators' self CPU time.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def make_profiler(device: torch.device, *, skip: int, steps: int) -> profile:
    """A profiler that records steps skip+2 .. skip+1+steps (one step of profiler warm-up);
    call `.step()` once per training step.

    One cycle only (repeat=1): with torch's default repeat=0 a `.step()` after the last active step
    starts a new cycle, and with skip=0 that cycle's warm-up replaces the recorded events by an
    empty set (`events()` reports only the current cycle)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities, schedule=schedule(wait=skip, warmup=1, active=steps, repeat=1))


# kernel name -> category, first match wins (names as CUDA 13 / torch 2.11 print them)
CATEGORIES = (
    ("attention", r"sdpa|fmha|flash|attention|_tapa_|_pope_|pope_|tapa_"),
    ("gemm", r"nvjet|gemm|cutlass|xmma|wgmma|splitK|matmul"),
    ("loss", r"log_softmax|nll_loss|cross_entropy|^ce_"),
    ("optimizer", r"adam|foreach|multi_tensor"),
    ("memcpy/memset", r"memcpy|memset|Memcpy|Memset"),
    ("fused elementwise", r"^triton_"),
)


def category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name):
            return cat
    return "other"


def _device_events(prof: profile, device: torch.device) -> list[tuple[str, float, float]]:
    """(name, start_us, duration_us) of every device-side event (kernels, copies) on CUDA; of every
    operator's self CPU time on the CPU (no timeline there: start 0)."""
    if device.type == "cuda":
        from torch.autograd import DeviceType

        # "ProfilerStep#N" and record_function ranges are mirrored on the GPU timeline as
        # annotations spanning whole steps: not kernels
        return [(e.key, float(e.time_range.start), float(e.time_range.elapsed_us()))
                for e in prof.events() if e.device_type == DeviceType.CUDA
                and not getattr(e, "is_user_annotation", False) and not e.key.startswith("ProfilerStep")]
    return [(e.key, 0.0, float(e.self_cpu_time_total)) for e in prof.events()]


def _union_us(events: list[tuple[str, float, float]]) -> float:
    """Time covered by at least one event (overlapping kernels of several streams count once)."""
    total, end = 0.0, float("-inf")
    for _, start, dur in sorted(events, key=lambda e: e[1]):
        stop = start + dur
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summary(prof: profile, *, device: torch.device, steps: int, wall_ms_per_step: float,
            top: int = 12) -> dict[str, Any]:
    """{"steps", "wall_ms_per_step", "busy_ms_per_step", "idle_share", "categories", "top"}.

    On CUDA only device-side events count (an operator's attributed device time would count its
    kernels twice); busy is the union of their intervals."""
    events = [e for e in _device_events(prof, device) if e[2] > 0]
    busy_us = _union_us(events) if device.type == "cuda" else sum(e[2] for e in events)
    per_name: dict[str, list[float]] = {}
    for name, _, dur in events:
        agg = per_name.setdefault(name, [0, 0.0])
        agg[0] += 1
        agg[1] += dur
    total_us = sum(t for _, t in per_name.values()) or 1.0
    cats: dict[str, float] = {}
    for name, (_, t) in per_name.items():
        cats[category(name)] = cats.get(category(name), 0.0) + t
    rows = [{"name": name, "category": category(name), "calls_per_step": n / steps,
             "ms_per_step": t / 1e3 / steps, "share": t / total_us}
            for name, (n, t) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]]
    busy_ms = busy_us / 1e3 / steps
    return {"steps": steps, "wall_ms_per_step": wall_ms_per_step, "busy_ms_per_step": busy_ms,
            "idle_share": max(0.0, 1.0 - busy_ms / wall_ms_per_step),
            "categories": {c: {"ms_per_step": t / 1e3 / steps, "share": t / total_us}
                           for c, t in sorted(cats.items(), key=lambda kv: -kv[1])},
            "top": rows}


def markdown(case: str, prof: dict[str, Any]) -> str:
    lines = [(f"### {case}: {prof['steps']} profiled steps, wall {prof['wall_ms_per_step']:.1f} ms/step, "
              f"busy {prof['busy_ms_per_step']:.1f} ms/step (idle {100 * prof['idle_share']:.0f} %)"), "",
             "| category | ms/step | share |", "|---|---:|---:|"]
    for cat, c in prof.get("categories", {}).items():
        lines.append(f"| {cat} | {c['ms_per_step']:.3f} | {100 * c['share']:.1f} % |")
    lines += ["", "| kernel / operator | calls/step | ms/step | share of busy |", "|---|---:|---:|---:|"]
    for r in prof["top"]:
        name = r["name"].replace("|", "\\|")
        name = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| `{name}` | {r['calls_per_step']:.3g} | {r['ms_per_step']:.3f} | {100 * r['share']:.1f} % |")
    return "\n".join(lines)
