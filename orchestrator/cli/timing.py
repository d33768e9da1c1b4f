"""Where a grid's time goes: each stage's wall time split into start-up and the training loop's
own phases (the ``time/*_s`` metrics, ``workloads/train/session.time_breakdown``), the grid's GPU
efficiency (training-step time over the stages' wall time), and ``plan``'s time estimates from
what earlier stages of this catalog recorded. Plain data here; ``views`` renders it."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any

# the loop's phases, in the order they are shown (``time/<phase>_s`` in the catalog)
PHASES = ("setup", "train", "eval", "ckpt", "other")
TIME_PREFIX = "time/"


def stage_times(wall_s: float | None, metrics: Mapping[str, float] | None) -> dict[str, float] | None:
    """A finished stage's time in seconds: ``wall`` (its attempt's start to its finish in the
    catalog), each loop phase, and ``startup`` = wall - the loop's own total (scheduling, the
    worker's start, imports, the tracker; never below 0). None without wall time or without the
    loop's breakdown (a stage that does not train records none)."""
    metrics = metrics or {}
    if wall_s is None or not any(f"{TIME_PREFIX}{p}_s" in metrics for p in PHASES):
        return None
    out = {p: float(metrics.get(f"{TIME_PREFIX}{p}_s", 0.0)) for p in PHASES}
    return {"wall": float(wall_s), "startup": max(0.0, float(wall_s) - sum(out.values())), **out}


