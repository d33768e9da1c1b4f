"""TAPA properties at the kernel level (MATH.md §4.6) and ScoreMod validation for tapa."""

from __future__ import annotations

import math

import pytest
import torch

from phaselab.kernels.attention import reference as R
from phaselab.kernels.common.score_mod import ScoreMod, tapa_split
from phaselab.kernels.testing import assert_close, generator

F64 = torch.float64


def _rand(*shape, dtype=torch.float32, seed=42):
    return torch.randn(*shape, generator=generator(seed), dtype=F64).to(dtype)


def _tapa(**params) -> ScoreMod:
    return ScoreMod(kind="tapa", params=params)


def _scores(q, k, pos_q, pos_k, mod, dtype=torch.float32):
    return R.scores(q, k, pos_q_BT=pos_q, pos_k_BS=pos_k, score_mod=mod, compute_dtype=dtype)


def _amp(q, k, d_amp):
    return (q[..., :d_amp].double() @ k[..., :d_amp].double().transpose(-1, -2)) / math.sqrt(d_amp)


@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_relative_and_symmetric(phase):
    q, k = _rand(2, 3, 6, 16, seed=1), _rand(2, 3, 6, 16, seed=2)
    mod = _tapa(alpha=0.5, phase=phase)
    pos_q, pos_k = torch.arange(6)[None] + 40, torch.tensor([[0, 7, 13, 40, 44, 90]])
    base = _scores(q, k, pos_q, pos_k, mod, F64)
    assert_close("tapa-shift", base, _scores(q, k, pos_q + 12345, pos_k + 12345, mod, F64), 1e-12)
    # sign of m - n: swap the query's and the key's position, keep the content
    for m, n in ((40, 0), (3, 90), (7, 7), (1000, 12)):
        at = _scores(q, k, torch.tensor([[m] * 6]), torch.tensor([[n] * 6]), mod, F64)
        assert torch.equal(at, _scores(q, k, torch.tensor([[n] * 6]), torch.tensor([[m] * 6]), mod, F64))
    assert (base - _scores(q, k, pos_q + 1, pos_k, mod, F64)).abs().max() > 1e-2


@pytest.mark.parametrize("alpha", [0.1, 0.5, 2.0])
def test_diagonal_is_exactly_the_amplitude_term(alpha):
    D = 16
    q, k = _rand(1, 2, 9, D, seed=1), _rand(1, 2, 9, D, seed=2)
    pos = torch.arange(9)[None] * 1000
    a = _scores(q, k, pos, pos, _tapa(alpha=alpha), torch.float32)
    d_amp, _ = tapa_split(D, 0.5)
    amp = (q[..., :d_amp] @ k[..., :d_amp].transpose(-1, -2)) / math.sqrt(d_amp)
    assert torch.equal(torch.diagonal(a, dim1=-2, dim2=-1), torch.diagonal(amp, dim1=-2, dim2=-1))


def test_alpha_to_zero_is_content_only():
    D = 12
    q, k = _rand(1, 2, 7, D, seed=3), _rand(1, 2, 7, D, seed=4)
    pos_q, pos_k = torch.arange(7)[None] + 50, torch.tensor([[0, 3, 9, 27, 51, 53, 56]])
    a = _scores(q, k, pos_q, pos_k, _tapa(alpha=1e-9), F64)
    amp = _amp(q, k, 6)
    phi = (q[..., 6:].double() @ k[..., 6:].double().transpose(-1, -2)) / math.sqrt(6)
    off_diag = (pos_q[0][:, None] != pos_k[0][None, :])
    content_only = amp * torch.cos(2 * math.pi * phi)
    assert_close("alpha->0", content_only[..., off_diag], a[..., off_diag], 1e-7)
    assert torch.equal(a[..., ~off_diag], amp[..., ~off_diag])


