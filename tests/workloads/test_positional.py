"""Per-layer positional encodings at the model seam (DESIGN §3.1, MATH §1-§5 properties)."""

from __future__ import annotations

import math

import pytest
import torch

from phaselab.kernels.attention import reference
from phaselab.workloads.models import ContextExtension, preset
from phaselab.workloads.models.positional import TAPA, ALiBi, NoPE, PoPE, RoPE
from phaselab.workloads.models.positional.pope import DELTA_MAX, DELTA_MIN
from phaselab.workloads.models.transformer import Transformer

KINDS = ["none", "rope", "pope", "tapa", "alibi", "sinusoidal", "learned"]


def _model(kind: str, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    pe = {"kind": kind, **overrides.pop("pe", {})}
    return Transformer(preset("tiny", pe=pe, **overrides)).eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("kind", KINDS)
def test_each_layer_builds_its_own_pe_module(kind):
    model = _model(kind, pe={"pope": {"delta_init": "uniform"}})
    pes = [block.attn.pe for block in model.h]
    assert len({id(pe) for pe in pes}) == len(pes)
    expected = {"none": NoPE, "sinusoidal": NoPE, "learned": NoPE, "rope": RoPE, "pope": PoPE,
                "tapa": TAPA, "alibi": ALiBi}[kind]
    assert all(isinstance(pe, expected) for pe in pes)
    if kind == "pope":
        names = [n for n, _ in model.named_parameters() if n.endswith("pe.delta")]
        assert names == ["h.0.attn.pe.delta", "h.1.attn.pe.delta"]
        assert pes[0].delta.data_ptr() != pes[1].delta.data_ptr()
        assert not torch.equal(pes[0].delta, pes[1].delta)  # independently drawn


def _layer0_qk(model: Transformer, idx_BT: torch.Tensor):
    block = model.h[0]
    return block.attn.project_qkv(block.ln_1(model.wte(idx_BT)))[:2]


@pytest.mark.parametrize("kind", ["rope", "pope", "tapa", "alibi"])
def test_layer_scores_are_shift_invariant(kind):
    """score(q at m, k at n) == score(q at m+c, k at n+c) for large c (MATH §1.5, §3.6, §4.6)."""
    model = _model(kind, pe={"pope": {"delta_init": "uniform"}})
    idx_BT = torch.randint(0, 66, (1, 12), generator=torch.Generator().manual_seed(1))
    q_BTHD, k_BTGD = _layer0_qk(model, idx_BT)
    pe = model.h[0].attn.pe

    def logits(offset: int) -> torch.Tensor:
        pos_BT = torch.arange(12)[None] + offset
        q, k = pe.prepare_qk(q_BTHD, k_BTGD, pos_BT, pos_BT)
        return reference.logits(q.transpose(1, 2), k.transpose(1, 2), pos_q_BT=pos_BT, pos_k_BS=pos_BT,
                                scale=pe.softmax_scale(32), score_mod=pe.score_mod())

    base = logits(0)
    # fp32 angles m*θ carry an absolute error ~ulp(m)/2 (4e-3 rad at m = 2^16, MATH §7.4)
    for offset, tol in ((1, 1e-5), (1000, 1e-5), (2 ** 16, 1e-3)):
        assert _rel(logits(offset), base) < tol, offset


@pytest.mark.parametrize("kind", ["none", "rope", "pope", "tapa", "alibi"])
def test_model_logits_are_shift_invariant_for_relative_encodings(kind):
    model = _model(kind, pe={"pope": {"delta_init": "uniform"}})
    idx_BT = torch.randint(0, 66, (2, 16), generator=torch.Generator().manual_seed(2))
    base, _ = model(idx_BT)
    shifted, _ = model(idx_BT, pos_BT=torch.arange(16).expand(2, 16) + 4096)
    assert _rel(shifted, base) < 1e-5


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_absolute_encodings_are_not_shift_invariant(kind):
    model = _model(kind)
    idx_BT = torch.randint(0, 66, (1, 16), generator=torch.Generator().manual_seed(3))
    base, _ = model(idx_BT)
    shifted, _ = model(idx_BT, pos_BT=torch.arange(16)[None] + 8)
    assert _rel(shifted, base) > 1e-3


def test_sinusoidal_values_match_vaswani_formula():
    model = _model("sinusoidal")
    pos_BT = torch.tensor([[0, 1, 7, 1000]])
    pe_BTC = model.input_pe(pos_BT).double()
    C = model.cfg.d_model
    p = pos_BT.double()[..., None]
    j = torch.arange(C // 2, dtype=torch.float64)
    angle = p / 10000 ** (2 * j / C)
    # fp32 angles: absolute error ~ p * 2^-24 (6e-5 rad at p = 1000)
    assert _rel(pe_BTC[..., 0::2], angle.sin()) < 2e-5
    assert _rel(pe_BTC[..., 1::2], angle.cos()) < 2e-5


def test_learned_positions_beyond_max_len_raise():
    model = _model("learned", block_size=16)
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"learned positions cover \[0, 16\)"):
        model(torch.zeros(1, 4, dtype=torch.long), pos_BT=torch.tensor([[13, 14, 15, 16]]))
    with pytest.raises(ValueError, match="exceeds"):
        model.extended(ContextExtension(block_size=32))


def test_float_positions_are_rejected():
    model = _model("rope")
    with pytest.raises(TypeError, match="int64"):
        model(torch.zeros(1, 4, dtype=torch.long), pos_BT=torch.arange(4.0)[None])


def test_yarn_softmax_scale_matches_math_worked_numbers():
    # MATH §2.4 table: D=64, b=1e4, L=1024: s=4 -> 1/t = 1.296477, s=10 -> 1.513536
    for factor, logit_factor in ((4.0, 1.296477), (10.0, 1.513536)):
        model = _model("rope", n_head=2)  # head_dim 64
        model.extended(ContextExtension(rule="yarn", factor=factor, original_max_seq_len=1024))
        scale = model.h[0].attn.pe.softmax_scale(64)
        assert abs(scale * math.sqrt(64) - logit_factor) < 1e-6
    explicit = _model("rope", n_head=2)
    explicit.extended(ContextExtension(rule="yarn", factor=4.0, original_max_seq_len=1024,
                                       attention_factor=1.5))
    assert abs(explicit.h[0].attn.pe.softmax_scale(64) - 1.5 ** 2 / 8) < 1e-12
    assert explicit.cfg.pe.rope.attention_factor == 1.5


def test_pi_extension_equals_rope_at_scaled_positions():
    """PI at s applied at position p equals plain RoPE at p/s (MATH §2.5), through the model."""
    plain = _model("rope")
    pi = _model("rope")
    pi.extended(ContextExtension(rule="pi", factor=2.0, original_max_seq_len=64, block_size=128))
    assert pi.cfg.block_size == 128 and pi.cfg.pe.rope.scaling == "pi"
    idx_BT = torch.randint(0, 66, (2, 10), generator=torch.Generator().manual_seed(4))
    out_plain, _ = plain(idx_BT)
    out_pi, _ = pi(idx_BT, pos_BT=2 * torch.arange(10).expand(2, 10))
    assert _rel(out_pi, out_plain) < 1e-6
    out_pi_default, _ = pi(idx_BT)
    assert _rel(out_pi_default, out_plain) > 1e-4  # the extension did change the model


def test_dynamic_ntk_is_plain_rope_up_to_original_length_then_differs():
    plain = _model("rope")
    dyn = _model("rope")
    dyn.extended(ContextExtension(rule="dynamic_ntk", factor=4.0, original_max_seq_len=16))
    idx_BT = torch.randint(0, 66, (1, 24), generator=torch.Generator().manual_seed(5))
    assert torch.equal(dyn(idx_BT[:, :16])[0], plain(idx_BT[:, :16])[0])
    assert _rel(dyn(idx_BT)[0][:, :16], plain(idx_BT)[0][:, :16]) > 1e-4


@pytest.mark.parametrize("kind", ["pope", "tapa", "alibi", "none", "sinusoidal"])
def test_non_rope_encodings_accept_only_no_interpolation(kind):
    model = _model(kind, pe={"pope": {"delta_init": "uniform"}})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pes = [b.attn.pe for b in model.h]
    model.extended(ContextExtension(block_size=256))
    assert [b.attn.pe for b in model.h] == pes  # unchanged modules: δ kept
    assert model.cfg.block_size == 256
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="no RoPE frequencies"):
        model.extended(ContextExtension(rule="yarn", factor=4.0, original_max_seq_len=64))
    with pytest.raises(ValueError, match="no RoPE frequencies"):
        model.extended(ContextExtension(base=2e8))


