"""One process and two Ray Train workers (DDP over gloo, CPU) read the same global batch of
examples at every optimiser step: the batch indices split over ranks (loop.batch_index) cover
exactly the examples the one process reads.

Both runs go through the real entries (``api.run_training``, ``ray_entry.fit``) with
``trace_batches``: every rank records each training batch it reads, one digest per example row.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import local_ray
import pytest

from phaselab.catalog.tracking import NullTracker
from phaselab.workloads.config import to_dict
from phaselab.workloads.models.presets import preset
from phaselab.workloads.train.session import read_trace

pytestmark = pytest.mark.ray

STEPS, BATCH, ACCUM = 3, 8, 2


def _spec() -> dict:
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=48)
    return {"model": to_dict(model),
            "data": {"kind": "indirect_indexing", "ii": {"n_valid": 16, "n_test": 16}},
            "train": {"steps": STEPS, "batch_size": BATCH, "grad_accum": ACCUM, "lr": 3e-3, "warmup": 1,
                      "eval_every": 0, "eval_batches": 1, "final_eval_batches": 1, "ckpt_every": 0,
                      "log_every": 1, "device": "cpu"}}


def _examples_per_step(folder: Path, ranks: int) -> dict[int, Counter]:
    """step -> multiset of example digests read by all ranks; a rank's j-th batch belongs to step
    j // grad_accum (the loop reads grad_accum batches per step, in order)."""
    steps: dict[int, Counter] = {}
    for rank in range(ranks):
        for j, record in enumerate(read_trace(folder, rank)):
            steps.setdefault(j // ACCUM, Counter()).update(record["rows"])
    return steps


def test_one_process_and_two_workers_read_the_same_global_batches(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from phaselab.workloads.train.api import run_training
    from phaselab.workloads.train.ray_entry import fit

    run_training(_spec(), out_dir=tmp_path / "one", tracker=NullTracker(), trace_batches=tmp_path / "trace1")
    local_ray.shared()
    fit(_spec(), out_dir=tmp_path / "two", run_name="two", storage_path=tmp_path / "ray", num_workers=2,
        trace_batches=tmp_path / "trace2")

    one, two = _examples_per_step(tmp_path / "trace1", 1), _examples_per_step(tmp_path / "trace2", 2)
    assert sorted(one) == sorted(two) == list(range(STEPS))
    assert [sum(c.values()) for c in one.values()] == [BATCH] * STEPS
    assert [len(read_trace(tmp_path / "trace2", r)) for r in (0, 1)] == [STEPS * ACCUM] * 2
    assert all(one[s] == two[s] for s in range(STEPS))
    assert len({frozenset(c) for c in one.values()}) == STEPS   # each step reads other examples
