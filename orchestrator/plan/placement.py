"""Whether the cluster can place a stage at all: what the stage's own Ray task asks for against
what each live node has (a task runs on one node, so the cluster's totals are not enough), and
how long a stage no node can run waits on a cluster that may grow (``PHASELAB_RESOURCE_WAIT_S``).

``resources.accelerator`` (``orchestrator/language/spec.py``) is matched as Ray's ``accelerator_type``
option does: a node offers accelerator ``X`` when it has the resource ``accelerator_type:X``,
which Ray sets on GPU nodes it recognises (``H200``, ``H100``, ...) and which a node can declare
itself (``ray start --resources='{"accelerator_type:X": 1}'``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

from phaselab.orchestrator.stages import gpu_packing

RESOURCE_WAIT_ENV = "PHASELAB_RESOURCE_WAIT_S"
DEFAULT_RESOURCE_WAIT_S = 600.0   # long enough for an autoscaler to start a GPU node


def resource_wait(seconds: float | None = None) -> float:
    """``seconds``, else ``$PHASELAB_RESOURCE_WAIT_S``, else 600; ValueError naming a value
    that is not a number of seconds >= 0."""
    raw: Any = seconds if seconds is not None else os.environ.get(RESOURCE_WAIT_ENV, DEFAULT_RESOURCE_WAIT_S)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{RESOURCE_WAIT_ENV} (resource_wait_s) must be a number of seconds >= 0, got {raw!r}")
    return value


def demands(node: Any) -> list[dict[str, float]]:
    """What must fit on one node: the stage's own task (CPU, GPU, memory, accelerator, from its
    ``ray_options``) and, under Ray Train, each training worker (its ``cpus``/``gpus`` and
    accelerator, as ``stages.pretrain.resources_per_worker`` asks Ray for them)."""
    from phaselab.orchestrator.stages import STAGES

    opts = STAGES[node.kind].ray_options(node.resources, node.launcher)
    task = {"CPU": float(opts.get("num_cpus", 0) or 0), "GPU": float(opts.get("num_gpus", 0) or 0),
            "memory": float(opts.get("memory", 0) or 0)}
    if opts.get("accelerator_type"):
        task[f"accelerator_type:{opts['accelerator_type']}"] = 0.001
    if node.launcher != "ray_train":
        return [task]
    r = node.resources
    worker = {"CPU": float(r.cpus), "GPU": float(r.gpus)}
    if r.accelerator:
        worker[f"accelerator_type:{r.accelerator}"] = 0.001
    return [task, worker]


def _fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items() if v > 0)


def _accelerators(nodes: Iterable[Mapping[str, float]]) -> str:
    names = sorted({k.split(":", 1)[1] for n in nodes for k in n if k.startswith("accelerator_type:")})
    return ", ".join(names) or "none"


def unschedulable(node: Any, total: Mapping[str, float], nodes: list[Mapping[str, float]]) -> str | None:
    """Why no live node of the cluster can run the stage (None when one can). ``total``: the
    cluster's resources (``ray.cluster_resources()``), ``nodes``: each live node's resources."""
    from phaselab.orchestrator.stages import STAGES

    cpu, gpu = STAGES[node.kind].demand(node.resources, node.config)
    if cpu > total.get("CPU", 0.0) + 1e-9 or gpu > total.get("GPU", 0.0) + 1e-9:
        return (f"asks for {cpu:g} CPUs / {gpu:g} GPUs; the cluster has "
                f"{total.get('CPU', 0):g} / {total.get('GPU', 0):g}")
    acc = node.resources.accelerator
    if acc and not any(f"accelerator_type:{acc}" in have for have in nodes):
        return (f"asks for accelerator {acc!r}, which no node of the cluster has (accelerators: "
                f"{_accelerators(nodes)}; a node offers it as the resource accelerator_type:{acc})")
    for need in demands(node):
        if not any(_fits(need, have) for have in nodes):
            shown = ", ".join(f"{k} {v / 2**30:.1f} GB" if k == "memory" else f"{k} {v:g}"
                              for k, v in need.items() if v > 0)
            return f"asks for {shown} on one node; no node of the cluster ({len(nodes)} live) has that much"
    return None


def live_nodes() -> list[Mapping[str, float]]:
    """The resources of each live node of the connected Ray cluster."""
    import ray

    return [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]


def local_node(num_cpus: int | None = None) -> dict[str, float]:
    """What the local Ray cluster ``phaselab run`` starts would offer, read without starting it:
    ``num_cpus`` (else this machine's CPUs), about 70 % of its memory, the visible NVIDIA GPUs
    (``nvidia-smi``; none where it is missing) and their ``accelerator_type`` as Ray derives it
    from the GPU's name."""
    import re
    import shutil
    import subprocess

    node: dict[str, float] = {"CPU": float(num_cpus or os.cpu_count() or 1)}
    try:   # Ray's "memory": what is left beside the object store (30 % by default)
        node["memory"] = 0.7 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    names: list[str] = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10, check=False)
            names = [n.strip() for n in out.stdout.splitlines() if n.strip()] if out.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            names = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = names[:len([d for d in visible.split(",") if d.strip()])]
    if names:
        node["GPU"] = float(len(names))
        match = re.match(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)", names[0])   # Ray's pattern
        if match:
            node[f"accelerator_type:{match.group(1).replace(' ', '-')}"] = 1.0
    return node


