"""Ray Train V2 entry: ``fit()`` on the driver, ``train_loop_per_worker(cfg)`` on every rank.

DESIGN §5.3 / §7 example 12: the worker is a plain function that rebuilds the typed config from a
JSON-safe dict, owns its setup and reports through Ray; cluster shape stays in ``fit``'s
ScalingConfig. The run's folder is named by the stage content hash (``run_name``), so re-running
``fit`` with the same ``(storage_path, run_name)`` resumes from the run's latest reported
checkpoint — Ray Train V2 has no ``resume_from_checkpoint`` (STACK.md). What the Ray dashboard
shows as the run's name may differ (``display_name`` / :func:`train_run_name`: grid, stage and
cell), while the folder stays the hash.

The worker is a thin adapter of ``session.TrainSession`` (the same run as ``api.run_training``):
it takes rank and world from the Ray context, averages logged floats over ranks, and publishes
each checkpoint by the contract of DESIGN §5.7: every rank writes its part into a temp folder
(``TrainSession.write``: DeepSpeed shards under ``train.zero_stage``, else rank 0's model.pt and
train_state.pt), barrier, every rank ``ray.train.report(metrics, checkpoint=...)``, and Ray merges
the rank folders. Resume: ``ray.train.get_checkpoint().as_directory()`` → ``TrainSession.restore``.

Per-step metrics of rank 0 go to the run folder's per-step log (``catalog.run_folder.STEPS_FILE``;
``out_dir`` must be on storage every worker can reach; the orchestrator replays it into MLflow),
the final MetricRecords to ``out_dir/records.json``, the best-validation weights to ``out_dir/best`` (rank 0;
checkpoint.BestKeeper). Besides the loop's lines (``train/*``, ``valid/*``, ``ckpt/save_s``), a
resumed run writes ``ckpt/load_s`` at the resumed step: rank 0's wall seconds from asking Ray for
the checkpoint folder to the restored RNG state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import MetricRecord, NullTracker, run_folder

log = logging.getLogger(__name__)

# The name the Ray dashboard shows for the Ray Train run of the stage running in this context;
# the orchestrator's worker sets it around a stage (:func:`train_run_name`) so the stage code
# between it and :func:`fit` need not carry it.
_DISPLAY_NAME: ContextVar[str | None] = ContextVar("phaselab_train_run_name", default=None)


@contextmanager
def train_run_name(name: str | None) -> Iterator[None]:
    """Within the block, :func:`fit` without ``display_name`` names its Ray Train run ``name``
    (None: the run folder's name, the content hash)."""
    token = _DISPLAY_NAME.set(name)
    try:
        yield
    finally:
        _DISPLAY_NAME.reset(token)


def shown_name(name: str) -> str:
    """``name`` as a Ray Train run name: printable, one line, no path separators (Ray uses a run
    name as a folder name unless told otherwise), at most 200 characters with its end (the
    hash that makes it unique) kept."""
    clean = " ".join("".join(c if c.isprintable() and c not in "/\\" else " " for c in name).split())
    return clean if len(clean) <= 200 else f"{clean[:100]}...{clean[-97:]}"


def run_config(*, run_name: str, storage_path: Path, display_name: str | None = None, max_failures: int = 3):
    """Ray Train's RunConfig: checkpoints in ``storage_path/run_name`` whatever the run is
    called in the dashboard (``display_name``, cleaned by :func:`shown_name`; default the
    context's :func:`train_run_name`, else ``run_name``). Ray derives the run folder from
    ``RunConfig.name`` through its cached ``storage_context``; giving it the folder's context up
    front keeps resume and ``phaselab gc`` keyed by the content hash."""
    import ray.train

    shown = shown_name(display_name or _DISPLAY_NAME.get() or run_name)
    storage = str(Path(storage_path).resolve())
    rc = ray.train.RunConfig(name=shown, storage_path=storage,
                             failure_config=ray.train.FailureConfig(max_failures=max_failures))
    if shown != run_name:
        from ray.train.v2._internal.execution.storage import StorageContext

        rc.__dict__["storage_context"] = StorageContext(storage_path=storage, experiment_dir_name=run_name,
                                                        storage_filesystem=rc.storage_filesystem)
    return rc


class JsonlTracker(NullTracker):
    """Appends ``{"step": s, **metrics}`` lines to a run folder's per-step log
    (``catalog.run_folder.StepLog``: one complete line per write, a torn final line repaired
    before the first); the other Tracker calls are no-ops (params and records travel through
    fit's return value)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._log = run_folder.StepLog(self.path)

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        self._log.append(step, metrics)


def _allreduce_mean(value: float) -> float:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _report(step: int, metrics: Mapping[str, float], write) -> str:
    """Write this rank's part of a checkpoint into a temp folder, barrier, report (DESIGN §5.7)."""
    import ray.train
    from ray.train import Checkpoint, CheckpointUploadMode

    from phaselab.workloads.train.checkpoint import step_name

    tmp = Path(tempfile.mkdtemp(prefix=f"phaselab-{step_name(step)}-"))
    write(tmp)
    _barrier()  # every shard is on local disk before any upload starts
    ray.train.report({"step": step, **metrics}, checkpoint=Checkpoint.from_directory(str(tmp)),
                     checkpoint_dir_name=step_name(step),
                     checkpoint_upload_mode=CheckpointUploadMode.ASYNC)  # ray-project/ray#48801
    return step_name(step)


def share_gpu(device, fraction: float | None) -> None:
    """A worker that reserved a fraction of a GPU (``resources.gpus: 0.25``: Ray places that many
    workers on one card, each its own process and CUDA context) may allocate only that fraction
    of the card's memory, so one stage cannot starve the others sharing it."""
    import torch

    if device.type == "cuda" and fraction is not None and 0 < fraction < 1:
        torch.cuda.set_per_process_memory_fraction(fraction, device)


def _parsed(cfg: Mapping[str, Any]):
    """The typed spec; ``debug_steps`` (CI) keeps the first N steps of the real schedule."""
    from phaselab.workloads.train.api import parse_spec

    parsed = parse_spec(cfg["spec"])
    if cfg.get("debug_steps"):
        t = parsed.train
        parsed = dataclasses.replace(parsed, train=dataclasses.replace(
            t, steps=min(t.steps, int(cfg["debug_steps"])),
            decay_steps=t.decay_steps if t.decay_steps is not None else t.steps))
    return parsed


def train_loop_per_worker(cfg: dict) -> None:
    """Ray Train worker: ``cfg = {"spec", "out_dir", "init_from", "debug_steps", "stop_after",
    "gpu_fraction", "trace_batches"}``. The Ray adapter of ``session.TrainSession``: ranks from
    the Ray context, checkpoints published by ``ray.train.report``."""
    from phaselab.workloads.train.deepspeed_engine import configure_environment

    configure_environment()  # before anything imports deepspeed
    import ray.train
    import ray.train.torch

    from phaselab.workloads.train.session import Ranks, TrainSession

    ctx = ray.train.get_context()
    ranks = Ranks(rank=ctx.get_world_rank(), world=ctx.get_world_size(), reduce=_allreduce_mean)
    device = ray.train.torch.get_device()
    share_gpu(device, cfg.get("gpu_fraction"))
    out_dir = Path(cfg["out_dir"])
    trace = Path(cfg["trace_batches"]) if cfg.get("trace_batches") else None
    session = TrainSession(_parsed(cfg), cfg["spec"], out_dir=out_dir, tracker=JsonlTracker(run_folder.steps_path(out_dir)),
                           init_from=Path(cfg["init_from"]) if cfg.get("init_from") else None,
                           device=device, ranks=ranks, trace_batches=trace)
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        session.resume(ckpt.as_directory())   # may download from storage_path: part of the restore
    result = session.run(_report, stop_after=cfg.get("stop_after"))
    if result.stopped == "stop_after":
        return
    ray.train.report(session.finish(result).metrics)


_CASED_KEYS = {"CPU": "CPU", "GPU": "GPU", "TPU": "TPU", "MEMORY": "memory"}


def _check_resources(resources: Mapping[str, Any], *, use_gpu: bool) -> dict[str, float]:
    """``resources_per_worker`` as Ray reads it; a bad key or value is a ValueError naming it."""
    if not isinstance(resources, Mapping):
        raise TypeError(f"resources_per_worker must be a mapping like {{'CPU': 2, 'GPU': 1}}, "
                        f"got {type(resources).__name__}")
    out: dict[str, float] = {}
    for key, value in resources.items():
        name = f"resources_per_worker[{key!r}]"
        if not isinstance(key, str) or not key:
            raise ValueError(f"{name}: resource names are non-empty strings")
        # Ray keys are case-sensitive: "gpu" would be a custom resource no node has, and the
        # workers would wait forever for it instead of failing.
        cased = _CASED_KEYS.get(key.upper())
        if cased is not None and key != cased:
            raise ValueError(f"{name}: Ray resource names are case-sensitive; did you mean {cased!r}?")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        out[key] = float(value) if not isinstance(value, int) else value
    gpus = out.get("GPU")
    if gpus is not None and gpus > 0 and not use_gpu:
        raise ValueError(f"resources_per_worker['GPU']={gpus!r} needs use_gpu=True")
    if gpus is not None and gpus == 0 and use_gpu:
        raise ValueError("resources_per_worker['GPU']=0 contradicts use_gpu=True")
    return out


def scaling_config(*, num_workers: int, use_gpu: bool,
                   resources_per_worker: Mapping[str, Any] | None = None):
    """The Ray Train ``ScalingConfig`` of ``fit`` (built here so it can be checked without Ray running).

    ``resources_per_worker`` (e.g. ``{"CPU": 2, "GPU": 1}``) is what each worker reserves; None
    keeps Ray's default (1 CPU, or 1 GPU and no CPU with ``use_gpu``), and so does ``{}``. With
    ``use_gpu`` and no ``"GPU"`` key Ray adds one GPU per worker.
    """
    import ray.train

    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    resources = None if resources_per_worker is None else _check_resources(resources_per_worker,
                                                                           use_gpu=use_gpu)
    resources = resources or None  # {} would reserve nothing at all; it means "Ray's default"
    return ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                   resources_per_worker=resources)


