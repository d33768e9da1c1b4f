"""A tiny char-level Tiny Shakespeare model shared by the eval tests (imported by the other
test_evals_* files). Trained once per machine with plain torch AdamW and cached as a checkpoint
under .phaselab/test-scratch, keyed by the training recipe, so the eval suites run on a real
(if weak) trained model without each file paying for training."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from phaselab.workloads.config import to_dict
from phaselab.workloads.data import DataConfig, build_dataset
from phaselab.workloads.models.checkpoint_io import load_model, save_model
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer

SCRATCH = Path(__file__).resolve().parents[2] / ".phaselab" / "test-scratch"
RECIPE = {"n_layer": 2, "d_model": 64, "n_head": 4, "block_size": 128, "steps": 60, "batch": 8,
          "lr": 4e-3, "seed": 0, "backend": "sdpa"}


def text_dataset():
    return build_dataset(DataConfig(kind="text", block_size=RECIPE["block_size"]))


def tiny_model(pe: str = "rope", *, seed: int = 0, **overrides) -> Transformer:
    """A randomly initialised tiny char model (vocab 65) with encoding ``pe``."""
    torch.manual_seed(seed)
    cfg = preset("tiny", vocab_size=text_dataset().vocab_size, block_size=RECIPE["block_size"],
                 n_layer=RECIPE["n_layer"], d_model=RECIPE["d_model"], n_head=RECIPE["n_head"],
                 pe={"kind": pe}, attention={"backend": RECIPE["backend"]}, **overrides)
    return Transformer(cfg)


def trained_checkpoint() -> Path:
    """Path of the trained tiny RoPE model (trained on first use, then reused)."""
    # keyed by the recipe AND the model config schema, so a changed ModelConfig retrains
    cfg = to_dict(tiny_model("rope", seed=RECIPE["seed"]).cfg)
    key = hashlib.sha256(json.dumps([RECIPE, cfg], sort_keys=True).encode()).hexdigest()[:12]
    path = SCRATCH / f"evals-tiny-char-{key}.pt"
    if path.exists():
        return path
    ds = text_dataset()
    model = tiny_model("rope", seed=RECIPE["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], weight_decay=0.0)
    model.train()
    for step in range(RECIPE["steps"]):
        b = ds.get_batch("train", step, RECIPE["batch"], seed=RECIPE["seed"])
        _, loss = model(b.x_BT, targets_BT=b.y_BT, loss_mask_BT=b.mask_BT)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        model.after_optimizer_step()
    return save_model(model.eval(), path)


@pytest.fixture(scope="session")
def trained_model() -> Transformer:
    return load_model(trained_checkpoint()).eval()


def test_trained_fixture_learns_something(trained_model):
    """The shared model beats the uniform distribution by a clear margin on validation text."""
    ds = text_dataset()
    b = next(iter(ds.eval_batches("valid", 8)))
    with torch.no_grad():
        _, loss = trained_model(b.x_BT, targets_BT=b.y_BT, loss_mask_BT=b.mask_BT)
    assert float(loss) < math.log(ds.vocab_size) - 0.8, float(loss)