def test_rope_base_change_extension_keeps_weights():
    model = _model("rope")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.extended(ContextExtension(base=2e8, block_size=128))
    assert model.cfg.pe.rope.base == 2e8 and model.cfg.pe.rope.scaling == "none"
    assert model.h[0].attn.pe.inv_freq[-1] < 1e-6  # slow end of a 2e8 base
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_pope_delta_init_and_learn_delta_switch():
    uni = _model("pope", pe={"pope": {"delta_init": "uniform"}})
    for block in uni.h:
        d = block.attn.pe.delta
        assert d.shape == (4, 32) and d.min() >= DELTA_MIN and d.max() <= DELTA_MAX
        assert d.std() > 1.0  # U(-2π, 0) has std 2π/sqrt(12) ≈ 1.81
    zero = _model("pope", pe={"pope": {"delta_init": "zero"}})
    assert all(torch.count_nonzero(b.attn.pe.delta) == 0 for b in zero.h)
    fixed = _model("pope", pe={"pope": {"learn_delta": False}})
    assert not any(n.endswith("delta") for n, _ in fixed.named_parameters())
    assert fixed.h[0].attn.pe.score_mod().params["delta"] is None
    # δ ≡ 0 reproduces the "without δ" ablation (MATH §3.6)
    zero_fixed = _model("pope", pe={"pope": {"learn_delta": False}})
    zero_fixed.load_state_dict({k: v for k, v in zero.state_dict().items()}, strict=False)
    idx_BT = torch.randint(0, 66, (1, 8))
    assert torch.allclose(zero_fixed(idx_BT)[0], zero(idx_BT)[0], rtol=0, atol=1e-6)


