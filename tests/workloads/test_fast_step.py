"""The graph step (``train.cuda_graphs``) computes what the plain step computes.

On CPU nothing is captured (CUDA graphs need a GPU): the same step function runs eagerly with
the device-side learning rate, the batch windows, the background batch thread and the deferred
NaN/Inf check, so these tests check the graph path's arithmetic and bookkeeping against the
plain ``TorchEngine`` loop. The capture itself is tested on the H200 (``gpu`` tests below).
"""

import math

import pytest
import torch

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.config import to_dict
from phaselab.workloads.models.presets import preset
from phaselab.workloads.train.api import run_training
from phaselab.workloads.train.checkpoint import CheckpointDir
from phaselab.workloads.train.config import TrainConfig
from phaselab.workloads.train.fast_step import GraphEngine, check_graphable, choose_batch_workers
from phaselab.workloads.train.loop import LoopResult, StepEvents, TrainingDiverged


def _spec(steps: int, *, graphs: bool, pe: str = "pope", accum: int = 2, lr: float = 3e-3,
          device: str = "cpu", workers: int = -1) -> dict:
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=48, dropout=0.1,
                   pe={"kind": pe})
    return {"model": to_dict(model),
            "data": {"kind": "indirect_indexing", "ii": {"n_valid": 64, "n_test": 64},
                     "num_workers": workers},
            "train": {"steps": steps, "batch_size": 8, "grad_accum": accum, "lr": lr, "min_lr": lr / 10,
                      "warmup": 2, "eval_every": 5, "eval_batches": 1, "final_eval_batches": 1,
                      "ckpt_every": 4, "log_every": 3, "cuda_graphs": graphs, "device": device}}


def _curves(tracker: RecordingTracker, name: str) -> dict[int, float]:
    return {s: m[name] for s, m in tracker.metrics if name in m}


@pytest.mark.parametrize("pe", ["rope", "pope"])
def test_graph_step_arithmetic_equals_plain_step(tmp_path, pe):
    plain, fast = RecordingTracker(), RecordingTracker()
    a = run_training(_spec(11, graphs=False, pe=pe), out_dir=tmp_path / "plain", tracker=plain)
    b = run_training(_spec(11, graphs=True, pe=pe), out_dir=tmp_path / "fast", tracker=fast)
    for name in ("train/loss", "train/grad_norm", "train/lr", "valid/loss"):
        ref, got = _curves(plain, name), _curves(fast, name)
        assert sorted(got) == sorted(ref) and ref, name
        for step in ref:   # fp32 rounding: the lr is a float32 tensor instead of a Python float
            assert got[step] == pytest.approx(ref[step], rel=2e-5, abs=1e-7), (name, step)
    assert sorted(_curves(fast, "train/loss")) == [3, 6, 9, 11]   # log_every 3 and the last step
    assert CheckpointDir(tmp_path / "fast" / "checkpoints").steps() == [8, 11]
    assert b.metrics["test/loss"] == pytest.approx(a.metrics["test/loss"], rel=1e-4)


def test_graph_step_throughput_counts_only_timed_windows(tmp_path):
    """The first window of the graph loop is not timed (capture, warm-up); its steps are reported
    after the fact in a quick host loop, and must not enter tokens/s (where they gave ~1e9)."""
    tracker = RecordingTracker()
    spec = _spec(24, graphs=True)
    spec["train"] |= {"log_every": 4, "eval_every": 0, "ckpt_every": 0}   # windows of 4 steps
    run_training(spec, out_dir=tmp_path / "run", tracker=tracker)
    rates = _curves(tracker, "train/tokens_per_s")
    assert 4 not in rates   # the first window: nothing timed, no rate
    assert sorted(rates) == [8, 12, 16, 20, 24] and all(r > 0 for r in rates.values())
    assert max(rates.values()) < 5 * min(rates.values()), rates   # none timed by the gap between two reports