@pytest.mark.parametrize("zero", ["q", "k"])
def test_zero_phase_part_gives_plain_attention_on_the_amplitude_half(zero):
    D, T = 16, 11
    q, k, v = _rand(1, 2, T, D, seed=5), _rand(1, 2, T, D, seed=6), _rand(1, 2, T, D, seed=7)
    (q if zero == "q" else k)[..., 8:] = 0.0
    pos = torch.arange(T)[None] * 37
    a = _scores(q, k, pos, pos, _tapa(alpha=0.5))
    assert_close("zero-phase-scores", _amp(q, k, 8), a, 1e-6)
    out = R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=1.0, score_mod=_tapa(alpha=0.5))
    plain = R.attention(q[..., :8], k[..., :8], v, pos_q_BT=pos, pos_k_BS=pos, scale=1 / math.sqrt(8))
    assert_close("zero-phase-attention", plain, out, 1e-6)


def test_bound_by_amplitude():
    q, k = _rand(2, 2, 13, 20, seed=8), _rand(2, 2, 13, 20, seed=9)
    pos = torch.arange(13)[None] * 3
    for phase in ("quadratic", "linear"):
        a = _scores(q, k, pos, pos, _tapa(phase=phase), F64)
        amp = _amp(q, k, 10)
        assert bool((a.abs() <= amp.abs() * (1 + 1e-12)).all())
        assert (a.abs() < 0.9 * amp.abs()).any()  # the cosine does something off the diagonal


@pytest.mark.parametrize("D,theta,split", [(128, 0.5, (64, 64)), (60, 0.3, (18, 42)), (48, 0.99, (47, 1)),
                                           (7, 0.5, (3, 4))], ids=lambda v: str(v))
def test_split_sizes(D, theta, split):
    assert tapa_split(D, theta) == split and sum(split) == D


@pytest.mark.parametrize("params,match", [
    ({"theta": 1.0}, "theta=1.0"), ({"theta": 0.0}, "theta=0.0"), ({"alpha": 0.0}, "alpha=0.0"),
    ({"alpha": -0.5}, "alpha=-0.5"), ({"phase": "cubic"}, "'cubic'"), ({"beta": 1.0}, "'beta'"),
    ({"phase_scale": float("inf")}, "phase_scale=inf"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_invalid_params_raise_naming_the_value(params, match):
    with pytest.raises(ValueError, match=match):
        _tapa(**params)


def test_theta_that_leaves_an_empty_part_raises_at_call():
    q = _rand(1, 1, 2, 16)
    with pytest.raises(ValueError, match="D_A=0"):
        _scores(q, q, torch.arange(2)[None], torch.arange(2)[None], _tapa(theta=0.05))
    with pytest.raises(ValueError, match="D_A=0"):
        tapa_split(16, 0.05)


def test_defaults_are_the_papers():
    p = _tapa().params
    assert (p["alpha"], p["theta"], p["phase_scale"], p["phase"]) == (0.1, 0.5, 2 * math.pi, "quadratic")


def test_linear_phase_closed_form():
    D, T = 10, 6
    q, k = _rand(1, 1, T, D, seed=10), _rand(1, 1, T, D, seed=11)
    pos = torch.tensor([[0, 1, 4, 9, 16, 25]])
    a = _scores(q, k, pos, pos, _tapa(phase="linear", alpha=0.7), F64)
    phi = (q[..., 5:].double().sum(-1)[..., :, None] + k[..., 5:].double().sum(-1)[..., None, :]) / math.sqrt(5)
    dist = (pos[0][:, None] - pos[0][None, :]).abs().double()
    assert_close("linear", _amp(q, k, 5) * torch.cos(2 * math.pi * dist**0.7 * phi), a, 1e-12)


def test_phase_scale_acts_inside_the_cosine_only():
    D, T = 8, 7
    q, k = _rand(1, 2, T, D, seed=12), _rand(1, 2, T, D, seed=13)
    pos = torch.arange(T)[None] * 5
    two_pi = _scores(q, k, pos, pos, _tapa(alpha=0.5), F64)
    one = _scores(q, k, pos, pos, _tapa(alpha=0.5, phase_scale=1.0), F64)
    q_scaled = q.clone().double()
    q_scaled[..., 4:] *= 2 * math.pi  # the quadratic phase is linear in q_P
    assert_close("phase-scale", two_pi, _scores(q_scaled, k.double(), pos, pos, _tapa(alpha=0.5, phase_scale=1.0),
                                                F64), 1e-12)
    assert (two_pi - one).abs().max() > 1e-2
