"""RoPE frequency-scaling rules (MATH.md §2.5), including the YaRN worked numbers of §2.4."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from phaselab.kernels.attention.reference import attention
from phaselab.kernels.rotary import scaling as S
from phaselab.kernels.rotary.reference import apply_rotary
from phaselab.kernels.testing import assert_close, generator, shape_id

# MATH §2.4 table: D, b, L, s -> low, high, mscale, 1/t
YARN_TABLE = [
    (128, 1e4, 4096, 16, 20, 46, 1.277259, 1.631390),
    (128, 1e4, 4096, 32, 20, 46, 1.346574, 1.813260),
    (64, 1e4, 1024, 4, 5, 18, 1.138629, 1.296477),
    (64, 1e4, 1024, 10, 5, 18, 1.230259, 1.513536),
    (128, 5e5, 8192, 8, 18, 35, 1.207944, 1.459129),
]


def _yarn(b, L, s, **kw) -> S.RopeConfig:
    return S.RopeConfig(base=b, scaling="yarn", factor=s, original_max_seq_len=L, **kw)


@pytest.mark.parametrize("D,b,L,s,low,high,mscale,inv_t", YARN_TABLE,
                         ids=[f"D{r[0]}-b{r[1]:g}-L{r[2]}-s{r[3]}" for r in YARN_TABLE])
def test_yarn_worked_numbers(D, b, L, s, low, high, mscale, inv_t):
    assert S.yarn_correction_range(D, b, L) == (low, high)
    _, got = S.rope_frequencies(_yarn(b, L, s), D)
    assert round(got, 6) == mscale
    assert round(got**2, 6) == inv_t
    assert got == S.yarn_mscale(s) == 0.1 * math.log(s) + 1.0


def test_yarn_fractional_bounds_of_first_row():
    low, high = S.yarn_correction_range(128, 1e4, 4096, truncate=False)
    assert (round(low, 3), round(high, 3)) == (20.944, 45.027)


@pytest.mark.parametrize("D,b,L,s", [r[:4] for r in YARN_TABLE] + [(60, 1e4, 500, 3)],
                         ids=lambda v: str(v))
def test_yarn_bands_equal_plain_and_pi_and_monotone(D, b, L, s):
    low, high = S.yarn_correction_range(D, b, L)
    inv_freq, _ = S.rope_frequencies(_yarn(b, L, s), D)
    plain, pi = S.default_inv_freq(D, b), S.pi_inv_freq(D, b, s)
    i = torch.arange(D // 2)
    assert torch.equal(inv_freq[i <= low], plain[i <= low])
    assert torch.equal(inv_freq[i >= high], pi[i >= high])
    mid = (i > low) & (i < high)
    assert bool(((inv_freq[mid] < plain[mid]) & (inv_freq[mid] > pi[mid])).all())
    assert bool((inv_freq[1:] <= inv_freq[:-1]).all())  # non-increasing in i


def test_yarn_index_ramp_closed_form_and_truncate_false():
    D, b, L, s = 64, 1e4, 1024, 4.0
    for truncate in (True, False):
        low, high = S.yarn_correction_range(D, b, L, truncate=truncate)
        got = S.yarn_inv_freq(D, b, s, L, truncate=truncate)
        theta = [b ** (-2 * i / D) for i in range(D // 2)]
        want = []
        for i, th in enumerate(theta):
            gamma = 1.0 - min(max((i - low) / (high - low), 0.0), 1.0)
            want.append(th / s * (1 - gamma) + th * gamma)
        assert_close(f"yarn-index-truncate={truncate}", torch.tensor(want, dtype=torch.float64), got, 1e-7)
    assert not torch.equal(S.yarn_inv_freq(D, b, s, L), S.yarn_inv_freq(D, b, s, L, truncate=False))


def test_yarn_rotations_ramp_follows_the_paper():
    D, b, L, s = 64, 1e4, 1024, 8.0
    got = S.yarn_inv_freq(D, b, s, L, ramp="rotations")
    theta = torch.tensor([b ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    r = L * theta / (2 * math.pi)  # rotations within L
    gamma = ((r - 1.0) / (32.0 - 1.0)).clamp(0, 1)
    assert_close("yarn-rotations", theta / s * (1 - gamma) + theta * gamma, got, 1e-7)
    assert torch.equal(got[r > 32], S.default_inv_freq(D, b)[r > 32])
    assert torch.equal(got[r < 1], S.pi_inv_freq(D, b, s)[r < 1])
    assert not torch.equal(got, S.yarn_inv_freq(D, b, s, L, ramp="index"))


def test_yarn_equal_bounds_get_plus_0_001():
    # L = 6: floor(d(32)) = 0 and ceil(d(1)) = ceil(-0.16) = 0 -> high = 0.001
    assert S.yarn_correction_range(64, 1e4, 6) == (0.0, 0.001)
    with pytest.raises(ValueError, match="low=0.0 > high=-1.0"):
        S.yarn_correction_range(64, 1e4, 4)


@pytest.mark.parametrize("scaling", ["pi", "ntk", "dynamic_ntk", "yarn"])
@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5])
def test_factor_one_is_plain_rope(scaling, rotary_fraction):
    cfg = S.RopeConfig(scaling=scaling, factor=1.0, original_max_seq_len=1024,
                       rotary_fraction=rotary_fraction)
    plain, mscale0 = S.rope_frequencies(S.RopeConfig(rotary_fraction=rotary_fraction), 64)
    for seq_len in (512, 1024, 5000):
        inv_freq, mscale = S.rope_frequencies(cfg, 64, seq_len=seq_len)
        assert torch.equal(inv_freq, plain) and inv_freq.dtype == torch.float32
        assert mscale == mscale0 == 1.0
    assert plain.shape == (int(32 * rotary_fraction),)
    R = cfg.rotary_dim(64)
    assert_close("plain", torch.tensor([1e4 ** (-2 * i / R) for i in range(R // 2)],
                                       dtype=torch.float64), plain, 1e-7)


@pytest.mark.parametrize("s", [2.0, 4.0, 8.0])
def test_pi_equals_plain_rope_at_position_over_s(s):
    x = torch.randn(1, 16, 2, 32, generator=generator(), dtype=torch.float64).float()
    pos = torch.arange(16)[None] * int(s) + 3 * int(s)
    out_pi = apply_rotary(x, pos, S.pi_inv_freq(32, 1e4, s))
    out_plain = apply_rotary(x, pos // int(s), S.default_inv_freq(32, 1e4))
    assert_close(f"pi-s{s}", out_plain, out_pi, 1e-6)


@pytest.mark.parametrize("D,s", [(64, 4.0), (128, 8.0), (48, 2.5)], ids=lambda v: str(v))
def test_ntk_keeps_fastest_and_interpolates_slowest(D, s):
    plain, ntk = S.default_inv_freq(D), S.ntk_inv_freq(D, 1e4, s)
    assert ntk[0].item() == plain[0].item() == 1.0
    assert abs(ntk[-1].item() / (plain[-1].item() / s) - 1.0) < 1e-6
    assert bool((ntk[1:-1] < plain[1:-1]).all() and (ntk[1:-1] > plain[1:-1] / s).all())


def test_dynamic_ntk_plain_below_L_continuous_and_monotone():
    D, L, s = 64, 1024, 8.0
    plain = S.default_inv_freq(D)
    for seq_len in (1, 100, L):
        assert torch.equal(S.dynamic_ntk_inv_freq(D, 1e4, s, L, seq_len), plain)
    just_above = S.dynamic_ntk_inv_freq(D, 1e4, s, L, L + 1)
    rel = ((just_above.double() - plain.double()).abs() / plain.double()).max().item()
    assert 0 < rel < 2 * s / L  # base multiplier (1 + s/L)**(D/(D-2)) -> 1 as l -> L
    prev = plain
    for seq_len in range(L, 8 * L, 97):
        cur = S.dynamic_ntk_inv_freq(D, 1e4, s, L, seq_len)
        assert bool((cur <= prev).all())  # base non-decreasing in l
        prev = cur
    # 2k -> 16k with s = 8: base multiplier 8*16k/2k - 7 = 57 before the exponent (MATH §2.3)
    want = S.default_inv_freq(D, 1e4 * 57 ** (D / (D - 2)))
    assert torch.equal(S.dynamic_ntk_inv_freq(D, 1e4, 8.0, 2048, 16384), want)
    cfg = S.RopeConfig(scaling="dynamic_ntk", factor=s, original_max_seq_len=L)
    assert torch.equal(S.rope_frequencies(cfg, D, seq_len=3000)[0], S.dynamic_ntk_inv_freq(D, 1e4, s, L, 3000))
    with pytest.raises(ValueError, match="seq_len"):
        S.rope_frequencies(cfg, D)


@pytest.mark.parametrize("dims", [{"B": 1, "T": 63, "H": 2, "D": 60}, {"B": 2, "T": 9, "H": 4, "D": 48}],
                         ids=lambda d: shape_id(**d))
def test_folding_mscale_squared_into_scale_equals_scaling_q_and_k(dims):
    B, T, H, D = dims.values()
    cfg = _yarn(1e4, 32, 16.0)
    inv_freq, mscale = S.rope_frequencies(cfg, D)
    g = generator()
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    pos = torch.arange(T)[None] + 100
    q_r, k_r = apply_rotary(q, pos, inv_freq), apply_rotary(k, pos, inv_freq)
    bhtd = [t.transpose(1, 2) for t in (q_r, k_r, v)]
    folded = attention(*bhtd, pos_q_BT=pos, pos_k_BS=pos, scale=mscale**2 / math.sqrt(D))
    # The reference code's formulation: cos/sin tables multiplied by mscale scale q and k.
    tables = attention(bhtd[0] * mscale, bhtd[1] * mscale, bhtd[2], pos_q_BT=pos, pos_k_BS=pos,
                       scale=1 / math.sqrt(D))
    assert_close("mscale-fold", tables, folded, 1e-6)
    plain = attention(*bhtd, pos_q_BT=pos, pos_k_BS=pos, scale=1 / math.sqrt(D))
    assert (plain - folded).abs().max() > 1e-3  # the temperature actually changes the output


def test_attention_factor_and_factor_survive_round_trips():
    cfg = _yarn(1e4, 4096, 16.0, attention_factor=1.0)
    again = S.RopeConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    assert again == cfg and again.attention_factor == 1.0 and again.factor == 16.0
    assert S.rope_frequencies(again, 128)[1] == 1.0  # an explicit 1.0 is not replaced by 1.277259
    assert S.rope_frequencies(_yarn(1e4, 4096, 16.0, attention_factor=1.5), 128)[1] == 1.5
    assert S.yarn_mscale(0.5) == S.yarn_mscale(1.0) == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.factor = 2.0  # type: ignore[misc]


@pytest.mark.parametrize("kwargs,match", [
    ({"scaling": "yarn", "factor": 0.5, "original_max_seq_len": 1024}, "factor=0.5"),
    ({"scaling": "yarn", "factor": 4.0}, "original_max_seq_len"),
    ({"scaling": "pi", "factor": 2.0}, "original_max_seq_len"),
    ({"scaling": "none", "factor": 2.0}, "factor=2.0"),
    ({"scaling": "pi", "factor": 2.0, "original_max_seq_len": 1024, "attention_factor": 1.2}, "attention_factor"),
    ({"scaling": "yarn", "factor": 2.0, "original_max_seq_len": 1024, "attention_factor": 0.0}, "attention_factor"),
    ({"scaling": "yarn", "factor": 2.0, "original_max_seq_len": 0}, "original_max_seq_len=0"),
    ({"scaling": "linear"}, "linear"),
    ({"ramp": "wavelength"}, "wavelength"),
    ({"pairing": "neox"}, "neox"),
    ({"rotary_fraction": 0.3}, "rotary_fraction=0.3"),
    ({"rotary_fraction": 0.0}, "rotary_fraction=0.0"),
    ({"base": 1.0}, "base=1.0"),
    ({"beta_fast": 1.0, "beta_slow": 2.0}, "beta_slow=2.0"),
    ({"factor": float("nan")}, "factor=nan"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_config_validation_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        S.RopeConfig(**kwargs).rotary_dim(64)


def test_check_factor_refuses_a_disagreeing_target_length():
    assert S.check_factor(4.0, 1024, 4096) == 4.0
    assert S.check_factor(4.0, 1024, None) == 4.0
    with pytest.raises(ValueError, match="4096/1024"):
        S.check_factor(8.0, 1024, 4096)
    with pytest.raises(ValueError, match="head_dim"):
        S.RopeConfig().rotary_dim(0)
