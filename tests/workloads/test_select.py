"""``eval.select: best_valid`` (EXPERIMENTS §2.2 "Reporting"): training keeps the weights of the
best periodic validation, a resumed run keeps the best so far, and ``run_eval`` evaluates those
weights and records the selected step.

The tiny run ramps its learning rate up to 1.0 over the whole run (warm-up = steps), so the
validation loss improves early and gets worse at the end: its best step is well before the
last, and an evaluation of the final checkpoint gives a clearly larger loss.
"""

import pytest

from phaselab.catalog.tracking import NullTracker, RecordingTracker
from phaselab.workloads.config import ConfigError, to_dict
from phaselab.workloads.evals.api import NoBestCheckpoint, SelectConfig, parse_select, run_eval
from phaselab.workloads.models.presets import preset
from phaselab.workloads.train.api import run_training
from phaselab.workloads.train.checkpoint import BestKeeper, read_best

STEPS = 32


def _spec(*, eval_every: int = 4, steps: int = STEPS) -> dict:
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=32, pe={"kind": "rope"})
    return {"model": to_dict(model), "data": {"kind": "text", "block_size": 32},
            "train": {"steps": steps, "batch_size": 8, "lr": 1.0, "min_lr": 0.1, "warmup": steps,
                      "decay_steps": steps, "eval_every": eval_every, "eval_batches": 2,
                      "eval_batch_size": 16, "final_eval_batches": 2, "ckpt_every": 8,
                      "log_every": 4, "device": "cpu"}}


def _valid(tracker: RecordingTracker, name: str = "valid/loss") -> dict[int, float]:
    out: dict[int, float] = {}
    for step, metrics in tracker.metrics:
        if name in metrics:
            out.setdefault(step, metrics[name])   # the loop's line comes before the final eval's
    return out


