"""Whether the cluster can place a stage at all: what the stage's own Ray task asks for against
what each live node has (a task runs on one node, so the cluster's totals are not enough), and
how long a stage no node can run waits on a cluster that may grow (``PHASELAB_RESOURCE_WAIT_S``).

``resources.accelerator`` (``orchestrator/spec.py``) is matched as Ray's ``accelerator_type``
option does: a node offers accelerator ``X`` when it has the resource ``accelerator_type:X``,
which Ray sets on GPU nodes it recognises (``H200``, ``H100``, ...) and which a node can declare
itself (``ray start --resources='{"accelerator_type:X": 1}'``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

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
