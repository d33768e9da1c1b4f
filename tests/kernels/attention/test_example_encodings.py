"""The example encodings outside the package (examples/encodings, docs/EXTENDING.md) against
float64 formulas of their papers, in value and gradient, through the reference backend; KERPLE and
the built-in ALiBi (distance tables) end to end through the bias-table kernel (kernels/relbias),
and how the backends route a distance table."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.utils._device  # tests/kernels/conftest.py clears its factory cache after each test

from phaselab.kernels.attention.reference import attention
from phaselab.workloads.config import from_dict
from phaselab.workloads.models.config import PEConfig

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "encodings"
H, D, T = 2, 8, 6


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _pe(kind: str, **options):
    from phaselab.workloads.models import pe_registry

    cfg = from_dict(PEConfig, {"kind": kind, "options": options})
    return pe_registry.load(kind)(cfg, n_head=H, n_kv_head=H, head_dim=D)


def _kerple_attention64(q, k, v, r1, r2):
    """softmax_causal(q·k/sqrt(D) - r1_h log(1 + r2_h |n-m|)) v in float64, loops over n, m."""
    out = torch.zeros_like(v)
    for h in range(H):
        for n in range(T):
            logits = torch.stack([q[0, h, n] @ k[0, h, m] / math.sqrt(D)
                                  - r1[h] * torch.log1p(r2[h] * abs(n - m)) for m in range(n + 1)])
            out[0, h, n] = torch.softmax(logits, 0) @ v[0, h, : n + 1]
    return out


def test_kerple_matches_its_float64_formula_in_value_and_gradient() -> None:
    torch.manual_seed(0)
    pe = _pe("phaselab_kerple:Kerple", r1_init=0.7, r2_init=1.3).double()
    with torch.no_grad():
        pe.raw_r.add_(torch.randn_like(pe.raw_r) * 0.3)   # heads differ
    q, k, v = (torch.randn(1, H, T, D, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(T)[None]
    got = attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D ** -0.5, score_mod=pe.score_mod(),
                    compute_dtype=torch.float64)
    raw = pe.raw_r.detach().clone().requires_grad_(True)
    r1, r2 = torch.nn.functional.softplus(raw)
    want = _kerple_attention64(q, k, v, r1, r2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(want)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    assert pe.raw_r.grad.abs().min() > 0
    torch.testing.assert_close(pe.raw_r.grad, raw.grad, rtol=1e-10, atol=1e-12)


def test_kerple_keeps_its_parameters_per_layer_and_refuses_a_bad_option() -> None:
    a, b = _pe("phaselab_kerple:Kerple"), _pe("phaselab_kerple:Kerple")
    assert a.raw_r.data_ptr() != b.raw_r.data_ptr()
    assert a.raw_r.dtype == torch.float32 and tuple(a.raw_r.shape) == (2, H)
    torch.testing.assert_close(torch.nn.functional.softplus(a.raw_r), torch.ones(2, H))
    with pytest.raises(ValueError, match="r1_init > 0"):
        _pe("phaselab_kerple:Kerple", r1_init=-1.0)


def test_xpos_matches_its_float64_formula_in_value_and_gradient() -> None:
    """score(n, m) = Re Σ_i q_i conj(k_i) e^{i(n-m)θ_i} ζ_i^{(n-m)/γ} (complex half-split pairs)."""
    torch.manual_seed(1)
    pe = _pe("phaselab_xpos:XPos", scale_base=8.0)
    q = torch.randn(1, T, H, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, T, H, D, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(T)[None]
    q2, k2 = pe.prepare_qk(q, k, pos, pos)
    got = torch.einsum("bthd,bshd->bhts", q2, k2)
    i = torch.arange(D // 2, dtype=torch.float64)
    theta, zeta = 10_000.0 ** (-2 * i / D), (2 * i / D + 0.4) / 1.4
    qc, kc = torch.complex(q[..., : D // 2], q[..., D // 2:]), torch.complex(k[..., : D // 2], k[..., D // 2:])
    rel = (pos[0][:, None] - pos[0][None, :]).to(torch.float64)[..., None]          # [T, S, 1]
    phase = torch.polar(zeta ** (rel / 8.0), rel * theta)                            # [T, S, D/2]
    want = torch.einsum("bthi,bshi,tsi->bhts", qc, kc.conj(), phase).real
    # fp32 frequencies and angles inside the encoding (as RoPE's), so fp32 tolerances
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    g_got = torch.autograd.grad(got.sum(), (q, k))
    g_want = torch.autograd.grad(want.sum(), (q, k))
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


def test_a_score_of_the_wrong_shape_is_refused_naming_the_encoding() -> None:
    from phaselab.kernels.common.score_mod import ScoreMod

    mod = ScoreMod(kind="custom", params={"fn": lambda s, qp, kp, h: s[..., :1], "name": "mine:Bad"})
    q = torch.randn(1, H, T, D)
    pos = torch.arange(T)[None]
    with pytest.raises(ValueError, match=r"encoding 'mine:Bad': score\(\) returned \(1, 2, 6, 1\)"):
        attention(q, q, q, pos_q_BT=pos, pos_k_BS=pos, scale=1.0, score_mod=mod)


def _kerple_score(pe):
    """KERPLE written per element (the interface's general `score` form), for the Flex path."""
    def fn(score, q_pos, k_pos, head):
        r = torch.nn.functional.softplus(pe.raw_r.to(score.dtype))
        return score - r[0][head] * torch.log1p(r[1][head] * (q_pos - k_pos).abs().to(score.dtype))
    return fn


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_a_learnable_score_through_flex_attention_matches_the_reference_in_value_and_gradient() -> None:
    """The FlexAttention path of an encoding's general `score` (eager on the CPU: the same score and
    mask functions the compiled CUDA kernel runs), value and the gradient of its own parameters."""
    from phaselab.kernels.attention.sdpa import flex_score_attention
    from phaselab.kernels.common.score_mod import ScoreMod

    torch.manual_seed(2)
    pe = _pe("phaselab_kerple:Kerple", r1_init=0.5, r2_init=2.0)
    B, G, T = 2, 1, 32   # grouped-query: H = 2 query heads on 1 kv head
    q = torch.randn(B, H, T, D)
    k, v = (torch.randn(B, G, T, D) for _ in range(2))
    pos = torch.arange(5, 5 + T)[None].expand(B, -1)
    custom = ScoreMod(kind="custom", params={"fn": _kerple_score(pe), "name": "kerple-score"})
    got = flex_score_attention(q, k, v, pos_q=pos, pos_k=pos, scale=D ** -0.5, causal=True, score_mod=custom,
                               compiled=False)
    (got * torch.linspace(-1, 1, D)).sum().backward()
    g_got, pe.raw_r.grad = pe.raw_r.grad.clone(), None
    want = attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D ** -0.5, score_mod=pe.score_mod())
    (want * torch.linspace(-1, 1, D)).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert pe.raw_r.grad.abs().min() > 0
    torch.testing.assert_close(g_got, pe.raw_r.grad, rtol=1e-4, atol=1e-4)