def efficiency(stages: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The grid's GPU efficiency: the training-step time of its finished stages over their wall
    time, both summed. Stages are dicts with ``seconds`` (wall), ``times`` (``stage_times`` or
    None: no training steps) and ``gpu`` (whether it held a GPU). When any stage held a GPU only
    those count (``scope`` "gpu"), else all (``scope`` "all": a CPU grid's share of time spent
    training). None when no finished stage has a wall time."""
    done = [s for s in stages if s.get("seconds") is not None and s.get("state") == "SUCCEEDED"]
    gpu = [s for s in done if s.get("gpu")]
    scope, counted = ("gpu", gpu) if gpu else ("all", done)
    wall = sum(s["seconds"] for s in counted)
    if not counted or wall <= 0:
        return None
    train = sum((s.get("times") or {}).get("train", 0.0) for s in counted)
    return {"value": train / wall, "train_s": train, "wall_s": wall, "stages": len(counted), "scope": scope}


def efficiency_line(eff: Mapping[str, Any] | None) -> str:
    """``GPU efficiency 61% (training steps 97.0 s of 159.2 s stage time, 6 GPU stages)``; for
    a grid without GPU stages ``training steps 42% of 80.1 s stage time``."""
    if not eff:
        return ""
    share = f"{100 * eff['value']:.0f}%"
    if eff["scope"] == "gpu":
        return (f"GPU efficiency {share} (training steps {eff['train_s']:.1f} s of {eff['wall_s']:.1f} s "
                f"stage time, {eff['stages']} GPU stage(s))")
    return f"training steps {share} of {eff['wall_s']:.1f} s stage time ({eff['stages']} stage(s), no GPU)"


def breakdown_text(times: Mapping[str, float] | None) -> str:
    """``start 4.1 · setup 3.1 · train 16.0 · eval 2.2 · other 1.0 s``: the phases over 0.05 s."""
    if not times:
        return ""
    parts = [f"{'start' if p == 'startup' else p} {times[p]:.1f}" for p in ("startup", *PHASES)
             if times.get(p, 0.0) >= 0.05]
    return " · ".join(parts) + " s" if parts else ""


# -- plan: estimates from what this catalog recorded -------------------------------------------------

def model_key(config: Mapping[str, Any]) -> str | None:
    """The identity of a stage's model (canonical JSON of its ``model`` section), None without one."""
    from phaselab.orchestrator.plan.hashing import canonical_json

    return canonical_json(config["model"]) if config.get("model") else None


def stage_tokens(config: Mapping[str, Any]) -> int | None:
    """Tokens a training stage processes: steps x batch x its block size (None without training)."""
    train = config.get("train")
    if not train:
        return None
    block = (config.get("extend") or {}).get("block_size") or (config.get("data") or {}).get("block_size") \
        or (config.get("model") or {}).get("block_size")
    return int(train["steps"] * train["batch_size"] * block) if block else None


def _without_train(config: Mapping[str, Any]) -> str:
    from phaselab.orchestrator.plan.hashing import canonical_json

    return canonical_json({k: v for k, v in config.items() if k != "train"})


class Recorded:
    """What earlier SUCCEEDED stages of the catalog took, by what predicts a new stage's time:
    for training stages the seconds per training token of the same model (``time/train_s`` over
    steps x batch x block) and the rest of their wall time (start-up, setup, eval, checkpoints)
    for the same kind and model; for other stages the mean wall time of stages of the same kind
    with the same config and the same upstream model."""

    def __init__(self, rows: Iterable[Any], times: Mapping[str, Mapping[str, float]],
                 edges: Iterable[tuple[str, str, str]]) -> None:
        self.rows = {r.stage_hash: r for r in rows}
        self.ups: dict[str, list[str]] = {}
        for up, down, _ in edges:
            self.ups.setdefault(down, []).append(up)
        self.per_token: dict[str, list[float]] = {}
        self.fixed: dict[tuple[str, str], list[float]] = {}
        self.walls: dict[tuple[str, str, str | None], list[float]] = {}
        self.sources = 0   # recorded stages the estimates draw on
        for h, r in self.rows.items():
            wall = _wall(r)
            if wall is None or r.state != "SUCCEEDED":
                continue
            self.sources += 1
            model = self.model_of(h)
            t = stage_times(wall, times.get(h))
            tok = stage_tokens(r.config)
            if t is not None and tok and model and t["train"] > 0:
                self.per_token.setdefault(model, []).append(t["train"] / tok)
                self.fixed.setdefault((r.kind, model), []).append(wall - t["train"])
            else:
                self.walls.setdefault((r.kind, _without_train(r.config), model), []).append(wall)

    def model_of(self, h: str) -> str | None:
        """The model config of stage ``h`` or of its nearest upstream that has one."""
        seen, todo = set(), [h]
        while todo:
            cur = todo.pop(0)
            if cur in seen or cur not in self.rows:
                continue
            seen.add(cur)
            key = model_key(self.rows[cur].config)
            if key:
                return key
            todo += self.ups.get(cur, [])
        return None

    def estimate(self, kind: str, config: Mapping[str, Any], model: str | None) -> float | None:
        """Seconds a new stage is expected to take, or None when nothing comparable was recorded."""
        tok = stage_tokens(config)
        if tok and model in self.per_token:
            rates, fixed = self.per_token[model], self.fixed.get((kind, model)) or next(
                (v for (k, m), v in self.fixed.items() if m == model), [0.0])
            return tok * sum(rates) / len(rates) + sum(fixed) / len(fixed)
        walls = self.walls.get((kind, _without_train(config), model))
        return sum(walls) / len(walls) if walls else None


def _wall(row: Any) -> float | None:
    if row.started_at is None or row.finished_at is None:
        return None
    return max(0.0, (row.finished_at - row.started_at).total_seconds())


def dag_models(dag: Any) -> dict[str, str | None]:
    """Stage hash -> the model config (canonical JSON) it trains or evaluates: its own, else its
    nearest upstream's."""
    out: dict[str, str | None] = {}
    for h, node in dag.nodes.items():   # topological order: upstreams first
        out[h] = model_key(node.config) or next((out[u] for u in node.upstream.values() if out.get(u)), None)
    return out


def packed_seconds(nodes: Mapping[str, Any], est: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    """The grid's wall time when the stages of ``est`` (hash -> seconds) run as the controller
    runs them: a stage starts once its upstreams in ``est`` are done and its (CPUs, GPUs) fit
    in what the running stages leave of ``capacity`` ({"CPU", "GPU"}); stages in DAG order.
    A stage that never fits is counted as running alone."""
    from phaselab.orchestrator.stages import STAGES

    demand = {h: STAGES[nodes[h].kind].demand(nodes[h].resources, nodes[h].config) for h in est}
    cap = (capacity.get("CPU", 0.0), capacity.get("GPU", 0.0))
    done_at: dict[str, float] = {}
    running: list[tuple[float, str]] = []
    waiting, now, free = [h for h in nodes if h in est], 0.0, list(cap)
    while waiting or running:
        started = False
        for h in list(waiting):
            ups = [u for u in nodes[h].upstream.values() if u in est]
            if any(u not in done_at for u in ups):
                continue
            cpu, gpu = demand[h]
            alone = cpu > cap[0] + 1e-9 or gpu > cap[1] + 1e-9
            if (cpu <= free[0] + 1e-9 and gpu <= free[1] + 1e-9) or (alone and not running):
                free[0], free[1] = free[0] - cpu, free[1] - gpu
                heapq.heappush(running, (now + est[h], h))
                waiting.remove(h)
                started = True
        if not running:
            if not started:   # an upstream outside ``est`` never finishes here
                break
            continue
        now, h = heapq.heappop(running)
        done_at[h] = now
        cpu, gpu = demand[h]
        free[0], free[1] = free[0] + cpu, free[1] + gpu
    return now


def stages_efficiency(store: Any, stage_hashes: Iterable[str]) -> dict[str, Any] | None:
    """``efficiency`` of the given stages as the catalog holds them (``run``/``resume``: the
    stages this run launched)."""
    rows = [r for h in dict.fromkeys(stage_hashes) if (r := store.get_stage(h)) is not None]
    times = store.reads.final_metrics([r.stage_hash for r in rows], TIME_PREFIX)
    return efficiency([{"state": r.state, "seconds": _wall(r), "gpu": bool(r.gpu_seconds),
                        "times": stage_times(_wall(r), times.get(r.stage_hash))} for r in rows])
