"""The three PoPE attention paths train the same model (issue: a bug hunt in our PoPE path
before a gap to a paper is called a finding): the polar definition (`reference`), the Cartesian
2D-wide expansion through SDPA (`pe.pope.expand: true`, `sdpa`) and the fused Triton kernel
(`triton`, under the interpreter on CPU) give the same training and validation losses, step by
step, from the same seed, to fp32 rounding."""

import os

import pytest

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.config import to_dict
from phaselab.workloads.models.presets import preset
from phaselab.workloads.train.api import run_training

PATHS = {"reference": ({}, "reference"), "sdpa-expanded": ({"expand": True}, "sdpa"),
         "triton": ({}, "triton")}


def _losses(tmp_path, path: str, steps: int, layers: int) -> dict[tuple[str, int], float]:
    pope, backend = PATHS[path]
    model = preset("tiny", n_layer=layers, d_model=32, n_head=2, block_size=48, dropout=0.0,
                   pe={"kind": "pope", "pope": {"delta_init": "uniform", **pope}}, attention={"backend": backend})
    spec = {"model": to_dict(model), "data": {"kind": "indirect_indexing", "ii": {"n_valid": 64, "n_test": 64}},
            "train": {"steps": steps, "batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup": 2,
                      "eval_every": steps // 2, "eval_batches": 1, "final_eval_batches": 1, "ckpt_every": 0, "log_every": 1,
                      "device": "cpu"}}
    tracker = RecordingTracker()
    run_training(spec, out_dir=tmp_path / path, tracker=tracker)
    return {(k, s): v for s, m in tracker.metrics for k, v in m.items() if k in ("train/loss", "valid/loss")}


# the interpreter runs each kernel program in Python: a short run keeps the triton case short
@pytest.mark.parametrize(("path", "steps", "layers"), [("sdpa-expanded", 24, 2), ("triton", 2, 1)])
def test_pope_paths_train_alike(tmp_path, path, steps, layers):
    if path == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused kernel runs on CPU only under TRITON_INTERPRET=1 (tests/kernels sets it)")
    ref, got = _losses(tmp_path, "reference", steps, layers), _losses(tmp_path, path, steps, layers)
    assert sorted(got) == sorted(ref) and len(ref) == steps + 2   # every step, and validation at half and end
    if steps > 10:   # the model learns, so the comparison covers updates that matter
        assert ref[("train/loss", steps)] < ref[("train/loss", 1)]
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-4), key
