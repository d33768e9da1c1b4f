"""What ran, as the process that ran the model reports it (workloads.provenance): the backend of
every attention call site, the implementation each op took and whether its backward is
deterministic, the kernel options it ran with (model.attention), precision, graph mode and
device, written by training and by evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from phaselab.catalog.tracking import NullTracker, run_folder
from phaselab.kernels import registry
from phaselab.workloads import provenance
from phaselab.workloads.evals.api import run_eval
from phaselab.workloads.train.api import run_training


def _spec(pe: str, backend: str, *, device: str = "cpu", d_model: int = 32, n_head: int = 2,
          block: int = 16, deterministic: bool = False, **options) -> dict:
    return {"model": {"vocab_size": 66, "block_size": block, "n_layer": 2, "n_head": n_head, "d_model": d_model,
                      "pe": {"kind": pe}, "attention": {"backend": backend, "deterministic": deterministic,
                                                        **options}},
            "data": {"kind": "text", "block_size": block},
            "train": {"steps": 2, "batch_size": 2, "warmup": 1, "eval_every": 0, "final_eval_batches": 1,
                      "ckpt_every": 0, "log_every": 1, "device": device}}


@pytest.mark.parametrize("pe,backend,op,impl,options,used", [
    ("rope", "sdpa", "sdpa", "torch", {"exp2": "poly"}, {}),   # options of the triton kernels only
    ("rope", "reference", "reference", "torch", {}, {}),
    ("pope", "triton", "pope", "expand", {}, {"pope": {"pope_impl": "auto", "autotune": False}}),
    ("pope", "triton", "pope", "fused", {"pope_impl": "fused", "exp2": "split"},
     {"pope": {"pope_impl": "fused", "exp2": "split", "autotune": False}}),
    ("tapa", "triton", "tapa", "fused", {"tapa_series": False, "exp2": "poly"},
     {"tapa": {"tapa_series": False, "exp2": "poly", "autotune": False, "core": "tl"}}),
])
def test_training_and_eval_report_what_ran_on_cpu(tmp_path: Path, pe, backend, op, impl, options, used) -> None:
    outcome = run_training(_spec(pe, backend, **options), out_dir=tmp_path / "train", tracker=NullTracker())
    ran = json.loads((tmp_path / "train" / run_folder.PROVENANCE_FILE).read_text())
    assert ran["attention"] == {"sites": {"h.0.attn": backend, "h.1.attn": backend}, "impls": {op: [impl]},
                                "options": used}
    assert (ran["deterministic"], ran["deterministic_requested"], ran["precision"], ran["device"]) == \
        (True, False, "fp32", "cpu")
    assert (ran["compile"], ran["cuda_graphs"]) == (False, False)

    registry.record_impl("stale", "from-an-earlier-run", deterministic=False)   # a reused worker's
    run_eval({"suite": "ppl-by-length", "ppl": {"lengths": [16], "max_tokens": 64}, "device": "cpu"},
             checkpoint=outcome.checkpoint, out_dir=tmp_path / "eval", tracker=NullTracker())
    ran = provenance.read(tmp_path / "eval")
    assert ran["attention"]["impls"] == {op: [impl]} and ran["deterministic"] is True   # reset first
    assert ran["attention"]["options"] == used   # the checkpoint's model config carries the options


def test_a_non_deterministic_implementation_makes_the_run_non_deterministic() -> None:
    provenance.reset()
    registry.record_impl("pope", "expand", deterministic=True)
    assert provenance.what_ran(device="cpu", precision="fp32")["deterministic"] is True
    registry.record_impl("pope", "cudnn", deterministic=False)
    ran = provenance.what_ran(device="cpu", precision="fp32")
    assert ran["deterministic"] is False and ran["attention"]["impls"] == {"pope": ["cudnn", "expand"]}
    provenance.reset()
    assert provenance.what_ran(device="cpu", precision="fp32")["deterministic"] is None   # nothing ran


def test_read_tolerates_a_missing_or_torn_file(tmp_path: Path) -> None:
    assert provenance.read(tmp_path) is None
    (tmp_path / run_folder.PROVENANCE_FILE).write_text('{"attention": ')
    assert provenance.read(tmp_path) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (marker gpu; run on the H200)")
def test_pope_on_the_cudnn_core_is_recorded_as_non_deterministic(tmp_path: Path) -> None:
    """On Hopper the triton backend's PoPE takes cuDNN's core (non-deterministic backward) unless
    the model asks for determinism; both are what the run reports."""
    spec = _spec("pope", "triton", device="cuda", d_model=128, n_head=2, block=128)
    run_training(spec, out_dir=tmp_path / "fast", tracker=NullTracker())
    ran = provenance.read(tmp_path / "fast")
    assert ran["attention"]["impls"] == {"pope": ["cudnn"]}
    assert ran["attention"]["options"] == {"pope": {"pope_impl": "auto"}}   # cuDNN's core: no exp2, no tiles
    assert (ran["deterministic"], ran["precision"], ran["device"]) == (False, "bf16", torch.cuda.get_device_name())
    spec["model"]["attention"]["deterministic"] = True
    run_training(spec, out_dir=tmp_path / "det", tracker=NullTracker())
    ran = provenance.read(tmp_path / "det")
    assert "cudnn" not in ran["attention"]["impls"]["pope"] and ran["deterministic_requested"] is True
    # embedding and other CUDA backwards accumulate with atomics unless torch is told otherwise
    assert ran["deterministic"] is False and ran["torch_deterministic_algorithms"] is False
