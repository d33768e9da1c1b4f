"""Best-validation weights on the Ray Train path (``ray_entry``): a 2-worker ZeRO-3 run, where
saving the full weights is a collective gather every rank must enter, keeps the weights of its
lowest validation loss in ``out_dir/best``, and those weights reproduce that loss; with
``train.eval_splits`` every rank also evaluates the test split at each validation, and the run
records the lowest test loss.

One ``fit`` (~30-45 s of Ray/DeepSpeed start-up on 2 cores) plus the DeepSpeed JIT warm-up.
"""

from pathlib import Path

import pytest

from phaselab.catalog.tracking import NullTracker
from phaselab.workloads.config import to_dict
from phaselab.workloads.models.presets import preset

pytestmark = pytest.mark.ray


def test_zero3_two_workers_keep_the_best_validation_weights(ray_cluster, tmp_path: Path) -> None:
    from phaselab.catalog.tracking.run_folder import read_steps, steps_path
    from phaselab.workloads.evals.api import run_eval
    from phaselab.workloads.train.checkpoint import read_best
    from phaselab.workloads.train.ray_entry import fit

    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=48, pe={"kind": "rope"})
    data = {"kind": "indirect_indexing", "ii": {"n_valid": 32, "n_test": 32}}
    spec = {"model": to_dict(model), "data": data,
            "train": {"steps": 8, "batch_size": 8, "lr": 0.3, "min_lr": 0.03, "warmup": 8, "eval_every": 2,
                      "eval_batches": 1, "final_eval_batches": 1, "ckpt_every": 4, "log_every": 2,
                      "zero_stage": 3, "eval_splits": ["valid", "test"]}}
    out = fit(spec, out_dir=tmp_path / "out", run_name="best", storage_path=tmp_path / "ray", num_workers=2)
    valid: dict[int, float] = {}
    test: dict[int, float] = {}
    for row in read_steps(steps_path(tmp_path / "out")):
        for name, seen in (("valid/loss", valid), ("test/loss", test)):
            if name in row:
                seen.setdefault(int(row["step"]), row[name])
    assert sorted(valid) == [2, 4, 6, 8] and sorted(test) == [2, 4, 6, 8]
    [low] = [r for r in out.records if r.name == "loss_min_over_evals"]
    assert (low.split, low.step) == ("test", min(test, key=test.get))
    assert low.value == pytest.approx(min(test.values()), rel=1e-9)
    best = min(valid, key=valid.get)
    assert out.best == tmp_path / "out" / "best"
    info = read_best(out.best, "valid/loss", "min")
    assert info["step"] == best and info["value"] == pytest.approx(valid[best], rel=1e-9)
    # the kept model.pt holds the gathered full weights of that step: it reproduces the loss
    eval_spec = {"suite": "task", "data": data, "split": "valid", "metric": "nll", "batch_size": 4,
                 "max_batches": 1, "device": "cpu", "select": "best_valid"}
    records = run_eval(eval_spec, checkpoint=out.checkpoint, out_dir=tmp_path / "eval",
                       tracker=NullTracker(), best=out.best)
    assert records[0].value == pytest.approx(valid[best], rel=1e-5) and records[1].value == best