def test_pope_softmax_scale_options():
    pe = lambda s: _model("pope", pe={"pope": {"softmax_scale": s}}).h[0].attn.pe
    assert pe("inv_sqrt_d").softmax_scale(32) == 32 ** -0.5
    assert pe("inv_sqrt_2d").softmax_scale(32) == 64 ** -0.5
    assert pe(0.25).softmax_scale(32) == 0.25


def _push(pe: PoPE, sign: float, lr: float = 0.5) -> None:
    """One SGD step on loss = sign * δ_eff[0, 0] (sign -1 pushes δ[0, 0] up)."""
    opt = torch.optim.SGD([pe.delta], lr=lr)
    opt.zero_grad()
    (sign * pe.effective_delta()[0, 0]).backward()
    opt.step()


def test_pope_project_constraint_lets_a_pushed_component_come_back():
    """MATH §3.2/§3.6: with "project", δ stays in [-2π, 0] and a component pushed above 0 can move
    back below on a later step; a forward "clamp" freezes it (the stuck-at-boundary pitfall)."""
    proj = _model("pope", pe={"pope": {"delta_init": "zero", "delta_constraint": "project"}})
    pe = proj.h[0].attn.pe
    _push(pe, -1.0)
    assert pe.delta[0, 0] == 0.5  # the raw step went above the bound
    proj.after_optimizer_step()
    assert pe.delta[0, 0] == 0.0
    _push(pe, +1.0)
    proj.after_optimizer_step()
    assert pe.delta[0, 0] == -0.5  # came back below 0

    clamp = _model("pope", pe={"pope": {"delta_init": "zero", "delta_constraint": "clamp"}})
    pe = clamp.h[0].attn.pe
    _push(pe, -1.0)
    clamp.after_optimizer_step()  # no projection in clamp mode
    _push(pe, +1.0)
    assert pe.delta[0, 0] == 0.5 and pe.effective_delta()[0, 0] == 0.0  # stuck: zero gradient


