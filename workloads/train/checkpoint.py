"""Atomic, resumable checkpoints of one-process runs (``api.run_training``), and the RNG, best-weights
and eval-minima helpers every training path shares (``session.TrainSession`` writes the files).

Layout under a run's ``checkpoints/`` folder::

    step_0000400/            one complete checkpoint (never half-written, see below)
        model.pt             weights + model config (models.checkpoint_io.save_model), what evals load
        train_state.pt       optimiser, step, data position, metrics (torch.save)
        rng_rank0.pt         the RNG states of rank 0 (one file per rank)
        spec.json            the resolved stage spec (model/data/train/extend)
    step_0000800/
    latest                   text file: "step_0000800"
    .tmp-step_0001200-...    a save in progress or one that crashed: ignored, removed later

Why this is crash-safe: a checkpoint is written into a temporary folder, every file and the folder
are fsync'ed, and only then is the folder renamed to ``step_XXXXXXX`` with ``os.replace`` (atomic on
POSIX). ``latest`` is updated afterwards by writing ``latest.tmp`` and renaming it over ``latest``.
A kill at any point leaves either the previous state or the new one: a temp folder is never read
(its name does not match ``step_\\d{7}``), and if the kill falls between the folder rename and the
pointer update, :meth:`CheckpointDir.latest` still finds the newest complete ``step_`` folder.

Beside ``checkpoints/``, a run with periodic validation keeps its best-validation weights in
``best/`` (:class:`BestKeeper`, at the end of this module).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from phaselab.catalog.tracking.run_folder import BEST_FILE, LATEST, MODEL_FILE
from phaselab.workloads.paths import confine
from phaselab.workloads.train.config import BEST_CRITERIA

_STEP_RE = re.compile(r"^step_(\d{7})$")


def step_name(step: int) -> str:
    if step < 0 or step > 9_999_999:
        raise ValueError(f"checkpoint step must be in [0, 9999999], got {step!r}")
    return f"step_{step:07d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a fsync'ed temp file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class CheckpointDir:
    """A folder of atomic ``step_XXXXXXX`` checkpoints with a ``latest`` pointer.

    Args:
        root: the folder (created if missing).
        keep: how many complete checkpoints to keep (>= 1); older ones are deleted after a
            successful save, never the one ``latest`` names.
        within: the run folder ``root`` must stay inside after symlinks are resolved (default
            ``root``'s parent): a save through a symlink leading elsewhere is refused
            (``paths.PathRefused``), so a run folder never writes outside itself.
    """

    def __init__(self, root: Path, *, keep: int = 2, within: Path | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep!r}")
        self.root = Path(root)
        self.keep = keep
        self.within = Path(within) if within is not None else self.root.parent

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending."""
        if not self.root.is_dir():
            return []
        found = (_STEP_RE.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> Path | None:
        """The newest complete checkpoint folder, or None. Temp folders are never returned."""
        pointer = self.root / LATEST
        if pointer.is_file():
            with open(pointer, "rb") as f:   # a step name is 12 bytes; never read a huge file whole
                name = f.read(64).decode("utf-8", "replace").strip()
            if _STEP_RE.match(name) and (self.root / name).is_dir():
                newest = self.steps()[-1]
                # A kill between the folder rename and the pointer update leaves the pointer one
                # checkpoint behind; the renamed folder is complete, so prefer the newest.
                return self.root / step_name(max(newest, int(name[5:])))
        steps = self.steps()
        return self.root / step_name(steps[-1]) if steps else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Write a checkpoint for ``step``: ``write(tmp_dir)`` fills a temp folder, which is then
        fsync'ed and atomically renamed. Returns the final folder."""
        confine(self.root, self.within, what="checkpoint folder")
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / step_name(step)
        tmp = self.root / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            write(tmp)
            _fsync_tree(tmp)
            if final.exists():  # re-saving a step (e.g. a preempted save is repeated)
                trash = self.root / f".tmp-old-{final.name}-{uuid.uuid4().hex[:8]}"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_write_text(self.root / LATEST, final.name + "\n")
        self._prune(keep_name=final.name)
        return final

    def _prune(self, *, keep_name: str) -> None:
        for step in self.steps()[:-self.keep]:
            if step_name(step) != keep_name:
                shutil.rmtree(self.root / step_name(step), ignore_errors=True)
        for p in self.root.iterdir():  # leftovers of crashed saves (single writer per run)
            if p.name.startswith(".tmp-") and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# RNG states: stored as plain tensors / ints so torch.load(weights_only=True) can read them.

def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (CPU) and CUDA RNG states of this process."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_kind, torch.from_numpy(np_keys.astype(np.int64)), int(np_pos),
                  int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def load_train_state(path: Path, *, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a ``train_state.pt`` written by the loop (tensors and plain containers only);
    ``UnreadableCheckpoint`` naming the file when it is damaged."""
    from phaselab.workloads.models.checkpoint_io import UnreadableCheckpoint

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as err:
        raise UnreadableCheckpoint(f"training state {str(path)!r} is not readable ({type(err).__name__}: "
                                   f"{' '.join(str(err).split())[:200]}); it may be truncated") from None


# ---------------------------------------------------------------------------------------------
# Best-validation weights, for ``eval.select: best_valid`` (EXPERIMENTS §2.2 "Reporting": test
# NLL at the checkpoint with the best validation NLL). Layout under a stage's folder::
#
#     best/valid_loss.min/step_0001200/{model.pt, best.json}   lowest valid/loss so far
#     best/valid_acc.max/step_0000900/{model.pt, best.json}    highest valid/acc so far
#
# Each criterion is a CheckpointDir with keep=1: the same atomic save, so a kill leaves the
# previous best or the new one. Only improvements are saved, so the newest complete folder is
# always the best one even when a kill interrupts the pruning of the older one. The criteria
# (BEST_CRITERIA) live in config.py, which evaluations read without torch.


def criterion_name(metric: str, mode: str) -> str:
    """``("valid/loss", "min")`` -> ``"valid_loss.min"`` (the criterion's folder name)."""
    return f"{metric.replace('/', '_')}.{mode}"


def read_best(root: Path, metric: str, mode: str) -> dict[str, Any] | None:
    """``best.json`` of the kept best checkpoint of (metric, mode) under ``root`` (a stage's
    ``best/`` folder) with ``"model"`` = its model.pt path, or None when none was kept."""
    latest = CheckpointDir(Path(root) / criterion_name(metric, mode), keep=1).latest()
    if latest is None or not (latest / BEST_FILE).is_file():
        return None
    info = json.loads((latest / BEST_FILE).read_text())
    return {**info, "model": str(latest / MODEL_FILE)}


class BestKeeper:
    """Keeps the best weights of each criterion (``BEST_CRITERIA``) under ``root``.

    Every rank holds one and calls :meth:`update` with the same (rank-averaged) metrics, so
    all ranks agree on whether weights must be gathered; only the writer calls :meth:`save`.
    A resumed run starts from the values in the kept ``best.json`` files. A best kept after
    the checkpoint a run resumes from stays: the replayed steps reproduce it bit for bit on
    CPU, and on GPU it is a checkpoint of the same run and data order.
    """

    def __init__(self, root: Path, criteria: Mapping[str, str] = BEST_CRITERIA) -> None:
        self.root = Path(root)
        self.criteria = dict(criteria)
        self.values: dict[str, float] = {}
        for metric, mode in self.criteria.items():
            info = read_best(self.root, metric, mode)
            if info is not None:
                self.values[metric] = float(info["value"])

    def update(self, metrics: Mapping[str, float]) -> list[str]:
        """The criteria that ``metrics`` improve (strictly; NaN never does); remembers them."""
        better = []
        for metric, mode in self.criteria.items():
            value = metrics.get(metric)
            if value is None or not np.isfinite(value):
                continue
            old = self.values.get(metric)
            if old is None or (value < old if mode == "min" else value > old):
                self.values[metric] = float(value)
                better.append(metric)
        return better

    def save(self, step: int, metric: str, value: float, write_model: Callable[[Path], Any]) -> Path:
        """Atomically keep ``write_model(folder)``'s model.pt as the best of ``metric`` at ``step``."""
        mode = self.criteria[metric]

        def write(tmp: Path) -> None:
            write_model(tmp)
            write_json(tmp / BEST_FILE, {"step": step, "metric": metric, "value": float(value), "mode": mode})

        return CheckpointDir(self.root / criterion_name(metric, mode), keep=1,
                             within=self.root.parent).save(step, write)


class EvalMinima:
    """The lowest value of each tracked metric over a run's periodic evaluations and its step
    (EXPERIMENTS §2.2: the minimum test NLL over evaluations, labelled as such), in a small
    JSON file rewritten atomically, so a resumed run continues from the minima so far."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.minima: dict[str, dict[str, float]] = (json.loads(self.path.read_text())
                                                    if self.path.is_file() else {})

    def update(self, step: int, metrics: Mapping[str, float], *, write: bool) -> None:
        changed = False
        for name, value in metrics.items():
            old = self.minima.get(name)
            if np.isfinite(value) and (old is None or value < old["value"]):
                self.minima[name] = {"step": step, "value": float(value)}
                changed = True
        if changed and write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(self.minima, indent=2, sort_keys=True) + "\n")
