"""Where a training step's time goes (issue 4's MFU gap): torch.profiler over a few extra steps
after the timed window of `train_throughput.py --profile N`, summarised as device busy time per
step against the step's wall time, and the kernels that take it.

The profiled steps come after the timed ones, so the profiler's own overhead never enters the
tokens/s and MFU columns. On CUDA "busy" is the sum of the kernels' self device time (kernels of
one stream do not overlap); on the CPU it is the sum of the operators' self CPU time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def make_profiler(device: torch.device, *, skip: int, steps: int) -> profile:
    """A profiler that records steps skip+2 .. skip+1+steps (one step of profiler warm-up);
    call `.step()` once per training step."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities, schedule=schedule(wait=skip, warmup=1, active=steps))


def _self_time_us(event: Any, device: torch.device) -> float:
    if device.type == "cuda":  # the attribute was renamed from *_cuda_* in torch 2.4
        return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))
    return float(event.self_cpu_time_total)


def summary(prof: profile, *, device: torch.device, steps: int, wall_ms_per_step: float,
            top: int = 12) -> dict[str, Any]:
    """{"steps", "wall_ms_per_step", "busy_ms_per_step", "idle_share", "top": [kernel rows]}."""
    events = [(e.key, e.count, _self_time_us(e, device)) for e in prof.key_averages()]
    events = [e for e in events if e[2] > 0]
    busy_us = sum(t for _, _, t in events)
    busy_ms = busy_us / 1e3 / steps
    rows = [{"name": name, "calls_per_step": count / steps, "ms_per_step": t / 1e3 / steps,
             "share": t / busy_us} for name, count, t in sorted(events, key=lambda e: -e[2])[:top]]
    return {"steps": steps, "wall_ms_per_step": wall_ms_per_step, "busy_ms_per_step": busy_ms,
            "idle_share": max(0.0, 1.0 - busy_ms / wall_ms_per_step), "top": rows}


def markdown(case: str, prof: dict[str, Any]) -> str:
    lines = [f"### {case}: {prof['steps']} profiled steps, wall {prof['wall_ms_per_step']:.1f} ms/step, "
             f"busy {prof['busy_ms_per_step']:.1f} ms/step (idle {100 * prof['idle_share']:.0f} %)", "",
             "| kernel / operator | calls/step | ms/step | share of busy |", "|---|---:|---:|---:|"]
    for r in prof["top"]:
        name = r["name"].replace("|", "\\|")
        name = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| `{name}` | {r['calls_per_step']:.3g} | {r['ms_per_step']:.3f} | {100 * r['share']:.1f} % |")
    return "\n".join(lines)