def test_pope_clamp_mode_forward_uses_clamped_delta():
    clamp = _model("pope", pe={"pope": {"delta_constraint": "clamp"}})
    proj = _model("pope", pe={"pope": {"delta_constraint": "project"}})
    proj.load_state_dict(clamp.state_dict())
    with torch.no_grad():
        raw = torch.linspace(-9.0, 3.0, 4 * 32).view(4, 32)
        for a, b in zip(clamp.h, proj.h):
            a.attn.pe.delta.copy_(raw)
            b.attn.pe.delta.copy_(raw.clamp(DELTA_MIN, DELTA_MAX))
    idx_BT = torch.randint(0, 66, (1, 10))
    assert torch.allclose(clamp(idx_BT)[0], proj(idx_BT)[0], rtol=0, atol=1e-6)


def test_pope_projection_during_real_training_steps():
    model = _model("pope", pe={"pope": {"delta_init": "uniform"}}).train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)  # large lr: δ leaves the box every step
    g = torch.Generator().manual_seed(6)
    left_box = 0
    for _ in range(4):
        idx_BT = torch.randint(0, 66, (4, 16), generator=g)
        _, loss = model(idx_BT, targets_BT=torch.roll(idx_BT, -1, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        left_box += sum(int(((b.attn.pe.delta < DELTA_MIN) | (b.attn.pe.delta > DELTA_MAX)).sum())
                        for b in model.h)
        model.after_optimizer_step()
        for b in model.h:
            assert b.attn.pe.delta.min() >= DELTA_MIN and b.attn.pe.delta.max() <= DELTA_MAX
    assert left_box > 0


def test_tapa_scale_and_split_validation():
    model = _model("tapa")
    pe = model.h[0].attn.pe
    assert pe.softmax_scale(32) == 1.0 and (pe.d_amp, pe.d_phase) == (16, 16)
    assert pe.score_mod().params["alpha"] == 0.1
    assert math.isclose(pe.score_mod().params["phase_scale"], 2 * math.pi)
    with pytest.raises(ValueError, match="D_A=0"):
        _model("tapa", pe={"tapa": {"theta": 0.02}})  # int(0.02 * 32) = 0


def test_alibi_half_heads_and_explicit_slopes():
    pe = _model("alibi", n_head=8, d_model=128).h[0].attn.pe
    slopes = pe.slopes.tolist()
    assert slopes[:4] == [2.0 ** (-8 * j / 4) for j in (1, 2, 3, 4)] and slopes[4:] == [0.0] * 4
    explicit = _model("alibi", pe={"alibi": {"slopes": [0.5, 0.125]}}).h[0].attn.pe
    assert explicit.slopes.tolist() == [0.5, 0.125, 0.0, 0.0]
    with pytest.raises(ValueError, match="one per ALiBi head"):
        _model("alibi", pe={"alibi": {"slopes": [0.5]}})


def test_frequency_features_rope_pair_norms():
    model = _model("rope", pe={"rope": {"pairing": "half"}})
    idx_BT = torch.randint(0, 66, (2, 12), generator=torch.Generator().manual_seed(7))
    feats = model.frequency_features(idx_BT)
    assert len(feats) == 2 and set(feats[0]) == {"freq_F", "q_HF", "k_GF"}
    q_BTHD, k_BTGD = (t.double() for t in _layer0_qk(model, idx_BT))
    want_q = torch.sqrt(q_BTHD[..., :16] ** 2 + q_BTHD[..., 16:] ** 2).mean(dim=(0, 1))
    want_k = torch.sqrt(k_BTGD[..., :16] ** 2 + k_BTGD[..., 16:] ** 2).mean(dim=(0, 1))
    assert feats[0]["q_HF"].shape == (4, 16) and _rel(feats[0]["q_HF"], want_q) < 1e-5
    assert _rel(feats[0]["k_GF"], want_k) < 1e-5
    assert feats[0]["freq_F"][0] == 1.0 and feats[0]["freq_F"][-1] < feats[0]["freq_F"][-2]


def test_frequency_features_pope_magnitudes_and_delta():
    model = _model("pope", n_kv_head=2, pe={"pope": {"delta_init": "uniform"}})
    idx_BT = torch.randint(0, 66, (2, 12), generator=torch.Generator().manual_seed(8))
    feats = model.frequency_features(idx_BT)
    q_BTHD, k_BTGD = (t.double() for t in _layer0_qk(model, idx_BT))
    assert feats[0]["q_HF"].shape == (4, 32) and feats[0]["k_GF"].shape == (2, 32)
    assert _rel(feats[0]["q_HF"], torch.log1p(torch.exp(q_BTHD)).mean(dim=(0, 1))) < 1e-5
    assert _rel(feats[0]["k_GF"], torch.log1p(torch.exp(k_BTGD)).mean(dim=(0, 1))) < 1e-5
    assert torch.equal(feats[1]["delta_HD"], model.h[1].attn.pe.delta.detach())
    assert feats[0]["freq_F"].shape == (32,)
    with pytest.raises(ValueError, match="frequency_features"):
        _model("tapa").frequency_features(idx_BT)


@pytest.mark.parametrize("layout", ["concat", "interleaved"])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_pope_pre_expanded_equals_fused(layout, backend):
    """MATH §3.3: the model-side Cartesian 2D expansion gives the polar-form logits and gradients."""
    pope = {"delta_init": "uniform"}
    fused = _model("pope", n_kv_head=2, pe={"pope": pope})
    expanded = _model("pope", n_kv_head=2, attention={"backend": backend},
                      pe={"pope": {**pope, "expand": True, "layout": layout}})
    expanded.load_state_dict(fused.state_dict())
    pe = expanded.h[0].attn.pe
    assert pe.qk_width(32) == 64 and pe.score_mod() is None and expanded.h[0].attn.built_call.qk_width == 64
    idx_BT = torch.randint(0, 66, (2, 12), generator=torch.Generator().manual_seed(9))
    out_f, loss_f = fused(idx_BT, targets_BT=idx_BT)
    out_e, loss_e = expanded(idx_BT, targets_BT=idx_BT)
    assert _rel(out_e, out_f) < 1e-5
    loss_f.backward()
    loss_e.backward()
    assert _rel(expanded.h[1].attn.pe.delta.grad, fused.h[1].attn.pe.delta.grad) < 1e-4


@pytest.mark.parametrize("kind", ["rope", "pope", "alibi", "sinusoidal"])
def test_frequency_buffers_stay_fp32_under_bf16_cast(kind):
    """model.to(bf16) (or DeepSpeed's bf16 cast) must not round θ or slopes (MATH §7.1)."""
    ref = _model(kind)
    model = _model(kind).to(torch.bfloat16)
    modules = [model.input_pe] if kind == "sinusoidal" else [b.attn.pe for b in model.h]
    ref_modules = [ref.input_pe] if kind == "sinusoidal" else [b.attn.pe for b in ref.h]
    name = "slopes" if kind == "alibi" else "inv_freq"
    for m, r in zip(modules, ref_modules):
        assert getattr(m, name).dtype == torch.float32
        assert torch.equal(getattr(m, name), getattr(r, name))
    assert model.wte.weight.dtype == torch.bfloat16
    idx_BT = torch.randint(0, 66, (1, 8))
    out, _ = model(idx_BT)  # the reference backend runs bf16 inputs with fp32 compute
    assert out.dtype == torch.bfloat16 and _rel(out, ref(idx_BT)[0]) < 0.05


def test_alibi_score_in_plain_torch_matches_its_fused_form_in_float64():
    """ALiBi's `score` (the public interface, docs/EXTENDING.md) and its fused ScoreMod give the
    same attention, through the reference backend, at float64."""
    from phaselab.kernels.common.score_mod import ScoreMod

    pe = _model("alibi", pe={"alibi": {"heads_fraction": 1.0}}).h[0].attn.pe
    H, T, D = pe.n_head, 7, 8
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, H, T, D, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(3, 3 + T)[None].expand(2, -1)
    custom = ScoreMod(kind="custom", params={"fn": pe.score, "name": "alibi"})
    fused = reference.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D ** -0.5, score_mod=pe.score_mod(),
                                compute_dtype=torch.float64)
    plain = reference.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D ** -0.5, score_mod=custom,
                                compute_dtype=torch.float64)
    torch.testing.assert_close(plain, fused, rtol=1e-13, atol=1e-13)
    assert _rel(plain, reference.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D ** -0.5,
                                           compute_dtype=torch.float64)) > 1e-3   # the bias matters
