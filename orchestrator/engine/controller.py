"""The controller: catalog state -> Ray work -> catalog state (DESIGN §5.1, §5.2).

The SQL catalog is the only durable state. One loop:

1. promote: PLANNED/BLOCKED stages whose upstreams all SUCCEEDED become READY; stages with a
   FAILED/CANCELLED/BLOCKED upstream become BLOCKED;
2. claim READY stages (compare-and-set READY -> RUNNING) while the cluster has room, and launch
   each as a Ray task with its resources (training under Ray Train when its launcher says so);
3. wait on Ray, watch the RUNNING rows, and finalise: success only through
   ``CatalogStore.finalize_success`` (metrics + artifact digests + env in one transaction),
   failures classified and retried by class (``failures.POLICIES``).

Heartbeats come from the worker that runs a stage (``runner.WorkerHeartbeat``), not from here.
An own stage whose worker beat, then fell silent for ``stale_after_s``, is hung: its task is
force-cancelled and the stage retried as failure class ``hung`` (resuming from its newest
checkpoint), with the small budget of ``failures.POLICIES["hung"]``, not a preemption's.
One whose worker has not beaten yet (task still queued in Ray) is left to Ray.

A killed controller leaves RUNNING rows behind; the next controller (``phaselab resume``)
reclaims those whose owner process is gone (same host) or whose heartbeat expired, and relaunches
them into the same out_dir, where the training workloads resume from their newest checkpoint.
SUCCEEDED stages are never launched again: the claim only takes READY rows.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking.mlflow_common import split_secrets
from phaselab.orchestrator.engine.failures import failure_report, policy_of, should_retry
from phaselab.orchestrator.engine.mlflow_runs import MlflowRuns
from phaselab.orchestrator.engine.ray_local import init_ray  # noqa: F401  (the CLI and tests import it from here)
from phaselab.orchestrator.engine.runner import worker_catalog_url
from phaselab.orchestrator.plan.dag import Dag, StageNode
from phaselab.orchestrator.plan.placement import (
    RESOURCE_WAIT_ENV,
    cluster_gpu,
    live_nodes,
    resource_wait,
    unschedulable,
    with_auto_gpus,
)
from phaselab.orchestrator.stages import STAGES, Stage, registered

PENDING = ("PLANNED", "READY", "RUNNING")
DEAD_UPSTREAM = ("FAILED", "CANCELLED", "BLOCKED")


def resolved_with_stages(dag: Dag) -> str:
    """The resolved grid YAML plus an ``x-phaselab`` key (ignored when the grid is read back)
    listing the version's stage hashes and code digest, so ``status``/``retry`` can tell the
    current version's stages from those of earlier versions sharing the same cells."""
    import yaml

    meta = {"x-phaselab": {"stages": list(dag.nodes), "code": dag.code.digest}}
    return dag.yaml_resolved + yaml.safe_dump(meta, sort_keys=False)


def version_stages(grid: Mapping[str, Any]) -> set[str] | None:
    """Stage hashes of a grid's latest version (``store.get_grid`` row), None if not recorded."""
    import yaml

    if not grid.get("versions"):
        return None
    doc = yaml.safe_load(grid["versions"][-1]["yaml_resolved"]) or {}
    stages = (doc.get("x-phaselab") or {}).get("stages") if isinstance(doc, dict) else None
    return set(stages) if stages is not None else None


def default_runs_root() -> Path:
    """``PHASELAB_RUNS_ROOT``, else ``<project home>/.phaselab/runs`` (``catalog/store/home.py``)."""
    from phaselab.catalog.store.home import state_dir

    return Path(os.environ.get("PHASELAB_RUNS_ROOT") or state_dir() / "runs").resolve()


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_is_dead(owner: str | None) -> bool:
    """True when ``owner`` names a process on this host that no longer exists."""
    if not owner or owner.count(":") < 2:
        return False
    host, pid, _ = owner.rsplit(":", 2)
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass
class Summary:
    grid: str
    states: dict[str, str] = field(default_factory=dict)          # hash -> state
    launched: list[str] = field(default_factory=list)
    failed: dict[str, tuple[str, str]] = field(default_factory=dict)  # hash -> (class, message)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(s == "SUCCEEDED" for s in self.states.values())

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.states.values():
            out[s] = out.get(s, 0) + 1
        return out


