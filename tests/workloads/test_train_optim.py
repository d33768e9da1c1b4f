"""AdamW parameter groups: δ excluded by NAME, norms/biases never decayed, embeddings optional."""

import math

import pytest
import torch

from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer
from phaselab.workloads.train.config import OptimConfig
from phaselab.workloads.train.optim import build_optimizer, param_groups, set_lr


def _pope_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(preset("tiny", n_layer=2, d_model=32, n_head=2, block_size=16,
                              pe={"kind": "pope", "pope": {"delta_init": "uniform"}}))


def _names(groups):
    return {g["name"]: set(g["param_names"]) for g in groups}


def test_groups_by_name():
    model = _pope_model()
    groups = _names(param_groups(model, OptimConfig(lr=1e-3)))
    deltas = {n for n, _ in model.named_parameters() if n.endswith(".delta")}
    assert deltas == {"h.0.attn.pe.delta", "h.1.attn.pe.delta"}
    assert groups["delta"] == deltas
    # δ is 2-D (H, D): a rank rule would have decayed it; the name rule must not.
    assert all(dict(model.named_parameters())[n].dim() == 2 for n in deltas)
    assert not deltas & groups["decay"]
    norms = {n for n, p in model.named_parameters() if "ln" in n}
    assert norms and norms <= groups["no_decay"]
    assert "wte.weight" in groups["decay"]
    assert all(dict(model.named_parameters())[n].dim() == 2 for n in groups["decay"])
    no_emb = _names(param_groups(model, OptimConfig(lr=1e-3, decay_embeddings=False)))
    assert "wte.weight" in no_emb["no_decay"] and "wte.weight" not in no_emb["decay"]
    all_names = {n for n, _ in model.named_parameters()}
    assert set().union(*groups.values()) == all_names  # every parameter exactly once


def test_decay_and_lr_multiplier_act_on_the_right_tensors():
    """One AdamW step with zero gradients: only decoupled weight decay moves parameters."""
    model = _pope_model()
    cfg = OptimConfig(lr=1e-3, weight_decay=0.5, delta_lr_mult=3.0)
    opt = build_optimizer(model, cfg)
    set_lr(opt, 0.1)
    assert {g["name"]: g["lr"] for g in opt.param_groups} == pytest.approx(
        {"decay": 0.1, "no_decay": 0.1, "delta": 0.3})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    params = dict(model.named_parameters())
    shrink = 1 - 0.1 * 0.5
    torch.testing.assert_close(params["h.0.attn.c_q.weight"], before["h.0.attn.c_q.weight"] * shrink)
    torch.testing.assert_close(params["h.0.attn.pe.delta"], before["h.0.attn.pe.delta"], rtol=0, atol=0)
    torch.testing.assert_close(params["h.0.ln_1.weight"], before["h.0.ln_1.weight"], rtol=0, atol=0)
    assert not math.isclose(float(before["h.0.attn.pe.delta"].abs().sum()), 0.0)


def test_delta_weight_decay_option_and_validation():
    model = _pope_model()
    groups = param_groups(model, OptimConfig(lr=1e-3, weight_decay=0.1, delta_weight_decay=True))
    assert next(g for g in groups if g["name"] == "delta")["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="betas"):
        OptimConfig(lr=1e-3, beta2=1.0)
    with pytest.raises(ValueError, match="delta_lr_mult"):
        OptimConfig(lr=1e-3, delta_lr_mult=0.0)
