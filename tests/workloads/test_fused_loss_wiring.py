"""`Transformer.forward(logits=False)` and the engines' use of it (the fused LM-head loss).

CPU keeps `masked_cross_entropy` (bitwise the logits=True loss); CUDA (`gpu`) takes the fused
kernel of phaselab.kernels.loss, eager and under torch.compile, checked against the logits path.
"""

from __future__ import annotations

import pytest
import torch

from phaselab.kernels.testing import assert_close
from phaselab.workloads.models import preset
from phaselab.workloads.models.transformer import Transformer
from phaselab.workloads.train.loop import TorchEngine


def _batch(vocab: int, B: int, T: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, vocab, (B, T), generator=gen)
    y = torch.roll(x, -1, 1)
    y[:, -1] = -1
    m = (torch.rand(B, T, generator=gen) > 0.3).float()
    return x.to(device), y.to(device), m.to(device)


def _loss_and_grads(model, x, y, m, *, logits):
    model.zero_grad(set_to_none=True)
    out, loss = model(x, targets_BT=y, loss_mask_BT=m, logits=logits)
    loss.backward()
    return out, loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_cpu_logits_false_is_bitwise_the_logits_path():
    torch.manual_seed(0)
    model = Transformer(preset("tiny", n_layer=1, d_model=64), device_type="cpu")
    x, y, m = _batch(66, 2, 16)
    logits_out, ref_loss, ref_grads = _loss_and_grads(model, x, y, m, logits=True)
    none_out, loss, grads = _loss_and_grads(model, x, y, m, logits=False)
    assert logits_out is not None and none_out is None
    assert torch.equal(loss, ref_loss) and torch.isfinite(loss)
    assert all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads)


def test_logits_false_needs_targets():
    model = Transformer(preset("tiny", n_layer=1, d_model=64), device_type="cpu")
    with pytest.raises(ValueError, match="targets_BT"):
        model(_batch(66, 1, 8)[0], logits=False)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "torch"])
def test_torch_engine_fused_flag_on_cpu_gives_the_same_loss(fused):
    """fused_loss only changes the CUDA path: on CPU both settings give the logits path's loss."""
    torch.manual_seed(0)
    model = Transformer(preset("tiny", n_layer=1, d_model=64), device_type="cpu")
    x, y, m = _batch(66, 2, 16)
    _, ref_loss = model(x, targets_BT=y, loss_mask_BT=m)
    engine = TorchEngine(model, torch.optim.SGD(model.parameters(), lr=0.0), device=torch.device("cpu"),
                         precision="fp32", grad_clip=0.0, grad_accum=1, fused_loss=fused)
    batch = type("Batch", (), {"x_BT": x, "y_BT": y, "mask_BT": m})()
    assert engine.fused_loss is fused
    assert torch.equal(engine.micro_step(batch, step=0, last=True), ref_loss.detach().float())


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_cuda_fused_loss_matches_the_logits_path(compile):
    """bf16 autocast on CUDA: the fused loss and every parameter gradient agree with logits=True
    (same bf16 logits, fp32 softmax; only summation order differs)."""
    torch.manual_seed(0)
    model = Transformer(preset("owt-124m", n_layer=2, d_model=128, n_head=4, vocab_size=1000),
                        device_type="cuda").cuda()
    runner = torch.compile(model) if compile else model
    x, y, m = _batch(1000, 4, 64, "cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, ref_loss, ref_grads = _loss_and_grads(runner, x, y, m, logits=True)
        out, loss, grads = _loss_and_grads(runner, x, y, m, logits=False)
    assert out is None
    assert_close("fused-model-loss", ref_loss, loss, 1e-3)
    for name, g in ref_grads.items():
        assert_close(f"fused-model-grad-{name}", g, grads[name], 2e-2)
