"""Which kernels `tapa_attention` runs (kernels/tapa/function.py `core`): the Gluon Hopper ones only
for declared index positions where they run, the `tl` ones elsewhere or when told, with the reason
when flash_impl="gluon" cannot be honoured, and the choice recorded as the run's provenance."""

from __future__ import annotations

import pytest
import torch

from phaselab.kernels.common.options import AttentionOptions, options_used, reset_options
from phaselab.kernels.flash import gluon_common
from phaselab.kernels.tapa import function, gluon_tapa_host


def _qkv(T: int = 8, S: int = 8, D: int = 64):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(1, 2, T, D, generator=gen), torch.randn(1, 1, S, D, generator=gen),
            torch.randn(1, 1, S, D, generator=gen))


def test_core_needs_declared_index_positions_and_a_hopper():
    q, k, v = _qkv()
    auto, gluon, tl = AttentionOptions(), AttentionOptions(flash_impl="gluon"), AttentionOptions(flash_impl="tl")
    assert function.core(q, k, v, True, 0.5, 1.0, auto) == "tl"       # CPU: no Gluon here
    assert function.core(q, k, v, False, 0.5, 1.0, auto) == "tl"
    with pytest.raises(ValueError, match="flash_impl='gluon': positions not declared trivial"):
        function.core(q, k, v, False, 0.5, 1.0, gluon)
    with pytest.raises(ValueError, match="flash_impl='gluon': dtype torch.float32"):
        function.core(q, k, v, True, 0.5, 1.0, gluon)
    with pytest.raises(ValueError, match="flash_impl='gluon': (TRITON_INTERPRET|device cpu|gluon unavailable)"):
        function.core(*(t.bfloat16() for t in (q, k, v)), True, 0.5, 1.0, gluon)
    assert function.core(q, k, v, True, 0.5, 1.0, tl) == "tl"


def test_core_on_a_hopper_takes_gluon_where_it_runs(monkeypatch):
    """With the Gluon kernels' checks passing (as on an H200): index positions with T == S take
    them; T != S, theta != 0.5 or flash_impl="tl" keep the `tl` kernels."""
    monkeypatch.setattr(gluon_common, "supported", lambda *a, **kw: None)
    q, k, v = _qkv()
    auto = AttentionOptions()
    assert function.core(q, k, v, True, 0.5, 1.0, auto) == "gluon"
    assert function.core(q, k, v, True, 0.5, 1.0, AttentionOptions(flash_impl="tl")) == "tl"
    assert function.core(q, k, v, True, 0.25, 1.0, auto) == "tl"      # D_A = 16 of 64: not the halves
    with pytest.raises(ValueError, match="theta=0.25"):
        function.core(q, k, v, True, 0.25, 1.0, AttentionOptions(flash_impl="gluon"))
    q_short, k_long, v_long = _qkv(T=4, S=8)
    assert function.core(q_short, k_long, v_long, True, 0.5, 1.0, auto) == "tl"


def test_tapa_attention_records_the_core_it_ran():
    q, k, v = _qkv()
    pos = torch.arange(8)[None]
    reset_options()
    out = function.tapa_attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, trivial_pos=True)
    assert torch.isfinite(out).all() and out.shape == q.shape
    assert options_used()["tapa"]["core"] == "tl"