class Controller:
    """Drives one grid's DAG to completion (see the module docstring)."""

    def __init__(self, store: Any, dag: Dag, *, runs_root: Path | None = None, owner: str | None = None,
                 heartbeat_s: float = 5.0, stale_after_s: float = 60.0, poll_s: float = 0.25,
                 env_vars: Mapping[str, str] | None = None, mlflow: Mapping[str, Any] | None = None,
                 on_event: Callable[[str, StageNode, str], None] | None = None,
                 fixed_cluster: bool | None = None, resource_wait_s: float | None = None) -> None:
        self.store, self.dag = store, dag
        self.runs_root = Path(runs_root or default_runs_root()).resolve()
        self.owner = owner or new_owner()
        if not (heartbeat_s > 0 and stale_after_s > 2 * heartbeat_s):
            raise ValueError(f"need heartbeat_s > 0 and stale_after_s > 2 * heartbeat_s (a worker beats every "
                             f"heartbeat_s), got heartbeat_s={heartbeat_s!r}, stale_after_s={stale_after_s!r}")
        self.heartbeat_s, self.stale_after_s, self.poll_s = heartbeat_s, stale_after_s, poll_s
        self.env_vars = dict(env_vars or {})
        self.mlflow = dict(mlflow) if mlflow else None   # {"tracking_uri", "artifact_root"}
        self.runs: MlflowRuns | None = None   # the grid's MLflow runs, once the grid is submitted
        self.on_event = on_event or (lambda kind, node, detail: None)
        # A local cluster has fixed resources: a stage it can never fit fails at once (class
        # config) instead of waiting forever; a remote (possibly autoscaling) one may grow.
        self.fixed_cluster = not os.environ.get("RAY_ADDRESS") if fixed_cluster is None else fixed_cluster
        # On a remote cluster, how long a stage waits for resources no node has (an autoscaler
        # may be adding the node) before it fails; its reason is the stage's message meanwhile.
        self.resource_wait_s = resource_wait(resource_wait_s)
        self._waiting: dict[str, float] = {}   # stage hash -> when it first could not be placed
        self.grid_id: int | None = None
        self._inflight: dict[Any, str] = {}
        self._not_before: dict[str, float] = {}
        self._empty_since: float | None = None   # when the cluster first reported no CPUs
        self._remote = None

    # -- submission ---------------------------------------------------------------------------
    def submit(self, *, requeue: bool = True) -> int:
        """Upsert grid, cells, stages, memberships and edges (all idempotent). With ``requeue``,
        FAILED/CANCELLED/BLOCKED stages go back to PLANNED (DESIGN §5.1 grid semantics)."""
        from phaselab.catalog.store.api import StageSpec

        dag, store = self.dag, self.store
        self.grid_id = store.upsert_grid(name=dag.spec.grid, grid_hash=dag.grid_hash,
                                         yaml_submitted=dag.yaml_submitted, yaml_resolved=resolved_with_stages(dag))
        cell_ids = {c.key: store.upsert_cell(grid_id=self.grid_id, cell_key=c.key, axes=dict(c.axes))
                    for c in dag.cells}
        for node in dag.nodes.values():
            store.upsert_stage(StageSpec(
                stage_hash=node.hash, kind=node.kind, name=node.name, config=dict(node.config),
                cache_key_parts={"parts": dict(node.key.parts), "code_modules": dict(node.key.code_modules)},
                ray_run_name=node.hash if node.launcher == "ray_train" else None,
                storage_uri=str(self.out_dir(node.hash))))
        for cell_key, stages in dag.cell_stages.items():
            for name, h in stages.items():
                store.link_cell_stage(cell_ids[cell_key], h, role=name)
        for up, down, rel in dag.edges():
            store.add_edge(up, down, rel)
        if requeue:
            for h in dag.nodes:
                store.transition(h, "PLANNED", expected={"FAILED", "CANCELLED", "BLOCKED"})
        return self.grid_id

    def check_runs_root(self) -> None:
        """Raise ``db.StorageFault`` (one line: folder, cause, fix) unless the runs root takes
        writes, before any work starts: a full or read-only one would fail every stage."""
        from phaselab.catalog.store.db import check_writable

        check_writable(self.runs_root, what="runs folder", fix=(
            "make it writable or free space there, or put the stage outputs elsewhere (--runs-root, "
            "$PHASELAB_RUNS_ROOT, or $PHASELAB_HOME for all of .phaselab)"))

    def needs_cluster(self, *, requeue: bool = True) -> bool:
        """Whether the DAG may launch work (a read): a stage not in the catalog, pending, or
        with ``requeue`` FAILED/CANCELLED/BLOCKED. The CLI then reaches the cluster before
        :meth:`submit`, so an unreachable one leaves no READY stage that no controller owns."""
        states = self.store.reads.stage_states(list(self.dag.nodes))
        again = PENDING + DEAD_UPSTREAM if requeue else PENDING
        return any(states.get(h) in (None, *again) for h in self.dag.nodes)

    def out_dir(self, stage_hash: str) -> Path:
        if not all(c in "0123456789abcdef" for c in stage_hash):   # only hashes become paths
            raise ValueError(f"stage hash {stage_hash!r} is not hex")
        return self.runs_root / stage_hash

    # -- the loop -----------------------------------------------------------------------------
    def pending(self) -> bool:
        """Whether any stage of the DAG still has to run (False: everything is cached or final,
        and ``run`` needs neither Ray nor MLflow)."""
        if self.grid_id is None:
            self.submit()
        rows = self._rows()
        self._promote(rows)
        return any(r.state in PENDING for r in self._rows().values())

    def run(self, *, timeout_s: float | None = None) -> Summary:
        """Run until no stage of the grid is PLANNED/READY/RUNNING. Returns the final states."""
        start, last_hb = time.monotonic(), 0.0
        summary = Summary(grid=self.dag.spec.grid)
        if self.pending():
            import ray

            self.runs = MlflowRuns(self.mlflow, dag=self.dag, store=self.store, grid_id=self.grid_id,
                                   runs_root=self.runs_root)
            self.runs.prepare()
            self._remote = ray.remote(_execute_remote)
            # Ray Train's helpers inside a stage (its placement-group cleaner) find the cluster
            # by address "auto", which fails when a second local cluster runs on the machine
            # (two `phaselab run`s on one GPU box); the stage's environment names this one.
            self.env_vars.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
            if not self.fixed_cluster:   # gpus: auto was planned for this machine's GPU, not the cluster's
                with_auto_gpus(self.dag.nodes, cluster_gpu(live_nodes()))
        while self._remote is not None:
            rows = self._rows()
            if self._promote(rows):
                rows = self._rows()
            now = time.monotonic()
            if now - last_hb >= self.heartbeat_s:
                stale = {r.stage_hash for r in self.store.stale_running(self.stale_after_s)}
                self._watch(rows, stale)
                self._reclaim(rows, stale)
                last_hb = now
                rows = self._rows()
            summary.launched += self._launch(rows)
            if not self._inflight:
                if not any(r.state in PENDING for r in rows.values()):
                    break
                time.sleep(self.poll_s)   # stages RUNNING under another live controller, or backoff
            else:
                self._collect()
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"grid {self.dag.spec.grid} not done after {timeout_s} s")
        rows = self._rows()
        summary.states = {h: rows[h].state for h in self.dag.nodes}
        summary.failed = {h: (r.failure_class or "", r.message or "") for h, r in rows.items()
                          if r.state in ("FAILED", "BLOCKED", "CANCELLED")}
        summary.seconds = time.monotonic() - start
        return summary

    def _rows(self) -> dict[str, Any]:
        rows = {r.stage_hash: r for r in self.store.stages_for_grid(self.grid_id)}
        return {h: rows[h] for h in self.dag.nodes}

    def _promote(self, rows: Mapping[str, Any]) -> bool:
        changed = False
        for h, node in self.dag.nodes.items():
            state = rows[h].state
            if state not in ("PLANNED", "BLOCKED", "READY"):
                continue
            ups = [rows[u] for u in node.upstream.values()]
            dead = [u for u in ups if u.state in DEAD_UPSTREAM]
            if dead:
                if state != "BLOCKED":
                    changed |= self.store.transition(h, "BLOCKED", expected={"PLANNED", "READY"},
                                                     message=f"upstream {dead[0].name} "
                                                             f"{dead[0].stage_hash[:12]} is {dead[0].state}")
            elif state != "READY" and all(u.state == "SUCCEEDED" for u in ups):
                changed |= self.store.transition(h, "READY", expected={"PLANNED", "BLOCKED"})
        return changed

    def _capacity(self) -> tuple[float, float]:
        import ray

        total = ray.cluster_resources()
        used_cpu = sum(self._demand(self.dag.nodes[h])[0] for h in self._inflight.values())
        used_gpu = sum(self._demand(self.dag.nodes[h])[1] for h in self._inflight.values())
        return total.get("CPU", 0.0) - used_cpu, total.get("GPU", 0.0) - used_gpu

    @staticmethod
    def _demand(node: StageNode) -> tuple[float, float]:
        return STAGES[node.kind].demand(node.resources, node.config)

    def _launch(self, rows: Mapping[str, Any]) -> list[str]:
        import ray

        launched = []
        total = ray.cluster_resources()
        if total.get("CPU", 0.0) <= 0.0:
            # A node that has not registered yet (or was just restarted) reports 0 CPUs / 0 GPUs;
            # judging "unschedulable" then would fail every stage of a healthy cluster. Wait a
            # bounded time, then judge (a cluster that stays empty must not hang the grid).
            self._empty_since = self._empty_since or time.monotonic()
            if time.monotonic() - self._empty_since < 60.0:
                return launched
        else:
            self._empty_since = None
        free_cpu, free_gpu = self._capacity()
        nodes = None
        for h, node in self.dag.nodes.items():
            if rows[h].state != "READY" or h in self._inflight.values():
                continue
            if self._not_before.get(h, 0.0) > time.monotonic():
                continue
            cpu, gpu = self._demand(node)
            nodes = live_nodes() if nodes is None else nodes
            why = unschedulable(node, total, nodes)
            if why is not None:
                self._wait_for_resources(node, rows[h], why)
                continue
            self._waiting.pop(h, None)
            if cpu > free_cpu + 1e-9 or gpu > free_gpu + 1e-9:
                continue
            if not self.store.claim(h, self.owner):
                continue
            free_cpu, free_gpu = free_cpu - cpu, free_gpu - gpu
            payload = self._payload(node, rows) | {"attempt": rows[h].attempts + 1}
            ref = self._remote.options(**self._options(node)).remote(payload, STAGES[node.kind])
            self._inflight[ref] = h
            launched.append(h)
            self.on_event("started", node, f"attempt {rows[h].attempts + 1}")
        return launched

    def _wait_for_resources(self, node: StageNode, row: Any, why: str) -> None:
        """A READY stage no node can run: on a fixed local cluster it fails at once (class
        config); on a remote one it stays READY with ``why`` as its message (``phaselab status``)
        for ``resource_wait_s``, then fails naming what it waited for."""
        now = time.monotonic()
        first = self._waiting.setdefault(node.hash, now)
        if self.fixed_cluster or now - first >= self.resource_wait_s:
            msg = why if self.fixed_cluster else (
                f"{why} (waited {now - first:.0f} s; {RESOURCE_WAIT_ENV}={self.resource_wait_s:g})")
            self._waiting.pop(node.hash, None)
            if self.store.record_failure(node.hash, failure_class="config", message=msg):
                self.on_event("failed", node, msg)
        elif first == now:
            msg = f"waiting for resources: {why}; fails after {self.resource_wait_s:g} s unless a node with them joins"
            self.store.transition(node.hash, "READY", expected={"READY"}, failure_class=row.failure_class,
                                  message=msg)
            self.on_event("waiting", node, msg)

    def _ray_name(self, node: StageNode) -> str:
        """What the Ray dashboard calls the stage's task and its Ray Train run: grid, stage and
        cell, then the hash that keeps it unique (``quickstart:pretrain[pe=rope,seed=0]:1a2b..``)."""
        return f"{self.dag.spec.grid}:{node.label}:{node.hash[:12]}"

    def _options(self, node: StageNode) -> dict[str, Any]:
        opts: dict[str, Any] = {"max_retries": 0, "name": self._ray_name(node)}
        opts.update(STAGES[node.kind].ray_options(node.resources, node.launcher))
        public = split_secrets(self.env_vars)[0]   # credentials travel in the payload: Ray logs runtime_env
        if public:
            opts["runtime_env"] = {"env_vars": public}
        return opts

    def _payload(self, node: StageNode, rows: Mapping[str, Any]) -> dict[str, Any]:
        upstream = {}
        for name, h in node.upstream.items():
            arts = {a.name: a.uri for a in self.store.reads.artifacts_for_stage(h)}
            upstream[name] = {"hash": h, "kind": rows[h].kind, "artifacts": arts}
        r = node.resources
        return {"stage_hash": node.hash, "kind": node.kind, "name": node.name, "config": dict(node.config),
                "launcher": node.launcher, "ray_name": self._ray_name(node),
                "out_dir": str(self.out_dir(node.hash)),
                "runs_root": str(self.runs_root), "upstream": upstream,
                "catalog_url": worker_catalog_url(self.store.url), "heartbeat_s": self.heartbeat_s,
                "secret_env": split_secrets(self.env_vars)[1],
                "resources": {"cpus": r.cpus, "gpus": r.gpus, "memory_gb": r.memory_gb,
                              "accelerator": r.accelerator, "num_workers": r.num_workers},
                "mlflow": self.runs.stage_args(node) if self.runs else None}

    def _collect(self) -> None:
        import ray

        done, _ = ray.wait(list(self._inflight), num_returns=1, timeout=self.poll_s)
        if done:
            more, _ = ray.wait([r for r in self._inflight if r not in done],
                               num_returns=len(self._inflight) - len(done), timeout=0)
            done += more
        for ref in done:
            h = self._inflight.pop(ref)
            try:
                out = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a dead worker, classified from Ray's error
                out = failure_report(exc, where=self.out_dir(h))
            self._finish(h, out)

    def _finish(self, h: str, out: Mapping[str, Any]) -> None:
        from phaselab.catalog.store.api import ArtifactSpec, StateError
        from phaselab.catalog.tracking import MetricRecord

        node = self.dag.nodes[h]
        if not out["ok"]:
            return self._fail(h, out)
        records = [MetricRecord(**r) for r in out["records"] if math.isfinite(r["value"])]
        try:
            self.store.finalize_success(h, metrics=records, artifacts=[ArtifactSpec(**a) for a in out["artifacts"]],
                                        env=out["env"], backend=out.get("backend"),
                                        mlflow_run_id=out.get("mlflow_run_id"),
                                        gpu_seconds=out.get("gpu_seconds"), node_id=out.get("node_id"))
        except StateError as err:   # cancelled while running: the outputs stay, the state too
            self.on_event("skipped", node, str(err))
            return None
        if out.get("children"):
            self._record_children(node, STAGES[node.kind], out["children"], out["env"])
        self.on_event("succeeded", node, f"{out.get('seconds', 0):.1f} s")
        return None

    def _record_children(self, node: StageNode, stage: Stage, children: list[Mapping[str, Any]],
                         env: Mapping[str, Any]) -> None:
        """The stage's child stages (kind ``stage.child_kind``, e.g. tune's trials; fields as in
        StageResult.children): completed ones SUCCEEDED with their metrics and checkpoint, the
        others CANCELLED; idempotent on a re-run."""
        from phaselab.catalog.store.api import ArtifactSpec, StageSpec
        from phaselab.catalog.tracking import MetricRecord
        from phaselab.orchestrator.plan.hashing import canonical_json, sha256_hex

        kind = stage.child_kind
        if kind is None:
            raise TypeError(f"stage kind {node.kind!r} reported child stages but declares no child_kind")
        cells = {c["cell_key"]: c["id"] for c in self.store.reads.cells_for_grid(self.grid_id)}
        for child in children:
            parts = {"kind": kind, "parent": node.hash, **child["config"]}
            h = sha256_hex(canonical_json(parts))
            self.store.upsert_stage(StageSpec(
                stage_hash=h, kind=kind, name=f"{node.name}/{kind}-{child['id']}",
                config={"parent": node.hash, **child["config"]},
                cache_key_parts={"parts": parts}, state="RUNNING" if child["completed"] else "PLANNED",
                storage_uri=str(self.out_dir(node.hash) / child["folder"])))
            self.store.add_edge(h, node.hash, "uses")
            for cell_key, _ in node.members:
                self.store.link_cell_stage(cells[cell_key], h, role=f"{node.name}/{kind}")
            if child["completed"]:
                records = [MetricRecord(**r) for r in child["records"] if math.isfinite(r["value"])]
                self.store.finalize_success(h, metrics=records, artifacts=[ArtifactSpec(**child["artifact"])],
                                            env=env, backend=None, mlflow_run_id=None)
            else:
                self.store.transition(h, "CANCELLED", expected={"PLANNED"}, failure_class=child["failure_class"],
                                      message=child["message"])

    def _fail(self, h: str, out: Mapping[str, Any]) -> None:
        node, cls = self.dag.nodes[h], out["failure_class"]
        policy = policy_of(cls)
        row = self.store.get_stage(h)
        message = out["message"]
        if cls == "cancelled":
            self.store.transition(h, "CANCELLED", expected={"RUNNING"}, failure_class=cls, message=message)
        elif row is not None and should_retry(cls, attempts=row.attempts, stage_max_retries=node.max_retries):
            self.store.transition(h, "READY", expected={"RUNNING"}, failure_class=cls,
                                  message=f"retrying after {cls}: {message}")
            self._not_before[h] = time.monotonic() + policy.backoff_s * row.attempts
            self.on_event("retrying", node, f"{cls}: {message}")
            return
        else:
            advice = f"\nadvice: {policy.advice}" if policy.advice else ""
            self.store.record_failure(h, failure_class=cls, message=message + advice)
        if "traceback" not in out and self.runs is not None:   # the worker died or was stopped: it never ended its run
            self.runs.end_stage_run(h, "KILLED" if cls == "cancelled" else "FAILED")
        self.on_event("failed", node, f"{cls}: {message}")
        if policy.fail_fast:
            self._fail_fast(node)

    def _fail_fast(self, node: StageNode) -> None:
        """Code errors: every pending stage with the same code hash fails now (DESIGN §5.9)."""
        code = node.key.parts["code"]
        rows = self._rows()
        for h, other in self.dag.nodes.items():
            if h != node.hash and other.key.parts["code"] == code and rows[h].state in ("PLANNED", "READY"):
                self.store.transition(h, "FAILED", expected={"PLANNED", "READY"}, failure_class="code",
                                      message=f"fail fast: stage {node.name} {node.hash[:12]} hit a code "
                                              f"error under the same code hash {code[:12]}")

    def _watch(self, rows: Mapping[str, Any], stale: set[str]) -> None:
        """Own in-flight stages: stop those no longer RUNNING (cancelled from the CLI) and those
        whose worker stopped heartbeating (see the module docstring)."""
        import ray

        for ref, h in list(self._inflight.items()):
            row = rows[h]
            if row.state != "RUNNING":
                ray.cancel(ref, force=True)
                self._inflight.pop(ref, None)
                self.on_event("cancelled", self.dag.nodes[h], "state changed outside the controller")
            elif h in stale and row.heartbeat_at != row.started_at and not ray.wait([ref], timeout=0)[0]:
                ray.cancel(ref, force=True)
                self._inflight.pop(ref, None)
                self._fail(h, {"ok": False, "failure_class": "hung",
                               "message": f"no heartbeat from the stage's worker for {self.stale_after_s:g} s "
                                          f"(last at {row.heartbeat_at}): hung or lost; its task was cancelled"})

    def _reclaim(self, rows: Mapping[str, Any], stale: set[str]) -> None:
        """RUNNING rows of a dead controller go back to READY (relaunched into the same out_dir)."""
        mine = set(self._inflight.values())
        for h, row in rows.items():
            if row.state != "RUNNING" or h in mine or row.owner == self.owner:
                continue
            if (h in stale or owner_is_dead(row.owner)) and self.store.transition(
                    h, "READY", expected={"RUNNING"}, failure_class="preemption",
                    message=f"reclaimed from controller {row.owner}"):
                self.on_event("reclaimed", self.dag.nodes[h], f"from {row.owner}")


def _execute_remote(payload: Mapping[str, Any], stage: Stage) -> dict[str, Any]:
    """Ray task body (module-level so workers import it by name). The stage object travels with
    the payload, so a worker runs the kind the DAG was planned with also when that kind was
    registered at run time in the driver (a plugin, a test) and not in the worker's registry."""
    from phaselab.orchestrator.engine.runner import execute

    os.environ.update(payload.get("secret_env") or {})   # this process and what it starts, never a log
    with registered(stage):   # a worker runs one task at a time
        return execute(payload)