def _model(kind: str, backend: str, **pe):
    from phaselab.workloads.models.presets import preset
    from phaselab.workloads.models.transformer import Transformer

    torch.manual_seed(0)
    return Transformer(preset("tiny", pe={"kind": kind, **pe}, attention={"backend": backend}))


def _param_grads(model, idx):
    model.zero_grad()
    logits, _ = model(idx)
    (logits.float() * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
    return logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _triton_vs_reference(kind: str, **pe) -> dict:
    """The model on the `triton` backend (the bias-table kernel; interpreter on the CPU, CUDA on
    the GPU) against the same weights on `reference`: logits and every parameter's gradient."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fused, spec = _model(kind, "triton", **pe).to(device), _model(kind, "reference", **pe).to(device)
    spec.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 66, (1, 18), generator=torch.Generator().manual_seed(1)).to(device)
    (out, g_out), (want, g_want) = _param_grads(fused, idx), _param_grads(spec, idx)
    from phaselab.kernels.testing import assert_close

    assert_close("logits", want, out, 1e-5)
    for name, g in g_want.items():
        assert_close(name, g, g_out[name], 1e-4)
    return g_out


@pytest.mark.skipif(not torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1",
                    reason="needs CUDA or the Triton interpreter")
def test_kerple_trains_through_the_bias_table_kernel_end_to_end() -> None:
    """KERPLE's learnable r1, r2 get their gradients through the kernel's d table (no Flex)."""
    from phaselab.kernels.registry import impls_used, reset

    reset()
    grads = _triton_vs_reference("phaselab_kerple:Kerple", options={"r1_init": 0.5, "r2_init": 2.0})
    raw = [g for n, g in grads.items() if n.endswith("pe.raw_r")]
    assert raw and all(g.abs().min() > 0 for g in raw)
    assert "triton" in impls_used()["relbias"]


@pytest.mark.skipif(not torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1",
                    reason="needs CUDA or the Triton interpreter")
def test_alibi_through_the_bias_table_kernel_equals_its_previous_form() -> None:
    """The built-in ALiBi, now a fixed table, gives the numbers of the "alibi" ScoreMod (MATH §5)."""
    from phaselab.kernels.common.score_mod import ScoreMod, alibi_slopes
    from phaselab.kernels.relbias import score_mod_attention

    pe = _model("alibi", "reference", alibi={"heads_fraction": 0.5}).h[0].attn.pe
    assert pe.score_mod().kind == "relbias"
    Hm, T = pe.n_head, 21
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, Hm, T, 16, generator=gen) for _ in range(3))
    pos = torch.arange(7, 7 + T)[None]
    got = score_mod_attention(q, k, v, pe.score_mod(), pos_q=pos, pos_k=pos, scale=0.25, causal=True)
    old = ScoreMod(kind="alibi", params={"slopes": alibi_slopes(Hm, Hm // 2)})
    want = attention(q.double(), k.double(), v.double(), pos_q_BT=pos, pos_k_BS=pos, scale=0.25, score_mod=old,
                     compute_dtype=torch.float64)
    from phaselab.kernels.testing import assert_close

    assert_close("alibi", want, got, 1e-5)
    _triton_vs_reference("alibi")


def test_backends_route_a_distance_table_and_refuse_what_they_cannot_run() -> None:
    from phaselab.kernels.attention.function import TritonBackend
    from phaselab.kernels.attention.sdpa import SdpaBackend
    from phaselab.kernels.registry import AttnCall

    call = AttnCall(dtype=torch.bfloat16, device_type="cuda", head_dim=64, qk_width=64, causal=True,
                    q_shorter_than_k=False, varlen=False, score_mod="relbias", needs_grad=True,
                    deterministic=True)
    assert SdpaBackend().unsupported_reason(call) is None     # the bias-table kernel, deterministic
    assert TritonBackend().unsupported_reason(call) is None
    assert "packed documents" in SdpaBackend().unsupported_reason(dataclasses.replace(call, varlen=True))
    assert "<= 128" in SdpaBackend().unsupported_reason(dataclasses.replace(call, head_dim=256, qk_width=256))
    on_cpu = dataclasses.replace(call, device_type="cpu")
    assert "ALiBi" in SdpaBackend().unsupported_reason(on_cpu)   # an additive mask would round it
    assert SdpaBackend().unsupported_reason(dataclasses.replace(on_cpu, dtype=torch.float32)) is None
    pe = _pe("phaselab_kerple:Kerple")
    assert pe.score_mod().kind == "relbias"


def test_a_table_of_the_wrong_shape_is_refused_at_plan_time_naming_the_encoding() -> None:
    from phaselab.workloads.models import pe_registry

    class Bad(pe_registry.load("phaselab_kerple:Kerple")):
        def bias_table(self, dist, dtype):
            return super().bias_table(dist, dtype)[:1]

    cfg = from_dict(PEConfig, {"kind": "phaselab_kerple:Kerple"})
    with pytest.raises(ValueError, match=r"bias_table\(\) returned torch.float32 \(1, 7\), expected .* \(2, 7\)"):
        pe_registry._check_table(Bad(cfg, n_head=2, n_kv_head=2, head_dim=8), Bad(cfg, n_head=2, n_kv_head=2,
                                 head_dim=8).score_mod(), 2, 4, "mine:Bad")


def test_sdpa_refuses_a_custom_score_on_the_cpu_by_name() -> None:
    from phaselab.kernels.attention.sdpa import SdpaBackend
    from phaselab.kernels.registry import AttnCall

    call = AttnCall(dtype=torch.float32, device_type="cpu", head_dim=D, qk_width=D, causal=True,
                    q_shorter_than_k=False, varlen=False, score_mod="custom", needs_grad=True,
                    deterministic=False)
    assert "on the CPU use 'reference'" in SdpaBackend().unsupported_reason(call)
    on_cuda = dataclasses.replace(call, device_type="cuda", head_dim=16, qk_width=16)
    assert SdpaBackend().unsupported_reason(on_cuda) is None
    assert "head dim 8 < 16" in SdpaBackend().unsupported_reason(dataclasses.replace(call, device_type="cuda"))
    assert "cu_seqlens" in SdpaBackend().unsupported_reason(dataclasses.replace(on_cuda, varlen=True))
