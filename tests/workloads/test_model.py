"""The Transformer: forward/backward per preset, loss, backends, decoding, packing, checkpoints."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from phaselab.kernels import registry
from phaselab.kernels.registry import BackendUnsupported
from phaselab.workloads.models import ContextExtension, KVCache, preset
from phaselab.workloads.models.checkpoint_io import load_config, load_model, save_model
from phaselab.workloads.models.presets import PRESET_NAMES
from phaselab.workloads.models.transformer import Transformer

# Shrink every preset but keep its structure (GQA ratio, MLP kind, tying, vocab padding, dropout).
SHRINK = {
    "ii-8l512": {"n_layer": 2, "d_model": 64, "n_head": 4},
    "jsb-6l256": {"n_layer": 2, "d_model": 64, "n_head": 4},
    "maestro-6l384": {"n_layer": 2, "d_model": 96, "n_head": 4},
    "genome-16l1024": {"n_layer": 2, "d_model": 64, "n_head": 4, "vocab_size": 600},
    "owt-124m": {"n_layer": 2, "d_model": 64, "n_head": 4, "vocab_size": 1000},
    "owt-253m": {"n_layer": 2, "d_model": 64, "n_head": 4, "vocab_size": 1000},
    "owt-774m": {"n_layer": 2, "d_model": 80, "n_head": 5, "vocab_size": 1000},
    "llama-7b": {"n_layer": 2, "d_model": 128, "n_head": 4, "n_kv_head": 1, "vocab_size": 1000},
    "tiny": {},
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def _tokens(vocab: int, B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def test_shrink_table_covers_every_preset():
    assert set(SHRINK) == set(PRESET_NAMES)


@pytest.mark.parametrize("kind", ["rope", "pope", "tapa"])
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_forward_backward_on_each_preset(name, kind):
    torch.manual_seed(0)
    cfg = preset(name, pe={"kind": kind}, **SHRINK[name])
    model = Transformer(cfg).train()
    idx_BT = _tokens(cfg.vocab_size, 2, 12)
    logits_BTV, loss = model(idx_BT, targets_BT=torch.roll(idx_BT, -1, 1))
    assert logits_BTV.shape == (2, 12, cfg.vocab_size)
    assert torch.isfinite(loss) and 0.5 * torch.log(torch.tensor(cfg.vocab_size)) < loss < 3 * torch.log(
        torch.tensor(cfg.vocab_size))
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


def test_structure_is_kept_when_shrinking():
    llama = Transformer(preset("llama-7b", **SHRINK["llama-7b"]))
    attn = llama.h[0].attn
    assert attn.c_q.weight.shape == (128, 128) and attn.c_k.weight.shape == (32, 128)  # G = 1, D = 32
    assert llama.h[0].mlp.swiglu and llama.h[0].mlp.c_fc.weight.shape == (2 * 448, 128)
    assert llama.lm_head.weight is not llama.wte.weight
    owt = Transformer(preset("owt-124m", **SHRINK["owt-124m"]))
    assert owt.wte.weight.shape == (1024, 64)  # 1000 padded to a multiple of 64
    assert owt.lm_head.weight is owt.wte.weight
    assert all(m.bias is None for m in owt.modules() if isinstance(m, torch.nn.Linear))


def test_loss_is_masked_mean_cross_entropy():
    model = Transformer(preset("tiny")).eval()
    idx_BT = _tokens(66, 3, 10, seed=1)
    targets_BT = _tokens(66, 3, 10, seed=2)
    mask_BT = (torch.rand(3, 10, generator=torch.Generator().manual_seed(3)) > 0.5).float()
    with torch.no_grad():
        logits_BTV, loss = model(idx_BT, targets_BT=targets_BT, loss_mask_BT=mask_BT)
    nll_BT = F.cross_entropy(logits_BTV.double().transpose(1, 2), targets_BT, reduction="none")
    assert loss.dtype == torch.float32
    assert abs(float(loss) - float((nll_BT * mask_BT).sum() / mask_BT.sum())) < 1e-5
    with torch.no_grad():
        _, full = model(idx_BT, targets_BT=targets_BT)
        ignored = targets_BT.masked_fill(mask_BT == 0, -1)
        _, loss_ignore = model(idx_BT, targets_BT=ignored)
    assert abs(float(full) - float(nll_BT.mean())) < 1e-5
    assert abs(float(loss_ignore) - float(loss)) < 1e-6


def test_backend_is_recorded_per_layer():
    registry.reset()
    Transformer(preset("tiny", n_layer=3, attention={"backend": "sdpa"}))
    assert registry.backends_used() == {"h.0.attn": "sdpa", "h.1.attn": "sdpa", "h.2.attn": "sdpa"}
    Transformer(preset("tiny", pe={"kind": "tapa"}, attention={"backend": "auto"}))
    assert registry.backends_used()["h.0.attn"] == "reference"  # auto: sdpa refuses TAPA on CPU


def test_named_backend_refusal_raises_at_build():
    with pytest.raises(BackendUnsupported, match="TAPA"):
        Transformer(preset("tiny", pe={"kind": "tapa"}, attention={"backend": "sdpa"}))


@pytest.mark.parametrize("kind", ["none", "rope", "pope", "alibi"])
def test_reference_and_sdpa_give_the_same_logits(kind):
    torch.manual_seed(0)
    ref = Transformer(preset("tiny", n_kv_head=2, pe={"kind": kind, "pope": {"delta_init": "uniform"}}))
    sdpa = Transformer(preset("tiny", n_kv_head=2, attention={"backend": "sdpa"},
                              pe={"kind": kind, "pope": {"delta_init": "uniform"}}))
    sdpa.load_state_dict(ref.state_dict())
    idx_BT = _tokens(66, 2, 20, seed=4)
    out_ref, loss_ref = ref.eval()(idx_BT, targets_BT=idx_BT)
    out_sdpa, loss_sdpa = sdpa.eval()(idx_BT, targets_BT=idx_BT)
    assert _rel(out_sdpa, out_ref) < 1e-5
    loss_ref.backward()
    loss_sdpa.backward()
    for (name, a), b in zip(ref.named_parameters(), sdpa.parameters()):
        assert _rel(b.grad, a.grad) < 1e-4, name


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("kind", ["rope", "pope", "none"])
def test_kv_cache_decoding_matches_full_forward(kind, backend):
    """T < S decoding (queries after cached keys, bottom-right causal alignment, MATH §7.6)."""
    torch.manual_seed(0)
    model = Transformer(preset("tiny", n_kv_head=2, attention={"backend": backend},
                               pe={"kind": kind, "pope": {"delta_init": "uniform"}})).eval()
    idx_BT = _tokens(66, 2, 16, seed=5)
    with torch.no_grad():
        full, _ = model(idx_BT)
        cache = KVCache(model.cfg.n_layer)
        prefix, _ = model(idx_BT[:, :9], kv_cache=cache)
        chunk, _ = model(idx_BT[:, 9:15], kv_cache=cache)  # T = 6, S = 15
        last, _ = model(idx_BT[:, 15:], kv_cache=cache)  # T = 1, S = 16
    assert cache.length == 16
    assert _rel(torch.cat([prefix, chunk, last], dim=1), full) < 1e-5
    calls = model.h[0].attn._checked_calls
    assert any(c.q_shorter_than_k for c in calls)  # the decode call was checked, not assumed


def test_call_mismatch_after_build_raises():
    """sdpa was checked for fp32 ALiBi at build; a bf16 call is re-checked and refused."""
    model = Transformer(preset("tiny", pe={"kind": "alibi"}, attention={"backend": "sdpa"}))
    idx_BT = _tokens(66, 1, 8)
    model(idx_BT)
    with pytest.raises(BackendUnsupported, match=r"layer h\.0\.attn: .*'dtype': torch\.bfloat16.*ALiBi"):
        model.to(torch.bfloat16)(idx_BT)


def test_packed_documents_do_not_see_each_other():
    torch.manual_seed(0)
    for backend in ("reference", "sdpa"):
        model = Transformer(preset("tiny", attention={"backend": backend}, pe={"kind": "pope"})).eval()
        a, b = _tokens(66, 1, 7, seed=6), _tokens(66, 1, 5, seed=7)
        packed = torch.cat([a, b], dim=1)
        pos_BT = torch.cat([torch.arange(7), torch.arange(5)])[None]
        out, _ = model(packed, pos_BT=pos_BT)
        assert _rel(out[:, :7], model(a)[0]) < 1e-5
        assert _rel(out[:, 7:], model(b)[0]) < 1e-5
        leaky, _ = model(packed)  # one document: the second part sees the first
        assert _rel(leaky[:, 7:], model(b)[0]) > 1e-3


def test_save_load_round_trip_identical_logits(tmp_path):
    torch.manual_seed(0)
    model = Transformer(preset("tiny", n_kv_head=2, pe={"kind": "pope", "pope": {"delta_init": "uniform"}}))
    path = save_model(model, tmp_path / "ckpt" / "model.pt")
    assert not [p for p in path.parent.iterdir() if p.name != "model.pt"]  # no temp file left
    loaded = load_model(path)
    idx_BT = _tokens(66, 2, 16, seed=8)
    assert torch.equal(loaded.eval()(idx_BT)[0], model.eval()(idx_BT)[0])
    assert loaded.cfg == model.cfg


def test_extended_model_round_trips_with_its_extension(tmp_path):
    model = Transformer(preset("tiny"))
    model.extended(ContextExtension(rule="yarn", factor=4.0, original_max_seq_len=64, block_size=256,
                                    attention_factor=1.2))
    path = save_model(model, tmp_path / "m.pt")
    cfg = load_config(path)
    assert (cfg.pe.rope.scaling, cfg.pe.rope.factor, cfg.pe.rope.attention_factor) == ("yarn", 4.0, 1.2)
    assert cfg.block_size == 256
    idx_BT = _tokens(66, 1, 40, seed=9)
    assert torch.equal(load_model(path).eval()(idx_BT)[0], model.eval()(idx_BT)[0])


def test_load_rejects_foreign_files(tmp_path):
    torch.save({"weights": torch.zeros(1)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a phaselab.model/1 checkpoint"):
        load_model(tmp_path / "x.pt")


def test_dropout_only_in_train_mode():
    model = Transformer(preset("jsb-6l256", **SHRINK["jsb-6l256"]))
    idx_BT = _tokens(90, 1, 8)
    model.eval()
    assert torch.equal(model(idx_BT)[0], model(idx_BT)[0])
    model.train()
    assert not torch.equal(model(idx_BT)[0], model(idx_BT)[0])


def test_num_params_counts_tied_embedding_once():
    model = Transformer(preset("tiny"))
    C, V = 128, 66
    per_layer = 4 * C * C + 2 * C * 4 * C + 2 * C  # q, k, v, proj; MLP in/out; two RMSNorms
    assert model.num_params() == V * C + 2 * per_layer + C
    assert model.num_params(exclude_embeddings=True) == 2 * per_layer + C
    untied = Transformer(preset("tiny", tie_embeddings=False))
    assert untied.num_params() == model.num_params() + V * C


@pytest.mark.gpu
@pytest.mark.parametrize("kind,backend", [("rope", "sdpa"), ("pope", "sdpa"), ("pope", "reference"),
                                          ("tapa", "reference"), ("alibi", "reference")])
def test_cuda_bf16_autocast_step_matches_cpu_fp32(kind, backend):
    torch.manual_seed(0)
    cfg = preset("tiny", n_kv_head=2, attention={"backend": backend},
                 pe={"kind": kind, "pope": {"delta_init": "uniform"}})
    cpu = Transformer(cfg)
    gpu = Transformer(cfg).cuda()
    gpu.load_state_dict(cpu.state_dict())
    idx_BT = _tokens(66, 4, 64, seed=10)
    _, loss_cpu = cpu(idx_BT, targets_BT=torch.roll(idx_BT, -1, 1))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, loss = gpu(idx_BT.cuda(), targets_BT=torch.roll(idx_BT, -1, 1).cuda())
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert abs(float(loss.detach()) / float(loss_cpu.detach()) - 1) < 0.01
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in gpu.parameters())
    pe = gpu.h[0].attn.pe
    if kind in ("rope", "pope"):
        assert pe.inv_freq.device.type == "cuda" and pe.inv_freq.dtype == torch.float32
    assert any(c.device_type == "cuda" and c.dtype == torch.bfloat16 for c in gpu.h[0].attn._checked_calls)


@pytest.mark.gpu
def test_cuda_deterministic_sdpa_training_call_is_refused():
    """On CUDA with grads, sdpa cannot promise determinism (MATH §7.8): a model built for CUDA is
    refused at build; one built for the host and moved is refused at its first training call."""
    cfg = preset("tiny", attention={"backend": "sdpa", "deterministic": True})
    with pytest.raises(BackendUnsupported, match="deterministic"):
        Transformer(cfg)   # device_type defaults to "cuda" on a GPU host
    model = Transformer(cfg, device_type="cpu").cuda()
    idx_BT = _tokens(66, 1, 8).cuda()
    with torch.no_grad():
        model(idx_BT)  # inference is deterministic: accepted
    with pytest.raises(BackendUnsupported, match="deterministic"):
        model(idx_BT, targets_BT=idx_BT)


@pytest.mark.parametrize("kind", ["rope", "pope", "tapa"])
def test_model_fits_a_fixed_batch(kind):
    """Gradients flow through every encoding: 40 AdamW steps memorise one small batch."""
    torch.manual_seed(0)
    model = Transformer(preset("tiny", n_layer=1, d_model=64, pe={"kind": kind}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx_BT = _tokens(66, 4, 16, seed=11)
    targets_BT = torch.roll(idx_BT, -1, 1)
    losses = []
    for _ in range(40):
        _, loss = model(idx_BT, targets_BT=targets_BT)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.after_optimizer_step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.3 * losses[0], losses[::8]


def test_default_positions_declare_trivial_pos_to_the_backend():
    """forward without pos_BT passes trivial_pos=True (sdpa then takes is_causal with no device
    sync and no graph break under torch.compile); explicit positions do not, and both give
    the same logits."""
    model = Transformer(preset("tiny", pe={"kind": "rope"}, attention={"backend": "sdpa"}))
    seen = []
    attn = model.h[0].attn
    backend = attn.backend
    attn.backend = lambda *a, **kw: seen.append(kw["trivial_pos"]) or backend(*a, **kw)
    idx = _tokens(model.cfg.vocab_size, 2, 8)
    default = model(idx)[0]
    given = model(idx, pos_BT=torch.arange(8).expand(2, 8))[0]
    assert seen == [True, False]
    torch.testing.assert_close(default, given, rtol=0, atol=0)


@pytest.mark.parametrize("deterministic", [False, True])
def test_attention_deterministic_reaches_the_backend(deterministic):
    """attention.deterministic is passed on every call: the triton backend takes PoPE's
    non-deterministic cuDNN core only when it is False (kernels/pope/cudnn.py)."""
    model = Transformer(preset("tiny", pe={"kind": "pope"}, attention={"backend": "reference",
                                                                      "deterministic": deterministic}))
    seen = []
    attn = model.h[0].attn
    backend = attn.backend
    attn.backend = lambda *a, **kw: seen.append(kw["deterministic"]) or backend(*a, **kw)
    model(_tokens(model.cfg.vocab_size, 2, 8))
    assert seen == [deterministic]


@pytest.mark.parametrize("kwargs,match", [
    ({"rule": "pi", "factor": float("inf"), "original_max_seq_len": 64}, "factor=inf must be a finite number"),
    ({"rule": "pi", "factor": 2.0, "original_max_seq_len": 0}, "original_max_seq_len=0 must be a positive int"),
    ({"rule": "yarn", "factor": 2.0, "original_max_seq_len": 64, "attention_factor": float("nan")},
     "attention_factor=nan must be finite"),
    ({"rule": "yarn", "factor": 2.0, "original_max_seq_len": 64, "attention_factor": 0.0},
     "attention_factor=0.0 must be finite and > 0"),
])
def test_context_extension_rejects_non_finite_and_empty_values(kwargs, match):
    """Caught where the extension is built (a grid's `extend`, `phaselab eval ... extend.factor=8`), not later
    inside the rotary kernel with a message that names no setting."""
    with pytest.raises(ValueError, match=match):
        ContextExtension(**kwargs)