# the eval of the valid split on the same batches as the loop's periodic validation
EVAL = {"suite": "task", "data": {"kind": "text", "block_size": 32}, "split": "valid",
        "metric": "nll", "batch_size": 16, "max_batches": 2, "device": "cpu"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("run")
    tracker = RecordingTracker()
    outcome = run_training(_spec(), out_dir=out_dir, tracker=tracker)
    return outcome, _valid(tracker), _valid(tracker, "valid/acc")


def test_the_tiny_run_gets_worse_at_the_end(run):
    _, valid, _ = run
    best = min(valid, key=valid.get)
    assert sorted(valid) == list(range(4, STEPS + 1, 4))
    assert best < STEPS and valid[STEPS] > valid[best] + 0.1   # otherwise the tests below prove nothing


def test_best_valid_evaluates_the_best_steps_weights(run, tmp_path):
    outcome, valid, _ = run
    best = min(valid, key=valid.get)
    records = run_eval({**EVAL, "select": "best_valid"}, checkpoint=outcome.checkpoint,
                       out_dir=tmp_path / "best", tracker=NullTracker(), best=outcome.best)
    nll, step, why = records
    assert nll.name == "nll" and nll.step is None and nll.split == "valid"
    assert nll.value == pytest.approx(valid[best], rel=1e-5)            # by value
    assert (step.name, step.value, step.step, step.unit) == ("select/step", float(best), best, "step")
    assert (why.name, why.step, why.split) == ("select/best_valid/valid/loss", best, "valid")
    assert why.value == pytest.approx(valid[best], rel=1e-12)
    last = run_eval(EVAL, checkpoint=outcome.checkpoint, out_dir=tmp_path / "last", tracker=NullTracker(),
                    best=outcome.best)
    assert [r.name for r in last] == ["nll"]                            # last: records as before
    assert last[0].value == pytest.approx(valid[STEPS], rel=1e-5)
    assert nll.value < last[0].value - 0.1


def test_best_valid_on_accuracy_takes_the_first_maximum(run, tmp_path):
    outcome, _, acc = run
    best = max(acc, key=acc.get)   # max() returns the first of equal values; the keeper needs "better"
    records = run_eval({**EVAL, "select": {"rule": "best_valid", "metric": "valid/acc", "mode": "max"}},
                       checkpoint=outcome.checkpoint, out_dir=tmp_path, tracker=NullTracker(),
                       best=outcome.best)
    assert records[1].value == best and records[2].name == "select/best_valid/valid/acc"
    assert records[2].value == pytest.approx(acc[best], rel=1e-12) and records[2].unit == "fraction"


def test_best_folder_layout_and_final_checkpoint_is_last(run):
    outcome, valid, _ = run
    best = min(valid, key=valid.get)
    info = read_best(outcome.best, "valid/loss", "min")
    assert {k: info[k] for k in ("step", "metric", "mode")} == {"step": best, "metric": "valid/loss", "mode": "min"}
    assert info["model"] == str(outcome.best / "valid_loss.min" / f"step_{best:07d}" / "model.pt")
    assert [p.name for p in (outcome.best / "valid_loss.min").glob("step_*")] == [f"step_{best:07d}"]
    assert outcome.checkpoint.parent.name == f"step_{STEPS:07d}"       # what `last` evaluates


def test_resume_keeps_the_best_so_far(run, tmp_path):
    outcome, valid, _ = run
    best = min(valid, key=valid.get)
    assert best < 16   # the kill below falls after the best and resumes from step 16
    first = run_training(_spec(), out_dir=tmp_path, tracker=NullTracker(), stop_after=18)
    assert first.records == [] and read_best(tmp_path / "best", "valid/loss", "min")["step"] == best
    # a keeper that forgot the best so far would take step 20 (worse) as the best at resume
    resumed = run_training(_spec(), out_dir=tmp_path, tracker=RecordingTracker())
    info = read_best(resumed.best, "valid/loss", "min")
    assert info["step"] == best and info["value"] == valid[best]        # bitwise on CPU
    assert info == {**read_best(outcome.best, "valid/loss", "min"), "model": info["model"]}


def test_no_periodic_validation_keeps_no_best_and_best_valid_says_so(tmp_path):
    outcome = run_training(_spec(eval_every=0, steps=4), out_dir=tmp_path / "run", tracker=NullTracker())
    assert outcome.best is None and not (tmp_path / "run" / "best").exists()
    with pytest.raises(NoBestCheckpoint, match=r"train.eval_every > 0"):
        run_eval({**EVAL, "select": "best_valid"}, checkpoint=outcome.checkpoint, out_dir=tmp_path / "e",
                 tracker=NullTracker(), best=outcome.best)
    records = run_eval(EVAL, checkpoint=outcome.checkpoint, out_dir=tmp_path / "l", tracker=NullTracker())
    assert [r.name for r in records] == ["nll"]


def test_keeper_only_saves_strict_finite_improvements(tmp_path):
    keeper = BestKeeper(tmp_path)
    assert keeper.update({"valid/loss": 2.0, "valid/acc": 0.1}) == ["valid/loss", "valid/acc"]
    assert keeper.update({"valid/loss": 2.0, "valid/acc": 0.2}) == ["valid/acc"]     # tie: not better
    assert keeper.update({"valid/loss": float("nan"), "valid/acc": 0.0}) == []
    assert keeper.update({"valid/loss": 1.5}) == ["valid/loss"]
    assert keeper.values == {"valid/loss": 1.5, "valid/acc": 0.2}
    keeper.save(7, "valid/loss", 1.5, lambda d: (d / "model.pt").write_text("w"))
    assert BestKeeper(tmp_path).values == {"valid/loss": 1.5}                       # what a resume reads


@pytest.mark.parametrize("raw, message", [
    ("best", "select: unknown selection rule 'best'; expected one of last, best_valid"),
    ({"rul": "best_valid"}, "select.rul: unknown key for SelectConfig; did you mean 'rule'?"),
    ({"rule": "newest"}, "select.rule:"),
    ({"rule": "best_valid", "metric": "valid/ppl"}, "training keeps best weights for valid/loss, valid/acc only"),
    ({"rule": "best_valid", "metric": "valid/loss", "mode": "max"}, "training keeps valid/loss at its min only"),
    ({"rule": "last", "metric": "valid/loss"}, "metric and mode apply to rule 'best_valid' only"),
    ({"rule": "best_valid", "mode": "mid"}, "select.mode:"),
])
def test_select_config_errors_name_the_key(raw, message):
    with pytest.raises(ConfigError) as info:
        parse_select(raw)
    assert message in str(info.value)


def test_select_forms_resolve_to_one_config():
    full = SelectConfig(rule="best_valid", metric="valid/loss", mode="min")
    assert parse_select("best_valid") == parse_select({"rule": "best_valid"}) == full
    assert parse_select({"rule": "best_valid", "metric": "valid/acc"}).mode == "max"
    assert parse_select(None) == parse_select("last") == SelectConfig()
    assert to_dict(full) == {"rule": "best_valid", "metric": "valid/loss", "mode": "min"}
    with pytest.raises(ConfigError, match="eval.select.rule"):
        parse_select({"rule": 3}, path="eval.select")


# -- train.eval_splits: the test split at every periodic validation, its minimum kept ----------
def _ii_spec(**train) -> dict:
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=48, pe={"kind": "rope"})
    return {"model": to_dict(model), "data": {"kind": "indirect_indexing", "ii": {"n_valid": 64, "n_test": 64}},
            "train": {"steps": 16, "batch_size": 8, "lr": 1.0, "min_lr": 0.1, "warmup": 16, "eval_every": 4,
                      "eval_batches": 2, "eval_batch_size": 16, "final_eval_batches": 2, "ckpt_every": 8,
                      "log_every": 4, "device": "cpu", "eval_splits": ["valid", "test"], **train}}