def fit(spec: Mapping[str, Any], *, out_dir: Path, run_name: str, storage_path: Path,
        num_workers: int = 1, use_gpu: bool = False, init_from: Path | None = None,
        debug_steps: int | None = None, max_failures: int = 3, stop_after: int | None = None,
        resources_per_worker: Mapping[str, Any] | None = None, trace_batches: Path | None = None,
        display_name: str | None = None):
    """Run one training stage on Ray Train V2 and return a ``TrainOutcome``.

    Args:
        spec: the training spec of ``api.run_training`` (validated here, on the driver).
        out_dir: the run folder the workers share (``catalog.run_folder``: the per-step log, the
            final metrics and records).
        run_name: the stage content hash; the same name under the same ``storage_path`` resumes.
        storage_path: Ray Train's run root (checkpoints live in ``storage_path/run_name``).
        display_name: the run's name in the Ray dashboard (default: the context's
            :func:`train_run_name`, else ``run_name``); never changes where checkpoints live.
        num_workers, use_gpu: data-parallel ranks and whether each gets a GPU.
        resources_per_worker: what each rank reserves, e.g. ``{"CPU": 2, "GPU": 1}`` (see
            :func:`scaling_config`; bad keys or values raise ValueError before Ray starts).
        init_from: pretrained ``model.pt`` or checkpoint folder (CPT / fine-tunes).
        debug_steps: run only the first N steps of the schedule (CI smoke of the real entry).
        max_failures: Ray FailureConfig retries for real errors (DESIGN §5.3).
        stop_after: tests only — every rank stops after N steps without checkpointing (a kill).
        trace_batches: tests only — every rank records the training batches it reads under this
            folder (``session.BatchTrace``).
    Raises:
        TrainingDiverged / any worker error (re-raised from the Ray result).
    """
    from ray.train.torch import TorchTrainer

    from phaselab.workloads.paths import check_path, check_run_folder
    from phaselab.workloads.train.api import TrainOutcome, best_folder, parse_spec

    parse_spec(spec)  # fail fast on the driver with the dotted path of a bad key
    scaling = scaling_config(num_workers=num_workers, use_gpu=use_gpu,
                             resources_per_worker=resources_per_worker)
    out_dir = check_path(out_dir, what="out_dir", expect="new_dir").resolve()   # workers run elsewhere
    check_run_folder(out_dir)   # no symlink in it may lead the workers' files elsewhere
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {"spec": json.loads(json.dumps(dict(spec))), "out_dir": str(out_dir),
              "init_from": str(Path(init_from).resolve()) if init_from else None,
              "debug_steps": debug_steps, "stop_after": stop_after,
              "trace_batches": str(Path(trace_batches).resolve()) if trace_batches else None,
              "gpu_fraction": float((resources_per_worker or {}).get("GPU", 0) or 0)}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=config,
        scaling_config=scaling,
        run_config=run_config(run_name=run_name, storage_path=storage_path, display_name=display_name,
                              max_failures=max_failures))
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    if result.checkpoint is None:
        raise RuntimeError(f"Ray Train run {run_name!r} finished without a checkpoint")
    records_path = out_dir / run_folder.RECORDS_FILE
    records = ([MetricRecord(**r) for r in json.loads(records_path.read_text())]
               if records_path.exists() and stop_after is None else [])
    # Ray attaches to result.metrics the metrics of the last *checkpointed* report; the final
    # evaluation (reported after it) is read from what rank 0 wrote.
    metrics_path = out_dir / run_folder.FINAL_METRICS_FILE
    source = (json.loads(metrics_path.read_text()) if metrics_path.exists() and stop_after is None
              else result.metrics or {})
    metrics = {k: float(v) for k, v in source.items() if isinstance(v, (int, float))}
    return TrainOutcome(metrics=metrics, checkpoint=Path(result.checkpoint.path) / run_folder.MODEL_FILE,
                        records=records, best=best_folder(out_dir))


if __name__ == "__main__":  # `python -m phaselab.workloads.train.ray_entry SPEC.json OUT --debug-steps N`
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--run-name", default="debug")
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--debug-steps", type=int, default=None)
    args = parser.parse_args()
    outcome = fit(json.loads(args.spec.read_text()), out_dir=args.out_dir, run_name=args.run_name,
                  storage_path=args.out_dir / "ray", num_workers=args.num_workers,
                  use_gpu=args.use_gpu, debug_steps=args.debug_steps)
    print(json.dumps({"metrics": outcome.metrics, "checkpoint": str(outcome.checkpoint)}, indent=2))