def test_validated_calls_are_kept_and_bad_ones_still_refused(monkeypatch):
    """`function.validate` keeps what its checks concluded by the call's facts: a call like a
    validated one takes the kept result without running the checks, and one that differs in a
    type, a dtype, a shape or a scalar is checked, and refused where bad, however many good ones
    came before it."""
    monkeypatch.setattr(function, "_VALIDATED", {})
    q, k, v = _qkv()
    pos = torch.arange(8)[None]
    good = function.validate(q, k, v, pos, pos, 0.1, 0.5, 6.0, "quadratic", 1.0)
    assert good[1:] == (32, 1.0) and good[0]["alpha"] == 0.1 and len(function._VALIDATED) == 1
    checked = []
    with monkeypatch.context() as patch:
        patch.setattr(function, "check_qkv", lambda *a: checked.append(a) or a)
        assert function.validate(*_qkv(), pos, pos, 0.1, 0.5, 6.0, "quadratic", 1.0) is good and not checked
    bad = [((q, k, v, pos, pos, 0.1, 0.5, 6.0, "quadratic", True), "scale=True"),
           ((q, k, v, pos.float(), pos, 0.1, 0.5, 6.0, "quadratic", 1.0), "never float"),
           ((q, k, v, pos[:, :4], pos, 0.1, 0.5, 6.0, "quadratic", 1.0), "pos_q_BT has shape"),
           ((q, k, v, pos, pos, -0.1, 0.5, 6.0, "quadratic", 1.0), "alpha"),
           ((q, k, v, pos, pos, 0.1, 0.001, 6.0, "quadratic", 1.0), "D_A=0"),
           ((q, k, v, pos, pos, 0.1, 0.5, 6.0, "cubic", 1.0), "phase"),
           ((q, k.double(), v, pos, pos, 0.1, 0.5, 6.0, "quadratic", 1.0), "dtype"),
           ((q, k, v[..., :32], pos, pos, 0.1, 0.5, 6.0, "quadratic", 1.0), "must be"),
           ((q.numpy(), k, v, pos, pos, 0.1, 0.5, 6.0, "quadratic", 1.0), "torch.Tensor"),
           ((q, k, v, pos, pos, torch.tensor(0.1), 0.5, 6.0, "quadratic", 1.0), "alpha")]
    for args, match in bad:
        with pytest.raises((TypeError, ValueError), match=match):
            function.validate(*args)
    assert len(function._VALIDATED) == 1
    numpy_alpha = torch.tensor([0.1], dtype=torch.float64).numpy()[0]   # a float subclass: checked, never kept
    assert function.validate(q, k, v, pos, pos, numpy_alpha, 0.5, 6.0, "quadratic", 1.0)[0]["alpha"] == 0.1
    assert function._facts(q, k, v, pos, pos, numpy_alpha, 0.5, 6.0, "quadratic", 1.0) is None


@pytest.mark.gpu
@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_gluon_core_matches_the_tl_core_through_the_wrapper(phase):
    """On an sm_90 GPU: `tapa_attention` with declared index positions runs the Gluon kernels and
    gives the `tl` kernels' output and gradients (bf16 inputs, fp32 comparison, GQA, ragged T)."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("needs an sm_90 GPU")
    gen = torch.Generator(device="cuda").manual_seed(1)
    B, H, G, T, D = 2, 4, 2, 333, 128
    leaves = [torch.randn(B, n, T, D, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()
              for n in (H, G, G)]
    pos = torch.arange(T, device="cuda")[None].expand(B, T)
    do = torch.randn(B, H, T, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    results = {}
    for impl in ("tl", "auto"):
        reset_options()
        out = function.tapa_attention(*leaves, pos_q_BT=pos, pos_k_BS=pos, phase=phase, trivial_pos=True,
                                      options=AttentionOptions(flash_impl=impl))
        results[impl] = (out, *torch.autograd.grad(out, leaves, do))
        results[impl + "-core"] = options_used()["tapa"]["core"]
        results[impl + "-variants"] = options_used()["tapa"].get("variants")
    assert (results["tl-core"], results["auto-core"]) == ("tl", "gluon")
    assert results["auto-variants"] == sorted(gluon_tapa_host.DEFAULT_VARIANTS[D]) and results["tl-variants"] is None
    for name, a, b in zip(("out", "dq", "dk", "dv"), results["tl"], results["auto"]):
        a, b = a.float(), b.float()
        rel = (a - b).norm() / a.norm()
        assert torch.isfinite(b).all() and rel < 2e-2, f"{name}: relative difference {rel:.3g}"
