"""Frequency-usage analysis and task metrics, against values recomputed by hand from hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_evals_fixtures import tiny_model

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.config import from_dict
from phaselab.workloads.data import DataConfig, build_dataset
from phaselab.workloads.evals import analysis, tasks_metrics
from phaselab.workloads.evals.api import run_eval
from phaselab.workloads.models.checkpoint_io import save_model
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer


def _hooked_qk(model, passages):
    """Raw q/k projections of every layer, captured by forward hooks during ordinary forwards."""
    got = {i: {"q": [], "k": []} for i in range(len(model.h))}
    hooks = []
    for i, block in enumerate(model.h):
        hooks.append(block.attn.c_q.register_forward_hook(lambda m, a, o, i=i: got[i]["q"].append(o[0].double())))
        hooks.append(block.attn.c_k.register_forward_hook(lambda m, a, o, i=i: got[i]["k"].append(o[0].double())))
    with torch.no_grad():
        for ids in passages:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return {i: {k: torch.cat(v) for k, v in d.items()} for i, d in got.items()}  # [N_tokens, H*D]


PASSAGES = [[5, 9, 13, 2, 40, 41, 7, 0, 63, 21], list(range(3, 28))]  # 10 and 25 tokens


def test_rope_pair_norms_by_hand():
    model = tiny_model("rope", seed=11).eval()
    assert model.cfg.pe.rope.pairing == "interleaved" and model.cfg.pe.rope.rotary_fraction == 1.0
    u = analysis.frequency_usage(model, PASSAGES, max_len=64)
    H, D = model.cfg.n_head, model.cfg.head_dim
    hooked = _hooked_qk(model, PASSAGES)
    for layer, qk in hooked.items():
        q_NHF2 = qk["q"].view(-1, H, D // 2, 2)  # pairs (2i, 2i+1)
        k_NHF2 = qk["k"].view(-1, model.cfg.kv_heads, D // 2, 2)
        want_q = q_NHF2.pow(2).sum(-1).sqrt().mean(0).numpy()  # token-weighted over both passages
        want_k = k_NHF2.pow(2).sum(-1).sqrt().mean(0).numpy()
        np.testing.assert_allclose(u.q_LHF[layer], want_q, rtol=1e-5)
        np.testing.assert_allclose(u.k_LGF[layer], want_k, rtol=1e-5)
    i = np.arange(D // 2)
    np.testing.assert_allclose(u.freq_F, model.cfg.pe.rope.base ** (-2 * i / D), rtol=1e-6)
    assert u.n_tokens == 35 and u.delta_LHD is None and u.q_LHF.shape == (2, H, D // 2)


def test_pope_amplitudes_and_delta_by_hand(tmp_path):
    model = tiny_model("pope", seed=12).eval()
    with torch.no_grad():  # distinct δ per (layer, head, component) so a mix-up would show
        for j, block in enumerate(model.h):
            block.attn.pe.delta.copy_(-torch.rand(block.attn.pe.delta.shape) * 6.0 - 0.01 * j)
    u = analysis.frequency_usage(model, PASSAGES, max_len=64)
    H, D = model.cfg.n_head, model.cfg.head_dim
    for layer, qk in _hooked_qk(model, PASSAGES).items():
        np.testing.assert_allclose(u.q_LHF[layer], F.softplus(qk["q"]).view(-1, H, D).mean(0).numpy(), rtol=1e-5)
        np.testing.assert_allclose(u.delta_LHD[layer], model.h[layer].attn.pe.delta.detach().double().numpy(),
                                   rtol=1e-6)
    np.testing.assert_allclose(u.freq_F, model.cfg.pe.pope.base ** (-np.arange(D) / D), rtol=1e-6)
    arts = analysis.save_usage(u, tmp_path, label="pope")
    assert np.array_equal(np.load(arts["freq_q_LHF.npy"]), u.q_LHF)
    assert np.array_equal(np.load(arts["delta_LHD.npy"]), u.delta_LHD)
    assert arts["delta_heatmaps.png"].stat().st_size > 1000 and arts["freq_usage.png"].stat().st_size > 1000


def test_high_share_and_passages():
    q_LF = np.array([[4.0, 1, 1, 1, 1, 1, 1, 2], [0.0, 0, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_allclose(analysis.high_share(q_LF), [5 / 12, 0.0])
    text = "".join(f"line {i}\n" for i in range(100))
    ps = analysis.fixed_passages(text)
    assert len(ps) == 10 and ps[0].startswith("line 0\n") and ps[-1].endswith("line 99\n")
    assert all(p.count("\n") == 14 for p in ps)


def test_run_eval_freq(tmp_path):
    ckpt = save_model(tiny_model("pope", seed=13), tmp_path / "pope.pt")
    tracker = RecordingTracker()
    records = run_eval({"suite": "freq", "device": "cpu"}, checkpoint=ckpt, out_dir=tmp_path / "out",
                       tracker=tracker)
    assert [r.name for r in records] == ["freq_high_share_q/layer0", "freq_high_share_q/layer1"]
    q_LHF = np.load(tmp_path / "out" / "freq_q_LHF.npy")
    np.testing.assert_allclose([r.value for r in records], analysis.high_share(q_LHF.mean(axis=1)))
    assert all(r.task == "freq/pope" and r.n > 10 * 100 for r in records)  # 10 passages, >100 chars each
    assert {"delta_heatmaps.png", "freq_usage.png", "delta_LHD.npy"} <= set(tracker.artifacts)


def test_task_metrics_indirect_indexing_accuracy(tmp_path):
    data = {"kind": "indirect_indexing", "ii": {"n_test": 40}}
    ds = build_dataset(from_dict(DataConfig, data))
    torch.manual_seed(4)
    model = Transformer(preset("tiny", vocab_size=ds.vocab_size, block_size=ds.block_size, d_model=32,
                               attention={"backend": "sdpa"}))
    ckpt = save_model(model, tmp_path / "ii.pt")
    records = run_eval({"suite": "task", "data": data, "device": "cpu", "batch_size": 16}, checkpoint=ckpt,
                       out_dir=tmp_path / "out", tracker=RecordingTracker())
    correct = n = 0
    with torch.no_grad():
        for b in ds.eval_batches("test", 7):
            pred = model(b.x_BT)[0].argmax(-1)
            sel = b.mask_BT > 0
            assert (sel.sum(1) == 1).all()  # one scored target per example
            correct += int((pred[sel] == b.y_BT[sel]).sum())
            n += int(sel.sum())
    (r,) = records
    assert (r.name, r.unit, r.task, r.split, r.n) == ("acc", "fraction", "indirect_indexing", "test", 40)
    assert r.value == pytest.approx(correct / n)


def test_task_metrics_jsb_nll_per_scored_token():
    ds = build_dataset(DataConfig(kind="jsb"))
    torch.manual_seed(5)
    model = Transformer(preset("tiny", vocab_size=ds.vocab_size, block_size=512, d_model=32,
                               attention={"backend": "sdpa"})).eval()
    r = tasks_metrics.split_nll(model, ds, "test", batch_size=2, max_batches=2, precision="fp32")
    total = n = 0.0
    with torch.no_grad():
        for i, b in enumerate(ds.eval_batches("test", 2)):
            if i == 2:
                break
            _, loss = model(b.x_BT, targets_BT=b.y_BT, loss_mask_BT=b.mask_BT)  # the model's own masked mean
            total += float(loss) * float(b.mask_BT.sum())
            n += float(b.mask_BT.sum())
    assert (r.name, r.unit, r.n) == ("nll", "nats/token", int(n))
    assert r.value == pytest.approx(total / n, rel=1e-5)
    assert abs(r.value - np.log(ds.vocab_size)) < 1.0  # an untrained model sits near uniform
