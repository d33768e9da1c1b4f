"""Continued pretraining / fine-tune from a checkpoint: longer sequence + YaRN changes the RoPE
frequencies and the block size, keeps every weight, and starts a fresh optimiser."""

import pytest
import torch

from phaselab.catalog.tracking import RecordingTracker
from phaselab.kernels.rotary.scaling import RopeConfig, rope_frequencies
from phaselab.workloads.config import to_dict
from phaselab.workloads.data import build_dataset
from phaselab.workloads.models.checkpoint_io import load_model
from phaselab.workloads.models.presets import preset
from phaselab.workloads.train.api import build_model, parse_spec, run_training

TRAIN = {"batch_size": 4, "lr": 1e-3, "warmup": 1, "eval_every": 0, "eval_batches": 1,
         "final_eval_batches": 1, "ckpt_every": 0, "log_every": 1}


def _data(block: int) -> dict:
    return {"kind": "text", "block_size": block, "text": {"tokenizer": "char"}}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    model = preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=32, pe={"kind": "rope"})
    spec = {"model": to_dict(model), "data": _data(32), "train": {"steps": 2, **TRAIN}}
    out = run_training(spec, out_dir=tmp_path_factory.mktemp("pre"), tracker=RecordingTracker())
    return out.checkpoint


def _cpt_spec(extend: dict | None, steps: int = 2) -> dict:
    return {"data": _data(64), "train": {"steps": steps, **TRAIN}, "extend": extend}


def test_yarn_extension_changes_frequencies_keeps_weights(pretrained, tmp_path):
    yarn = {"rule": "yarn", "factor": 2.0, "original_max_seq_len": 32, "block_size": 64}
    parsed = parse_spec(_cpt_spec(yarn))
    source = load_model(pretrained)
    model = build_model(parsed, build_dataset(parsed.data), pretrained)
    assert model.cfg.block_size == 64 and model.cfg.pe.rope.scaling == "yarn"
    assert model.cfg.pe.rope.factor == 2.0 and model.cfg.pe.rope.original_max_seq_len == 32
    src_params = dict(source.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, src_params[name]), name
    old = source.h[0].attn.pe.inv_freq
    new = model.h[0].attn.pe.inv_freq
    expected, _ = rope_frequencies(RopeConfig(scaling="yarn", factor=2.0, original_max_seq_len=32), 16,
                                   seq_len=64)
    torch.testing.assert_close(new, expected, rtol=0, atol=0)
    assert not torch.equal(new, old) and torch.all(new <= old)  # YaRN only slows frequencies

    tracker = RecordingTracker()
    out = run_training(_cpt_spec(yarn), out_dir=tmp_path, tracker=tracker, init_from=pretrained)
    tuned = load_model(out.checkpoint)
    assert tuned.cfg.block_size == 64 and tuned.cfg.pe.rope.scaling == "yarn"
    assert out.records[0].context_len == 64
    assert tracker.params["init_from"] == str(pretrained)
    # a fresh optimiser: the first step is the schedule's warm-up step from scratch
    assert tracker.metrics[0][0] == 1 and tracker.metrics[0][1]["train/lr"] == pytest.approx(1e-3)


def test_init_from_accepts_a_run_folder_and_rejects_bad_extensions(pretrained, tmp_path):
    run_dir = pretrained.parent.parent.parent  # out_dir of the pretraining run
    parsed = parse_spec(_cpt_spec({"rule": "none", "block_size": 64}))
    model = build_model(parsed, build_dataset(parsed.data), run_dir)
    assert model.cfg.block_size == 64 and model.cfg.pe.rope.scaling == "none"
    with pytest.raises(ValueError, match="differs"):
        bad = _cpt_spec(None)
        bad["model"] = to_dict(preset("tiny", n_layer=2, d_model=32, n_head=2, block_size=64))
        p = parse_spec(bad)
        build_model(p, build_dataset(p.data), pretrained)
    with pytest.raises(ValueError, match="holds no model.pt"):
        build_model(parsed, build_dataset(parsed.data), tmp_path)
