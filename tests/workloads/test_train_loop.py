"""The single training loop: learns, detects divergence, checkpoints atomically, obeys SIGTERM."""

import math
import os
import signal

import pytest
import torch

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.config import from_dict
from phaselab.workloads.data import DataConfig, build_dataset
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer
from phaselab.workloads.train.api import run_training
from phaselab.workloads.train.checkpoint import CheckpointDir
from phaselab.workloads.train.config import TrainConfig
from phaselab.workloads.train.loop import TorchEngine, TrainingDiverged, train
from phaselab.workloads.train.optim import build_optimizer
from phaselab.workloads.train.signals import TrainingPreempted

TEXT = {"kind": "text", "block_size": 32, "text": {"tokenizer": "char"}}


def _spec(steps: int, **train) -> dict:
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=32, pe={"kind": "rope"})
    from phaselab.workloads.config import to_dict
    return {"model": to_dict(model), "data": TEXT,
            "train": {"steps": steps, "batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup": 3,
                      "eval_every": 0, "eval_batches": 2, "final_eval_batches": 2, "ckpt_every": 0,
                      "log_every": 1, **train}}


def _losses(tracker: RecordingTracker) -> list[float]:
    return [m["train/loss"] for _, m in tracker.metrics if "train/loss" in m]


def test_loss_decreases_on_tiny_shakespeare(tmp_path):
    tracker = RecordingTracker()
    out = run_training(_spec(40), out_dir=tmp_path, tracker=tracker)
    losses = _losses(tracker)
    assert len(losses) == 40
    assert losses[0] == pytest.approx(math.log(65), abs=0.4)      # chance level over 65 chars
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.6
    assert out.metrics["valid/loss"] < losses[0] - 0.5
    assert 0.0 < out.metrics["valid/acc"] <= 1.0
    assert out.checkpoint == tmp_path / "checkpoints" / "step_0000040" / "model.pt"
    assert {(r.name, r.split) for r in out.records} == {("loss", "valid"), ("acc", "valid")}
    assert tracker.last("train/grad_norm") > 0 and tracker.last("train/tokens_per_s") > 0
    assert tracker.params["train.lr"] == 3e-3


def _loop_parts(**train):
    cfg = from_dict(TrainConfig, {"steps": 3, "batch_size": 4, "lr": 1e-3, "warmup": 0,
                                  "eval_every": 0, "ckpt_every": 0, **train})
    torch.manual_seed(0)
    model = Transformer(preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=32))
    engine = TorchEngine(model, build_optimizer(model, cfg.optim), device=torch.device("cpu"),
                         precision="fp32", grad_clip=cfg.grad_clip, grad_accum=cfg.grad_accum)
    return cfg, model, engine, build_dataset(from_dict(DataConfig, TEXT))


def test_nan_loss_raises_training_diverged():
    cfg, model, engine, dataset = _loop_parts()
    with torch.no_grad():
        model.h[0].attn.c_q.weight.fill_(float("nan"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(TrainingDiverged, match="loss is nan") as info:
        train(engine, dataset, cfg, tracker=RecordingTracker(), start_step=0, save=lambda s, m: None)
    assert info.value.step == 0
    # the check runs once per step, in optimizer_step, still before the update
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, before[n], rtol=0, atol=0, equal_nan=True, msg=n)


def test_inf_gradient_raises_before_the_update():
    cfg, model, engine, dataset = _loop_parts(grad_accum=2)
    model.h[0].mlp.c_fc.weight.register_hook(lambda g: g * float("inf"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(TrainingDiverged, match="grad_norm is (inf|nan)") as info:
        train(engine, dataset, cfg, tracker=RecordingTracker(), start_step=0, save=lambda s, m: None)
    assert info.value.step == 0
    for n, p in model.named_parameters():  # the optimiser never stepped on the bad gradient
        assert torch.equal(p, before[n]), n


def test_checkpoint_dir_is_atomic(tmp_path):
    ckpts = CheckpointDir(tmp_path, keep=2)

    def writer(text):
        return lambda d: (d / "payload.txt").write_text(text)

    ckpts.save(1, writer("one"))
    ckpts.save(2, writer("two"))
    # A save that crashes half-way leaves neither a step folder nor a moved pointer.
    with pytest.raises(RuntimeError):
        ckpts.save(3, lambda d: ((d / "payload.txt").write_text("half"), (_ for _ in ()).throw(RuntimeError("boom"))))
    assert ckpts.steps() == [1, 2] and ckpts.latest().name == "step_0000002"
    # A temp folder left by a SIGKILLed writer is never read as a checkpoint.
    crashed = tmp_path / ".tmp-step_0000009-123-deadbeef"
    crashed.mkdir()
    (crashed / "payload.txt").write_text("partial")
    assert ckpts.latest().name == "step_0000002"
    # Killed between the folder rename and the pointer update: the complete folder wins.
    (tmp_path / "step_0000004").mkdir()
    (tmp_path / "step_0000004" / "payload.txt").write_text("four")
    assert (tmp_path / "latest").read_text().strip() == "step_0000002"
    assert ckpts.latest().name == "step_0000004"
    ckpts.save(5, writer("five"))  # prunes to keep=2 and removes crashed temp folders
    assert ckpts.steps() == [4, 5] and not crashed.exists()
    assert (ckpts.latest() / "payload.txt").read_text() == "five"


class _SigtermAt(RecordingTracker):
    """Sends this process a real SIGTERM when step `at` is logged (a preemption)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def log_metrics(self, metrics, *, step):
        super().log_metrics(metrics, step=step)
        if step == self.at and "train/loss" in metrics:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_a_checkpoint_then_resumes(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingPreempted) as info:
        run_training(_spec(6), out_dir=tmp_path, tracker=_SigtermAt(3))
    assert info.value.step == 3
    assert CheckpointDir(tmp_path / "checkpoints").steps() == [3]
    assert signal.getsignal(signal.SIGTERM) == previous  # handler restored
    tracker = RecordingTracker()
    out = run_training(_spec(6), out_dir=tmp_path, tracker=tracker)
    assert [s for s, m in tracker.metrics if "train/loss" in m][:3] == [4, 5, 6]
    assert out.metrics["step"] == 6


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-loop"])
def test_the_run_says_where_its_time_went(tmp_path, monkeypatch, graphs):
    """``time/*`` metrics: setup, timed steps, evaluation, checkpoints and the untimed rest add up
    to the run's wall time, and a slow checkpoint shows as checkpoint time, not training time."""
    import time

    from phaselab.workloads.train import checkpoint as ckpt_mod

    real_save = ckpt_mod.CheckpointDir.save

    def slow_save(self, *args, **kwargs):
        time.sleep(0.25)
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(ckpt_mod.CheckpointDir, "save", slow_save)
    t0 = time.perf_counter()
    spec = _spec(12, eval_every=4, ckpt_every=6, cuda_graphs=graphs, log_every=4)
    out = run_training(spec, out_dir=tmp_path, tracker=RecordingTracker())
    wall = time.perf_counter() - t0
    t = {k.removeprefix("time/").removesuffix("_s"): v for k, v in out.metrics.items() if k.startswith("time/")}
    assert set(t) == {"setup", "train", "eval", "ckpt", "other"} and all(v >= 0 for v in t.values())
    assert t["ckpt"] >= 2 * 0.25   # steps 6 and 12
    assert t["train"] > 0 and t["eval"] > 0
    assert sum(t.values()) <= wall
    assert sum(t.values()) - t["ckpt"] <= wall - 2 * 0.25   # the sleeps are counted once, as ckpt