def test_eval_splits_log_test_at_each_validation_and_keep_its_minimum(tmp_path):
    from phaselab.workloads.config import from_dict
    from phaselab.workloads.data import DataConfig, build_dataset
    from phaselab.workloads.evals import tasks_metrics
    from phaselab.workloads.models.checkpoint_io import load_model

    tracker = RecordingTracker()
    out = run_training(_ii_spec(), out_dir=tmp_path / "a", tracker=tracker)
    test = _valid(tracker, "test/loss")
    assert sorted(test) == [4, 8, 12, 16]
    [low] = [r for r in out.records if r.name == "loss_min_over_evals"]
    step = min(test, key=test.get)
    assert (low.split, low.step, low.unit, low.task) == ("test", step, "nats/token", "indirect_indexing")
    assert low.value == test[step]
    # the final test value is the final checkpoint's (same batches): the hook evaluated real weights
    final = tasks_metrics.split_nll(load_model(out.checkpoint), build_dataset(from_dict(DataConfig, _ii_spec()["data"])), "test",
                                    batch_size=16, max_batches=2, precision="fp32")
    assert final.value == pytest.approx(test[16], rel=1e-5)
    # a kill just after the minimum's step (checkpointed there) and a resume keep it: the
    # resumed run evaluates only the later steps, whose test losses are all higher
    assert step < 16
    run_training(_ii_spec(ckpt_every=4), out_dir=tmp_path / "b", tracker=NullTracker(), stop_after=step + 1)
    again = run_training(_ii_spec(ckpt_every=4), out_dir=tmp_path / "b", tracker=NullTracker())
    assert [r for r in again.records if r.name == "loss_min_over_evals"] == [low]


def test_eval_splits_default_adds_nothing(tmp_path):
    spec = _ii_spec(eval_splits=["valid"], steps=4)
    tracker = RecordingTracker()
    out = run_training(spec, out_dir=tmp_path, tracker=tracker)
    assert _valid(tracker, "test/loss") == {4: pytest.approx(out.metrics["test/loss"])}   # final eval only
    assert not [r for r in out.records if r.name == "loss_min_over_evals"]
    assert "eval_splits" not in tracker.params and "train.eval_splits" not in tracker.params


@pytest.mark.parametrize("splits, message", [
    (["test"], "train.eval_splits: must name 'valid'"),
    (["valid", "valid"], "train.eval_splits: must name 'valid'"),
    ("test", "train.eval_splits: expected a list of split names"),
])
def test_eval_splits_errors(tmp_path, splits, message):
    with pytest.raises(ConfigError, match=message):
        run_training(_ii_spec(eval_splits=splits), out_dir=tmp_path, tracker=NullTracker())


def test_eval_splits_naming_a_missing_split_fails_before_training(tmp_path):
    spec = _spec(steps=4)
    spec["train"]["eval_splits"] = ["valid", "test"]   # Tiny Shakespeare has train / valid only
    with pytest.raises(ConfigError, match="train.eval_splits: dataset 'text:tinyshakespeare:char' has no split 'test'"):
        run_training(spec, out_dir=tmp_path, tracker=NullTracker())
    assert not (tmp_path / "checkpoints").exists()
