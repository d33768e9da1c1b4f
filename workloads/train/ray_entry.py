"""Ray Train V2 entry: ``fit()`` on the driver, ``train_loop_per_worker(cfg)`` on every rank.

DESIGN §5.3 / §7 example 12: the worker is a plain function that rebuilds the typed config from a
JSON-safe dict, owns its setup and reports through Ray; cluster shape stays in ``fit``'s
ScalingConfig. The run is named by the stage content hash (``run_name``), so re-running ``fit``
with the same ``(storage_path, run_name)`` resumes from the run's latest reported checkpoint —
Ray Train V2 has no ``resume_from_checkpoint`` (STACK.md).

Two engines, one loop (loop.py):
- ``train.zero_stage`` set: DeepSpeed ZeRO 0-3 (deepspeed_engine.py). Checkpoint contract
  (DESIGN §5.7): every rank ``engine.save_checkpoint(tmp, tag)``; barrier; every rank
  ``ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))`` — Ray merges the rank
  folders. Load: ``ray.train.get_checkpoint().as_directory()`` → ``engine.load_checkpoint``.
- ``zero_stage`` None: plain torch, DDP when world > 1; rank 0 writes model.pt/train_state.pt,
  every rank its RNG state.
Either way the merged checkpoint folder holds a consolidated ``model.pt`` (what evals and
fine-tunes load), ``spec.json`` and one ``rng_rank{r}.pt`` per rank.

Per-step metrics of rank 0 go to ``out_dir/metrics.jsonl`` (``out_dir`` must be on storage every
worker can reach; the orchestrator replays it into MLflow), the final MetricRecords to
``out_dir/records.json``, the best-validation weights to ``out_dir/best`` (rank 0;
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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import MetricRecord, NullTracker

CKPT_STATE = "train_state.pt"
log = logging.getLogger(__name__)


class MetricsFileError(ValueError):
    """A metrics.jsonl line before the last one is malformed: corruption, not a torn write
    (failure class ``data`` when it stops a writer)."""


class JsonlTracker(NullTracker):
    """Appends ``{"step": s, **metrics}`` lines to a file; the other Tracker calls are no-ops
    (params and records travel through fit's return value).

    Each record is one unbuffered ``write()`` of a complete line, so a killed writer can leave
    at most one torn *final* line. The first write of a tracker (a resumed run's new
    writer) cuts such a line away first, so the run appends to valid JSONL again.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repaired = False

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        line = json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n"
        if not self._repaired:   # lazily: only the rank that writes touches the file
            truncate_torn_tail(self.path)
            self._repaired = True
        data = line.encode("utf-8")
        # Unbuffered O_APPEND: the whole line goes to the kernel in one write(2) (nothing is
        # held back in a user-space buffer to be flushed later, or in pieces).
        with open(self.path, "ab", buffering=0) as f:
            done = f.write(data)
            while done < len(data):   # a short write (disk full, signal): finish the line
                done += f.write(data[done:])


def _scan(path: Path, data: bytes) -> tuple[list[dict[str, float]], tuple[int, int, str] | None]:
    """The records of a metrics file's bytes and its torn final line, if any, as
    ``(line number, byte offset, why)``. A final line is torn when it has no trailing newline or
    does not parse as a JSON object (a killed writer's); a bad line before it raises MetricsFileError
    naming ``path`` and the line number (that is corruption, not a torn write)."""
    lines = data.split(b"\n")   # after the last newline: b"" or a torn line
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    rows: list[dict[str, float]] = []
    offset = 0
    for i, raw in enumerate(lines[:last + 1]):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        if i == len(lines) - 1:
            return rows, (i + 1, start, f"no trailing newline ({len(raw)} bytes)")
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError as err:   # JSONDecodeError, UnicodeDecodeError
            row, why = None, str(err)
        else:
            why = None if isinstance(row, dict) else f"not a JSON object but {type(row).__name__}"
        if why is None:
            rows.append(row)
        elif i == last:
            return rows, (i + 1, start, f"does not parse: {why}")
        else:
            raise MetricsFileError(f"{path}:{i + 1}: malformed metrics line {raw[:80]!r}: {why}")
    return rows, None


def truncate_torn_tail(path: Path) -> bool:
    """Cut a torn final line (see :func:`read_metrics`) off ``path``, so what follows is appended
    to valid JSONL. Returns whether it cut. Corruption before the last line raises MetricsFileError."""
    path = Path(path)
    if not path.is_file():
        return False
    _, torn = _scan(path, path.read_bytes())
    if torn is None:
        return False
    number, offset, why = torn
    log.warning("%s:%d: cutting a torn final line (%s) at byte %d before appending", path, number, why, offset)
    with open(path, "rb+") as f:
        f.truncate(offset)
    return True


def read_metrics(path: Path) -> list[dict[str, float]]:
    """The complete lines a JsonlTracker wrote, in order.

    A final line without a trailing newline or that does not parse is what a killed writer
    leaves: it is skipped with a logged warning, never read as finished. A malformed line
    before the last one is corruption: MetricsFileError (a ValueError) naming the file and the line.
    """
    path = Path(path)
    if not path.exists():
        return []
    rows, torn = _scan(path, path.read_bytes())
    if torn is not None:
        log.warning("%s:%d: skipping a torn final line (%s)", path, torn[0], torn[2])
    return rows


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


def _build(cfg: Mapping[str, Any]):
    """Typed spec, dataset and model, identical on every rank (seeded before the init)."""
    from phaselab.workloads.data import build_dataset
    from phaselab.workloads.train.api import build_model, parse_spec
    from phaselab.workloads.train.checkpoint import seed_everything

    parsed = parse_spec(cfg["spec"])
    if cfg.get("debug_steps"):  # CI: the first N steps of the real schedule, then finish normally
        t = parsed.train
        parsed = dataclasses.replace(parsed, train=dataclasses.replace(
            t, steps=min(t.steps, int(cfg["debug_steps"])),
            decay_steps=t.decay_steps if t.decay_steps is not None else t.steps))
    seed_everything(parsed.train.seed)
    dataset = build_dataset(parsed.data)
    init_from = Path(cfg["init_from"]) if cfg.get("init_from") else None
    return parsed, dataset, build_model(parsed, dataset, init_from)


def train_loop_per_worker(cfg: dict) -> None:
    """Ray Train worker: ``cfg = {"spec", "out_dir", "init_from", "debug_steps", "stop_after"}``."""
    from phaselab.workloads.train.deepspeed_engine import configure_environment

    configure_environment()  # before anything imports deepspeed
    import ray.train
    import ray.train.torch
    import torch

    from phaselab.workloads.train.api import (
        chain,
        final_evaluation,
        minima_records,
        periodic_splits,
        track_splits,
    )
    from phaselab.workloads.train.checkpoint import load_train_state, rng_state, set_rng_state, write_json
    from phaselab.workloads.train.fast_step import engine_for
    from phaselab.workloads.train.loop import train
    from phaselab.workloads.train.optim import build_optimizer

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    share_gpu(device, cfg.get("gpu_fraction"))
    parsed, dataset, model = _build(cfg)
    tc = parsed.train
    resolved = _resolved(parsed, cfg["spec"])
    ckpt = ray.train.get_checkpoint()
    if tc.zero_stage is not None:
        from phaselab.workloads.train.deepspeed_engine import DeepSpeedEngine
        engine = DeepSpeedEngine(model, tc, world=world, device=device)
    else:
        model.to(device)
        optimizer = build_optimizer(model, tc.optim())
        engine = engine_for(model, optimizer, tc, device=device, block_size=dataset.block_size,
                            world=world, ddp=world > 1)
    out_dir = Path(cfg["out_dir"])
    tracker = JsonlTracker(out_dir / "metrics.jsonl")
    start, t0 = 0, time.perf_counter()
    if ckpt is not None:
        with ckpt.as_directory() as d:  # may download from storage_path: part of the restore
            d = Path(d)
            if tc.zero_stage is not None:
                start = int(engine.load(d)["step"])
            else:
                from phaselab.workloads.models.checkpoint_io import load_model
                model.load_state_dict(load_model(d / "model.pt").state_dict(), strict=True)
                state = load_train_state(d / CKPT_STATE)
                optimizer.load_state_dict(state["optimizer"])
                start = int(state["step"])
            set_rng_state(torch.load(d / f"rng_rank{rank}.pt", weights_only=True))
        if rank == 0:  # restore time (rank 0's; ZeRO shards load collectively)
            tracker.log_metrics({"ckpt/load_s": time.perf_counter() - t0}, step=start)

    def write(tmp: Path, step: int, metrics: Mapping[str, float]) -> None:
        from phaselab.workloads.models.checkpoint_io import save_model
        if tc.zero_stage is not None:
            engine.save(tmp, tag=f"step_{step:07d}", client_state={"step": step})
            with engine.full_weights() as module:
                if rank == 0:
                    save_model(module, tmp / "model.pt")
        elif rank == 0:
            save_model(model, tmp / "model.pt")
            torch.save({"step": step, "data_index": step * tc.grad_accum * world,
                        "optimizer": optimizer.state_dict(), "metrics": dict(metrics)}, tmp / CKPT_STATE)
        if rank == 0:
            write_json(tmp / "spec.json", resolved)
        torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")

    result = train(engine, dataset, tc, tracker=tracker, start_step=start, rank=rank, world=world,
                   save=lambda step, m: _report(step, m, lambda tmp: write(tmp, step, m)),
                   stop_after=cfg.get("stop_after"), reduce=_allreduce_mean,
                   on_eval=chain(_keep_best(out_dir, tc, engine, rank),
                                 track_splits(out_dir, tc, periodic_splits(cfg["spec"]), engine=engine,
                                              dataset=dataset, tracker=tracker, rank=rank,
                                              batch_size=tc.eval_batch_size or tc.micro_batch(world),
                                              reduce=_allreduce_mean)))
    if result.stopped == "stop_after":
        return
    # Every rank evaluates the same batches: under ZeRO-3 each forward gathers collectively.
    metrics, records = final_evaluation(engine.module, dataset, tc, step=result.step,
                                        device=engine.device, autocast=engine.autocast)
    final = {"step": float(result.step), **result.metrics, **metrics}
    records += minima_records(out_dir, dataset)
    if rank == 0:
        (out_dir / "records.json").write_text(json.dumps([r.to_dict() for r in records], indent=1))
        (out_dir / "metrics.json").write_text(json.dumps(final, indent=2, sort_keys=True) + "\n")
    ray.train.report(final)


def _keep_best(out_dir: Path, tc, engine, rank: int):
    """The loop's ``on_eval`` keeping the best-validation weights under ``out_dir/best``
    (``eval.select: best_valid``; api.keep_best is the single-process twin). Every rank decides
    on the rank-averaged metrics, so all agree on entering ``full_weights`` (a collective
    gather under ZeRO-3); rank 0 writes. None when ``eval_every`` is 0."""
    if not tc.eval_every:
        return None
    import contextlib

    from phaselab.workloads.models.checkpoint_io import save_model
    from phaselab.workloads.train.checkpoint import BEST, BestKeeper

    keeper = BestKeeper(out_dir / BEST)

    def on_eval(step: int, metrics: Mapping[str, float]) -> None:
        better = keeper.update({k: _allreduce_mean(float(v)) for k, v in metrics.items()})
        if not better:
            return
        full = engine.full_weights() if tc.zero_stage is not None else contextlib.nullcontext(engine.module)
        with full as module:
            if rank == 0:
                for metric in better:
                    keeper.save(step, metric, keeper.values[metric], lambda d: save_model(module, d / "model.pt"))

    return on_eval


def _resolved(parsed, spec: Mapping[str, Any]) -> dict[str, Any]:
    from phaselab.workloads.config import to_dict
    from phaselab.workloads.train.api import with_eval_splits
    return with_eval_splits(to_dict(parsed), spec)


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
        resources_per_worker: Mapping[str, Any] | None = None):
    """Run one training stage on Ray Train V2 and return a ``TrainOutcome``.

    Args:
        spec: the training spec of ``api.run_training`` (validated here, on the driver).
        out_dir: shared folder for ``metrics.jsonl``, ``metrics.json`` and ``records.json``.
        run_name: the stage content hash; the same name under the same ``storage_path`` resumes.
        storage_path: Ray Train's run root (checkpoints live in ``storage_path/run_name``).
        num_workers, use_gpu: data-parallel ranks and whether each gets a GPU.
        resources_per_worker: what each rank reserves, e.g. ``{"CPU": 2, "GPU": 1}`` (see
            :func:`scaling_config`; bad keys or values raise ValueError before Ray starts).
        init_from: pretrained ``model.pt`` or checkpoint folder (CPT / fine-tunes).
        debug_steps: run only the first N steps of the schedule (CI smoke of the real entry).
        max_failures: Ray FailureConfig retries for real errors (DESIGN §5.3).
        stop_after: tests only — every rank stops after N steps without checkpointing (a kill).
    Raises:
        TrainingDiverged / any worker error (re-raised from the Ray result).
    """
    import ray.train
    from ray.train.torch import TorchTrainer

    from phaselab.workloads.train.api import TrainOutcome, best_folder, parse_spec

    parse_spec(spec)  # fail fast on the driver with the dotted path of a bad key
    scaling = scaling_config(num_workers=num_workers, use_gpu=use_gpu,
                             resources_per_worker=resources_per_worker)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {"spec": json.loads(json.dumps(dict(spec))), "out_dir": str(out_dir),
              "init_from": str(Path(init_from).resolve()) if init_from else None,
              "debug_steps": debug_steps, "stop_after": stop_after,
              "gpu_fraction": float((resources_per_worker or {}).get("GPU", 0) or 0)}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=config,
        scaling_config=scaling,
        run_config=ray.train.RunConfig(
            name=run_name, storage_path=str(Path(storage_path).resolve()),
            failure_config=ray.train.FailureConfig(max_failures=max_failures)))
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    if result.checkpoint is None:
        raise RuntimeError(f"Ray Train run {run_name!r} finished without a checkpoint")
    records_path = out_dir / "records.json"
    records = ([MetricRecord(**r) for r in json.loads(records_path.read_text())]
               if records_path.exists() and stop_after is None else [])
    # Ray attaches to result.metrics the metrics of the last *checkpointed* report; the final
    # evaluation (reported after it) is read from what rank 0 wrote.
    metrics_path = out_dir / "metrics.json"
    source = (json.loads(metrics_path.read_text()) if metrics_path.exists() and stop_after is None
              else result.metrics or {})
    metrics = {k: float(v) for k, v in source.items() if isinstance(v, (int, float))}
    return TrainOutcome(metrics=metrics, checkpoint=Path(result.checkpoint.path) / "model.pt",
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
