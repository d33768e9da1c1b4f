"""RoPE reference properties (MATH.md §1.5) for phaselab.kernels.rotary.reference.apply_rotary."""

from __future__ import annotations

import math

import pytest
import torch

from phaselab.kernels.rotary.reference import apply_rotary
from phaselab.kernels.rotary.scaling import default_inv_freq
from phaselab.kernels.testing import assert_close, generator, shape_id

SHAPES = [{"B": 2, "T": 63, "H": 4, "D": 60}, {"B": 1, "T": 17, "H": 2, "D": 48}, {"B": 2, "T": 5, "H": 3, "D": 8}]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CASES = [(s, dt) for s in SHAPES for dt in DTYPES]
IDS = [shape_id(**s, dtype=dt) for s, dt in CASES]


def _rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 42) -> torch.Tensor:
    return torch.randn(*shape, generator=generator(seed), dtype=torch.float64).to(dtype)


def _loop_rotary(x, pos, inv_freq, pairing: str):
    """Direct float64 evaluation of R(pos*theta_i) on each pair (MATH §1.1, §1.3)."""
    B, T, H, _D = x.shape
    R = 2 * inv_freq.shape[0]
    out = x.to(torch.float64).clone()
    for b in range(B):
        for t in range(T):
            p = int(pos[b if pos.shape[0] > 1 else 0, t])
            for i in range(R // 2):
                # angle as the spec computes it: fp32 product of the int position and fp32 theta
                phi = float(torch.tensor(float(p), dtype=torch.float32) * inv_freq[i])
                ia, ic = (2 * i, 2 * i + 1) if pairing == "interleaved" else (i, i + R // 2)
                for h in range(H):
                    a, c = float(x[b, t, h, ia]), float(x[b, t, h, ic])
                    out[b, t, h, ia] = a * math.cos(phi) - c * math.sin(phi)
                    out[b, t, h, ic] = a * math.sin(phi) + c * math.cos(phi)
    return out


@pytest.mark.parametrize("dims,dtype", CASES, ids=IDS)
def test_dtype_shape_and_exact_fp32_reference(dims, dtype):
    B, T, H, D = dims["B"], dims["T"], dims["H"], dims["D"]
    x = _rand(B, T, H, D, dtype=dtype)
    pos = torch.arange(T)[None] + 1000
    inv_freq = default_inv_freq(D)
    out = apply_rotary(x, pos, inv_freq)
    assert out.dtype == dtype and out.shape == x.shape
    # The result equals the fp32 computation cast once (no compiler-fused low-precision upcast).
    assert torch.equal(out, apply_rotary(x.float(), pos, inv_freq).to(dtype))


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("dims", [{"B": 2, "T": 5, "H": 2, "D": 12}, {"B": 1, "T": 7, "H": 1, "D": 10}],
                         ids=lambda d: shape_id(**d))
def test_matches_float64_loop(dims, pairing):
    B, T, H, D = dims.values()
    x = _rand(B, T, H, D)
    pos = torch.randint(0, 5000, (B, T), generator=generator(1))
    inv_freq = default_inv_freq(D)
    ref = _loop_rotary(x, pos, inv_freq, pairing)
    assert_close(f"rotary-{pairing}", ref, apply_rotary(x, pos, inv_freq, pairing=pairing), 1e-6)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_position_zero_is_identity_and_norm_preserved(pairing):
    x = _rand(2, 9, 3, 16)
    inv_freq = default_inv_freq(16)
    assert torch.equal(apply_rotary(x, torch.zeros(2, 9, dtype=torch.int64), inv_freq, pairing=pairing), x)
    pos = torch.randint(0, 60_000, (2, 9), generator=generator(3))
    out = apply_rotary(x.double(), pos, inv_freq, pairing=pairing)
    if pairing == "interleaved":
        n_in, n_out = x.double().unflatten(-1, (8, 2)).norm(dim=-1), out.unflatten(-1, (8, 2)).norm(dim=-1)
    else:
        n_in = torch.hypot(x.double()[..., :8], x.double()[..., 8:])
        n_out = torch.hypot(out[..., :8], out[..., 8:])
    assert_close("pair-norms", n_in, n_out, 1e-12)


def test_conjugate_inverts_and_is_the_backward():
    x = _rand(2, 11, 2, 16).requires_grad_(True)
    pos = torch.randint(0, 30_000, (2, 11), generator=generator(5))
    inv_freq = default_inv_freq(16)
    out = apply_rotary(x, pos, inv_freq)
    assert_close("inverse", x.detach(), apply_rotary(out.detach(), pos, inv_freq, conjugate=True), 1e-6)
    grad_out = _rand(2, 11, 2, 16, seed=7)
    (grad_x,) = torch.autograd.grad(out, x, grad_out)
    assert_close("backward", apply_rotary(grad_out, pos, inv_freq, conjugate=True), grad_x, 1e-6)


def _score(q, k, m: int, n: int, inv_freq, pairing="interleaved"):
    qm = apply_rotary(q, torch.tensor([[m]]), inv_freq, pairing=pairing)
    kn = apply_rotary(k, torch.tensor([[n]]), inv_freq, pairing=pairing)
    return (qm.double() * kn.double()).sum(-1)


@pytest.mark.parametrize("m,n,c,ratio", [(3, 1, 7, 1e-6), (100, -50, 1000, 2e-5),
                                         (65521, -65519, -65497, 5e-3), (-65519, 65521, 65497, 5e-3)],
                         ids=["small", "mid", "big-neg-shift", "big-pos-shift"])
def test_shift_invariance(m, n, c, ratio):
    # fp32 m*theta carries ~ulp(2^17)/2 ~ 4e-3 rad of error at |pos| ~ 1e5 (MATH §7.4)
    q, k = _rand(1, 1, 8, 32, seed=11), _rand(1, 1, 8, 32, seed=12)
    inv_freq = default_inv_freq(32)
    assert_close("shift", _score(q, k, m, n, inv_freq), _score(q, k, m + c, n + c, inv_freq), ratio)


def test_same_position_score_is_plain_dot():
    q, k = _rand(1, 1, 4, 32, seed=13), _rand(1, 1, 4, 32, seed=14)
    dot = (q.double() * k.double()).sum(-1)
    assert_close("m=n", dot, _score(q, k, 777, 777, default_inv_freq(32)), 1e-5)


def test_interleaved_and_half_agree_after_permutation():
    D = 16
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # P: interleaved -> half
    x = _rand(2, 7, 3, D)
    pos = torch.randint(0, 10_000, (2, 7), generator=generator(4))
    inv_freq = default_inv_freq(D)
    assert torch.equal(apply_rotary(x, pos, inv_freq)[..., perm],
                       apply_rotary(x[..., perm], pos, inv_freq, pairing="half"))
    q, k = _rand(1, 1, 2, D, seed=21), _rand(1, 1, 2, D, seed=22)
    assert_close("pairing-scores", _score(q, k, 40, 3, inv_freq),
                 _score(q[..., perm], k[..., perm], 40, 3, inv_freq, pairing="half"), 1e-6)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", DTYPES, ids=[shape_id(dtype=d) for d in DTYPES])
def test_partial_rotary_tail_is_bit_identical(pairing, dtype):
    x = _rand(2, 63, 2, 60, dtype=dtype)
    inv_freq = default_inv_freq(30)  # rotate R = 30 of D = 60 features (rho = 0.5)
    pos = torch.arange(63)[None] + 5
    out = apply_rotary(x, pos, inv_freq, pairing=pairing)
    assert torch.equal(out[..., 30:], x[..., 30:])
    assert torch.equal(out[..., :30], apply_rotary(x[..., :30], pos, inv_freq, pairing=pairing))
    assert not torch.equal(out[..., :30], x[..., :30])


def test_positions_out_of_range_and_bad_inputs_raise():
    x = _rand(1, 4, 1, 8)
    inv_freq = default_inv_freq(8)
    with pytest.raises(ValueError, match="4096"):
        apply_rotary(x, torch.tensor([[0, 1, 2, 4096]]), inv_freq, max_position=4096)
    with pytest.raises(ValueError, match="-1"):
        apply_rotary(x, torch.tensor([[-1, 1, 2, 3]]), inv_freq, max_position=4096)
    apply_rotary(x, torch.tensor([[0, 1, 2, 4095]]), inv_freq, max_position=4096)
    with pytest.raises(TypeError, match="bfloat16"):
        apply_rotary(x, torch.arange(4)[None].to(torch.bfloat16), inv_freq)
    with pytest.raises(ValueError, match="pairing"):
        apply_rotary(x, torch.arange(4)[None], inv_freq, pairing="neox")
    with pytest.raises(ValueError, match="exceed"):
        apply_rotary(x, torch.arange(4)[None], default_inv_freq(16))
    with pytest.raises(ValueError, match="shape"):
        apply_rotary(x, torch.arange(5)[None], inv_freq)


@pytest.mark.gpu
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_compiled_rotary_keeps_the_fp32_upcast(pairing):
    # MATH §7.1: a compiler must not fuse the upcast away. With angles in bf16 at positions ~9k the
    # result would be noise (bf16 spacing is 64 there); with fp32 angles only the final cast rounds.
    x = _rand(2, 256, 4, 64, dtype=torch.bfloat16).cuda()
    pos = (torch.arange(256)[None] + 9000).cuda()
    inv_freq = default_inv_freq(64).cuda()
    compiled = torch.compile(apply_rotary, fullgraph=True)
    out = compiled(x, pos, inv_freq, pairing=pairing)
    eager = apply_rotary(x, pos, inv_freq, pairing=pairing)
    assert out.dtype == torch.bfloat16
    exact = apply_rotary(x.double(), pos, inv_freq, pairing=pairing)
    assert_close("compiled-rotary", exact, out, 8e-3)  # bf16 output rounding only (2^-8)
    assert_close("compiled-vs-eager", eager, out, 8e-3)