def test_graph_step_resume_is_bitwise(tmp_path):
    ref = RecordingTracker()
    run_training(_spec(10, graphs=True), out_dir=tmp_path / "ref", tracker=ref)
    first = RecordingTracker()
    run_training(_spec(10, graphs=True), out_dir=tmp_path / "run", tracker=first, stop_after=6)
    assert CheckpointDir(tmp_path / "run" / "checkpoints").latest().name == "step_0000004"
    second = RecordingTracker()
    run_training(_spec(10, graphs=True), out_dir=tmp_path / "run", tracker=second)
    resumed, full = _curves(second, "train/loss"), _curves(ref, "train/loss")
    assert sorted(resumed) == [6, 9, 10]
    for step, loss in resumed.items():
        assert loss == full[step], step   # bitwise on CPU


def test_batch_worker_processes_feed_the_same_stream(tmp_path):
    """Two spawned batch-building processes (as on CUDA) give bitwise the losses of the
    background thread: each worker builds a contiguous part of the window from its own copy of
    the dataset, and the parts land at their steps."""
    thread, procs = RecordingTracker(), RecordingTracker()
    run_training(_spec(9, graphs=True, workers=0), out_dir=tmp_path / "thread", tracker=thread)
    run_training(_spec(9, graphs=True, workers=2), out_dir=tmp_path / "procs", tracker=procs)
    ref, got = _curves(thread, "train/loss"), _curves(procs, "train/loss")
    assert sorted(ref) == [3, 6, 9] and got == ref


def test_batch_workers_default_to_processes_on_cuda_only(tmp_path):
    assert choose_batch_workers(-1, cuda=False) == 0
    assert 0 <= choose_batch_workers(-1, cuda=True) <= 4
    assert choose_batch_workers(3, cuda=False) == 3
    with pytest.raises(ValueError, match="data.num_workers"):
        run_training(_spec(1, graphs=True, workers=-2), out_dir=tmp_path, tracker=RecordingTracker())


def test_windows_end_at_every_event():
    cfg = TrainConfig(steps=23, batch_size=4, log_every=5, eval_every=7, ckpt_every=10, warmup=0)
    engine = _engine(cfg)
    events = StepEvents(engine, None, cfg, tracker=RecordingTracker(), save=lambda s, m: None, rank=0,
                        world=1, stop_flag=None, on_eval=None, result=LoopResult(step=0))
    spans = [(w.start, w.end) for w in engine.windows(cfg, events, 2, 23)]
    assert spans == [(2, 5), (5, 7), (7, 10), (10, 14), (14, 15), (15, 20), (20, 21), (21, 23)]
    assert [w.buffer for w in engine.windows(cfg, events, 2, 23)] == [0, 1] * 4
    engine.window_cap = 2
    assert [(w.start, w.end) for w in engine.windows(cfg, events, 0, 5)] == [(0, 2), (2, 4), (4, 5)]


def _engine(cfg: TrainConfig) -> GraphEngine:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return GraphEngine(model, opt, device=torch.device("cpu"), precision="fp32", grad_clip=1.0,
                       grad_accum=cfg.grad_accum, micro_batch=cfg.micro_batch(1), block_size=8)


def test_divergence_names_the_first_bad_step(tmp_path):
    spec = _spec(12, graphs=True, accum=1, lr=1e6)   # an absurd lr blows the weights up
    spec["train"] |= {"grad_clip": 0.0, "warmup": 0, "eval_every": 0, "ckpt_every": 0}
    plain = _spec(12, graphs=False, accum=1, lr=1e6)
    plain["train"] = spec["train"] | {"cuda_graphs": False}
    with pytest.raises(TrainingDiverged) as ref:
        run_training(plain, out_dir=tmp_path / "plain", tracker=RecordingTracker())
    with pytest.raises(TrainingDiverged) as got:
        run_training(spec, out_dir=tmp_path / "fast", tracker=RecordingTracker())
    assert got.value.step == ref.value.step and got.value.reason.split()[0] == ref.value.reason.split()[0]
    assert CheckpointDir(tmp_path / "fast" / "checkpoints").steps() == []   # nothing diverged was saved
    assert math.isfinite(ref.value.step)


def test_unsupported_combinations_are_named():
    with pytest.raises(ValueError, match="world=2.*all-reduce"):
        check_graphable(world=2)
    with pytest.raises(ValueError, match="cuda_graphs.*zero_stage"):
        TrainConfig(cuda_graphs=True, zero_stage=2)