GPU_MEMORY_ENV = "PHASELAB_GPU_MEMORY_GB"
NO_GPU = gpu_packing.NO_GPU
# GiB of the GPUs Ray names by accelerator_type, for a cluster this process cannot query itself
ACCELERATOR_MEMORY_GIB = {"H200": 140.4, "H100": 79.6, "A100-80G": 80.0, "A100-40G": 40.0, "L40S": 44.5,
                          "L4": 22.5, "A10G": 22.5, "T4": 15.0, "V100": 16.0}


def _env_gpu_memory() -> float | None:
    raw = os.environ.get(GPU_MEMORY_ENV)
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{GPU_MEMORY_ENV} must be the GPU memory in GB (> 0), got {raw!r}")
    return value * 2**30


@functools.lru_cache(maxsize=1)
def _smi_gpus() -> tuple[tuple[str, float], ...]:
    """(name, memory bytes) of each NVIDIA GPU ``nvidia-smi`` lists (asked once per process)."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    rows = [line.rsplit(",", 1) for line in out.stdout.splitlines() if "," in line]
    return tuple((n.strip(), float(m) * 2**20) for n, m in rows if m.strip().replace(".", "", 1).isdigit())


def local_gpu() -> dict[str, Any] | None:
    """The GPU the local cluster `phaselab run` starts would give its stages: the first visible
    NVIDIA GPU's name and memory (``nvidia-smi``), None without one. ``PHASELAB_GPU_MEMORY_GB``
    overrides its memory, or describes the GPU a plan is made for on a machine without one."""
    gpus = _smi_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = gpus[:len([d for d in visible.split(",") if d.strip()])]
    env = _env_gpu_memory()
    if env is not None:
        return {"name": gpus[0][0] if gpus else "GPU", "memory_bytes": env, "source": GPU_MEMORY_ENV}
    if not gpus:
        return None
    return {"name": gpus[0][0], "memory_bytes": gpus[0][1], "source": "nvidia-smi"}


def cluster_gpu(nodes: list[Mapping[str, float]]) -> dict[str, Any] | None:
    """The GPU of a connected cluster's nodes (``live_nodes()``): None when no node has one;
    its memory from ``PHASELAB_GPU_MEMORY_GB``, else from its ``accelerator_type``
    (ACCELERATOR_MEMORY_GIB; None when not listed)."""
    with_gpu = [n for n in nodes if n.get("GPU", 0) > 0]
    if not with_gpu:
        return None
    types = sorted(k.split(":", 1)[1] for n in with_gpu for k in n if k.startswith("accelerator_type:"))
    name = types[0] if types else "GPU"
    env = _env_gpu_memory()
    if env is not None:
        return {"name": name, "memory_bytes": env, "source": GPU_MEMORY_ENV}
    gib = min((ACCELERATOR_MEMORY_GIB[t] for t in types if t in ACCELERATOR_MEMORY_GIB), default=None)
    return {"name": name, "memory_bytes": gib * 2**30 if gib else None, "source": "accelerator_type"}


def with_auto_gpus(nodes: dict[str, Any], gpu: Mapping[str, Any] | None) -> None:
    """Resolve, in place, every stage of a DAG (``Dag.nodes``, topological order) whose grid left
    ``resources.gpus`` to the packing rule, for ``gpu`` (``local_gpu()``, ``cluster_gpu()``): an
    eval stage is sized by the model of its nearest training upstream."""
    from dataclasses import replace

    from phaselab.orchestrator.stages import STAGES

    models: dict[str, Any] = {}
    for h, node in nodes.items():
        models[h] = node.config.get("model") or next((models[u] for u in node.upstream.values() if models.get(u)),
                                                     None)
        if node.resources.gpus_auto:
            res = STAGES[node.kind].auto_gpus(node.resources, node.config, models[h], node.launcher, gpu)
            nodes[h] = replace(node, resources=res)


def packing_notes(nodes: Iterable[Any]) -> list[str]:
    """What ``phaselab plan`` says about ``resources.gpus: auto`` beyond each fraction: stages it
    left on the CPU only because there is no GPU where they run (a GPU grid planned on a machine
    without one), and, when it packs stages on a GPU without a CUDA MPS daemon set up for this
    run (``CUDA_MPS_PIPE_DIRECTORY``), that the driver then time-slices their kernels."""
    nodes = list(nodes)
    out = []
    cpu = [n for n in nodes if n.resources.gpus_auto and n.resources.gpus_why == NO_GPU]
    if cpu:
        out.append(f"{len(cpu)} stage(s), e.g. {cpu[0].label}: resources.gpus auto and {NO_GPU}, so they run "
                   "on the CPU (set PHASELAB_GPU_MEMORY_GB to plan for a GPU, or give resources.gpus a number "
                   "to require one)")
    packed = [n for n in nodes if n.resources.gpus_auto and 0 < n.resources.gpus < 1]
    if packed and not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        out.append(f"{len(packed)} stage(s) share GPUs (resources.gpus auto); their kernels overlap only under "
                   "CUDA MPS (deploy/gpu/run_grid.sh --mps), without it they share the GPU by time slices")
    return out


def plan_warnings(nodes_of_dag: Iterable[Any], nodes: list[Mapping[str, float]], where: str, *,
                  can_grow: bool) -> list[str]:
    """One line per reason some stages cannot run on the cluster ``where`` describes ("the local
    cluster (2 CPUs, 0 GPUs)"), with how many stages and one of them, as ``phaselab plan``
    reports them before anything runs. ``can_grow``: an autoscaling cluster may add a node."""
    total: dict[str, float] = {}
    for have in nodes:
        for k, v in have.items():
            total[k] = total.get(k, 0.0) + v
    by_reason: dict[str, list[str]] = {}
    for node in nodes_of_dag:
        why = unschedulable(node, total, nodes)
        if why:
            by_reason.setdefault(why, []).append(node.label)
    then = (f"`phaselab run` would wait {RESOURCE_WAIT_ENV}={resource_wait():g} s for such a node, then fail them"
            if can_grow else "`phaselab run` would fail them")
    return [f"{len(labels)} stage(s), e.g. {labels[0]}: {why}, on {where}; {then}"
            for why, labels in by_reason.items()]
