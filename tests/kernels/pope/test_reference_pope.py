"""PoPE properties at the kernel level (MATH.md §3.6) and ScoreMod validation for pope."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from phaselab.kernels.attention import reference as R
from phaselab.kernels.common.score_mod import ScoreMod, pope_inv_freq
from phaselab.kernels.pope import reference as P
from phaselab.kernels.rotary.scaling import default_inv_freq
from phaselab.kernels.testing import assert_close, generator, shape_id

F64 = torch.float64


def _rand(*shape, dtype=torch.float32, seed=42):
    return torch.randn(*shape, generator=generator(seed), dtype=F64).to(dtype)


def _delta(H, D, seed=7, dtype=torch.float32):
    return (-2 * math.pi * torch.rand(H, D, generator=generator(seed), dtype=F64)).to(dtype)


def _pope(D, delta=None, amplitude="softplus"):
    return ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(D), "delta": delta, "amplitude": amplitude})


def _scores(q, k, pos_q, pos_k, mod, dtype=torch.float32):
    return R.scores(q, k, pos_q_BT=pos_q, pos_k_BS=pos_k, score_mod=mod, compute_dtype=dtype)


@pytest.mark.parametrize("c,dtype,ratio", [(5, torch.float32, 1e-5), (1000, torch.float32, 1e-4),
                                           (2**16 + 3, F64, 1e-10)], ids=["c5-fp32", "c1000-fp32", "c65539-fp64"])
def test_relative_property_shift_invariance(c, dtype, ratio):
    q, k = _rand(2, 3, 6, 16, dtype=dtype, seed=1), _rand(2, 3, 9, 16, dtype=dtype, seed=2)
    pos_q, pos_k = torch.arange(6)[None] + 20, torch.arange(9)[None] + 17
    mod = _pope(16, _delta(3, 16, dtype=dtype))
    base = _scores(q, k, pos_q, pos_k, mod, dtype)
    assert_close(f"pope-shift-{c}", base, _scores(q, k, pos_q + c, pos_k + c, mod, dtype), ratio)
    assert (base - _scores(q, k, pos_q + 1, pos_k, mod, dtype)).abs().max() > 1e-2  # positions matter


def test_factorisation_ratio_independent_of_content():
    D = 12
    inv_freq = pope_inv_freq(D)
    delta = _delta(1, D, dtype=F64)
    ratios = []
    for seed in (1, 2, 3):  # three different contents
        # the same key vector at both key positions: only the offset differs between the terms
        q, k = _rand(1, 1, 1, D, dtype=F64, seed=seed), _rand(1, 1, 1, D, dtype=F64, seed=seed + 10).expand(1, 1, 2, D)
        q_hat, k_hat = P.pope_expand(q, k, pos_q_BT=torch.tensor([[40]]), pos_k_BS=torch.tensor([[3, 31]]),
                                     inv_freq_D=inv_freq, delta_HD=delta)
        terms = (q_hat * k_hat).unflatten(-1, (2, D)).sum(-2)  # per-component term, concat layout
        ratios.append(terms[0, 0, 0] / terms[0, 0, 1])  # offset -37 vs offset -9
    assert_close("factorisation", ratios[0], ratios[1], 1e-10)
    assert_close("factorisation", ratios[0], ratios[2], 1e-10)
    g = torch.cos(torch.tensor([-37.0, -9.0], dtype=F64)[:, None] * inv_freq.double() + delta[0])
    assert_close("g_c", g[0] / g[1], ratios[0], 1e-10)


@pytest.mark.parametrize("layout", ["concat", "interleaved"])
@pytest.mark.parametrize("dims", [{"B": 2, "H": 4, "G": 2, "T": 63, "D": 60}, {"B": 1, "H": 2, "G": 1, "T": 17, "D": 48}],
                         ids=lambda d: shape_id(**d))
def test_cartesian_equals_polar(layout, dims):
    B, H, G, T, D = dims.values()
    q, k = _rand(B, H, T, D, seed=1), _rand(B, G, T, D, seed=2)
    pos_q = torch.randint(0, 4000, (B, T), generator=generator(3))
    pos_k = torch.randint(0, 4000, (B, T), generator=generator(4))
    delta = _delta(H, D)
    q_hat, k_hat = P.pope_expand(q, k, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=pope_inv_freq(D),
                                 delta_HD=delta, layout=layout)
    cart = q_hat.double() @ R.repeat_kv(k_hat, H).double().transpose(-1, -2)
    # polar form in float64: sum_c mu_q mu_k cos((n - m) theta_c + delta_hc)
    mu_q, mu_k = F.softplus(q.double()), R.repeat_kv(F.softplus(k.double()), H)
    dpos = (pos_k[:, None, :] - pos_q[:, :, None]).double()  # [B, T, S] = n - m
    phase = dpos[:, None, :, :, None] * pope_inv_freq(D).double() + delta.double()[None, :, None, None, :]
    polar = (mu_q[:, :, :, None, :] * mu_k[:, :, None, :, :] * torch.cos(phase)).sum(-1)
    # fp32 m*theta and n*theta carry up to ulp(4096)/2 ~ 2.4e-4 rad each (MATH §7.4)
    assert_close(f"cartesian-{layout}", polar, cart, 1e-4)
    assert_close("scores-vs-polar", polar, _scores(q, k, pos_q, pos_k, _pope(D, delta)), 1e-4)
    # with the angles in float64 the two forms agree to float64 rounding
    q_hat, k_hat = P.pope_expand(q.double(), k.double(), pos_q_BT=pos_q, pos_k_BS=pos_k,
                                 inv_freq_D=pope_inv_freq(D), delta_HD=delta, layout=layout)
    assert_close(f"cartesian-{layout}-fp64", polar, q_hat @ R.repeat_kv(k_hat, H).transpose(-1, -2), 1e-12)


def test_delta_placement_periodicity_and_zero():
    q, k = _rand(1, 2, 5, 8, seed=1), _rand(1, 2, 7, 8, seed=2)
    pos_q, pos_k = torch.arange(5)[None] + 2, torch.arange(7)[None]
    delta = _delta(2, 8)
    key_side = _scores(q, k, pos_q, pos_k, _pope(8, delta))
    q_hat, k_hat = P.pope_expand(q, k, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=pope_inv_freq(8),
                                 delta_HD=delta)  # query-side -delta
    assert_close("query-side", key_side, q_hat @ k_hat.transpose(-1, -2), 1e-6)
    assert_close("period-2pi", key_side, _scores(q, k, pos_q, pos_k, _pope(8, delta + 2 * math.pi)), 1e-6)
    no_delta = _scores(q, k, pos_q, pos_k, _pope(8, None))
    assert torch.equal(no_delta, _scores(q, k, pos_q, pos_k, _pope(8, torch.zeros(2, 8))))
    assert (no_delta - key_side).abs().max() > 1e-2


def test_even_components_are_rope_frequencies():
    for D, base in ((64, 1e4), (60, 5e5), (8, 10.0)):
        assert torch.equal(pope_inv_freq(D, base)[0::2], default_inv_freq(D, base))
        assert pope_inv_freq(D, base).dtype == torch.float32
    want = torch.tensor([1e4 ** (-c / 64) for c in range(64)], dtype=F64)
    assert_close("theta_c", want, pope_inv_freq(64), 1e-7)
    assert abs(2 * math.pi / pope_inv_freq(64)[-1].item() - 54.4e3) < 0.1e3  # MATH §3.1: ~54.4k tokens


def test_softplus_matches_torch_including_above_threshold():
    x = torch.cat([torch.linspace(-120, 120, 20001), torch.tensor([19.999, 20.0, 20.0001, 20.5, 88.0, -88.0])])
    x.requires_grad_(True)
    ours = P.softplus_fp32(x)
    torch_ref = F.softplus(x, beta=1.0, threshold=20.0)
    # the same log1p(exp(x)) formula; vectorised vs scalar log1p may differ by an ulp or two
    ulp = torch.nextafter(torch_ref, torch.tensor(float("inf"))) - torch_ref
    assert bool(((ours - torch_ref).abs() <= 2 * ulp).all())
    assert torch.equal(ours[x > 20], x[x > 20])
    (grad,) = torch.autograd.grad(ours.sum(), x)
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[x > 20], torch.ones_like(grad[x > 20]))
    assert_close("softplus-grad", torch.sigmoid(x.detach().double())[x <= 20], grad[x <= 20], 1e-6)


def test_bound_by_product_of_magnitudes():
    q, k = _rand(2, 3, 9, 16, seed=1), _rand(2, 3, 11, 16, seed=2)
    pos_q, pos_k = torch.arange(9)[None] + 30, torch.arange(11)[None]
    a = _scores(q, k, pos_q, pos_k, _pope(16, _delta(3, 16)))
    bound = F.softplus(q) @ F.softplus(k).transpose(-1, -2)
    assert bool((a.abs() <= bound * (1 + 1e-6)).all())
    assert (a.abs() / bound).max() > 0.5  # the bound is not vacuous


def test_scoremod_validation_names_the_value():
    with pytest.raises(ValueError, match="'sigmoid'"):
        _pope(8, amplitude="sigmoid")
    with pytest.raises(ValueError, match="inv_freq"):
        ScoreMod(kind="pope", params={"delta": None})
    with pytest.raises(ValueError, match="'freq'"):
        ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(8), "freq": 1})
    with pytest.raises(TypeError, match="int64"):
        ScoreMod(kind="pope", params={"inv_freq": torch.arange(8)})
    with pytest.raises(ValueError, match=r"\[H, D\]"):
        _pope(8, torch.zeros(2, 6))
    with pytest.raises(ValueError, match="'rope'"):
        ScoreMod(kind="rope", params={})  # type: ignore[arg-type]
    mod = _pope(8)
    assert mod.params["amplitude"] == "softplus" and mod.params["delta"] is None
    with pytest.raises(TypeError):
        mod.params["amplitude"] = "relu"  # type: ignore[index]


def test_scoremod_survives_pickle_and_deepcopy():
    import copy
    import pickle

    mod = _pope(8, _delta(2, 8))
    q, k = _rand(1, 2, 3, 8, seed=1), _rand(1, 2, 3, 8, seed=2)
    pos = torch.arange(3)[None]

    def logits(m):
        return R.logits(q, k, pos_q_BT=pos, pos_k_BS=pos, scale=1.0, score_mod=m)

    for clone in (pickle.loads(pickle.dumps(mod)), copy.deepcopy(mod)):
        assert clone.kind == "pope" and dict(clone.params).keys() == dict(mod.params).keys()
        assert torch.equal(logits(clone), logits(mod))