# ---- GPU: the captured graph against the eager step (H200) ---------------------------------------
def _gpu_spec(pe: str, backend: str, *, graphs: bool, steps: int = 30, compile: bool = False) -> dict:
    model = preset("tiny", n_layer=2, d_model=64, n_head=4, block_size=48, dropout=0.0,
                   pe={"kind": pe}, attention={"backend": backend})
    return {"model": to_dict(model),
            "data": {"kind": "indirect_indexing", "ii": {"n_valid": 256, "n_test": 256}},
            "train": {"steps": steps, "batch_size": 32, "lr": 1e-3, "min_lr": 1e-4, "warmup": 5,
                      "eval_every": 10, "eval_batches": 2, "final_eval_batches": 2, "ckpt_every": 10,
                      "log_every": 1, "cuda_graphs": graphs, "compile": compile, "device": "cuda"}}


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "graphs-compiled"])
@pytest.mark.parametrize("pe,backend", [("rope", "sdpa"), ("pope", "triton"), ("tapa", "triton")])
def test_gpu_graph_step_matches_eager(tmp_path, pe, backend, compile):
    """The captured step (and with ``train.compile``, the compiled model inside it) against the
    plain eager step."""
    eager, fast = RecordingTracker(), RecordingTracker()
    run_training(_gpu_spec(pe, backend, graphs=False), out_dir=tmp_path / "eager", tracker=eager)
    run_training(_gpu_spec(pe, backend, graphs=True, compile=compile), out_dir=tmp_path / "fast", tracker=fast)
    ref, got = _curves(eager, "train/loss"), _curves(fast, "train/loss")
    assert sorted(got) == sorted(ref) == list(range(1, 31))
    for step in ref:   # bf16 autocast: the same kernels, AdamW's capturable path rounds differently
        assert abs(got[step] - ref[step]) <= 0.02 * abs(ref[step]) + 1e-3, (step, got[step], ref[step])
    assert got[30] < got[1]


@pytest.mark.gpu
def test_gpu_graph_step_kill_and_resume(tmp_path):
    ref = RecordingTracker()
    run_training(_gpu_spec("pope", "triton", graphs=True), out_dir=tmp_path / "ref", tracker=ref)
    run_training(_gpu_spec("pope", "triton", graphs=True), out_dir=tmp_path / "run",
                 tracker=RecordingTracker(), stop_after=17)
    assert CheckpointDir(tmp_path / "run" / "checkpoints").latest().name == "step_0000010"
    second = RecordingTracker()
    run_training(_gpu_spec("pope", "triton", graphs=True), out_dir=tmp_path / "run", tracker=second)
    resumed, full = _curves(second, "train/loss"), _curves(ref, "train/loss")
    assert sorted(resumed) == list(range(11, 31))
    for step, loss in resumed.items():   # within bf16 noise of the uninterrupted run
        assert abs(loss - full[step]) <= 0.02 * abs(full[step]) + 1e-3, (step, loss, full[step])


def test_memmapped_corpora_reach_batch_workers_by_file_name(tmp_path):
    """A batch worker gets its own copy of the dataset; a memmapped corpus must travel as its file
    name (a few hundred bytes), not as its contents, and give the same batches after the trip."""
    from multiprocessing.reduction import ForkingPickler

    import numpy as np

    from phaselab.workloads.data.text import StreamDataset

    np.arange(1_000_000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    tokens = np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")
    ds = StreamDataset(name="m", tokens_by_split={"train": tokens}, vocab_size=65536, block_size=16, digest="d")
    blob = bytes(ForkingPickler.dumps(ds))
    assert len(blob) < 4096            # the array itself is 2 MB
    back = ForkingPickler.loads(blob)
    assert isinstance(back.tokens("train"), np.memmap)
    a, b = ds.get_batch("train", 3, 4, seed=1), back.get_batch("train", 3, 4, seed=1)
    assert torch.equal(a.x_BT, b.x_BT) and torch.equal(a.y_BT, b.y_BT)
    view = tokens[10:20]               # a view is pickled by value, as numpy does
    assert np.array_equal(ForkingPickler.loads(bytes(ForkingPickler.dumps(view))), np.arange(10, 20))
