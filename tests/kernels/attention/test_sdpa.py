"""The sdpa backend equals the reference backend (plain/RoPE, PoPE Cartesian, ALiBi, varlen)."""

from __future__ import annotations

import math

import pytest
import torch

from phaselab.kernels.attention import reference as R
from phaselab.kernels.attention.sdpa import SdpaBackend, build_mask
from phaselab.kernels.common.score_mod import ScoreMod, alibi_slopes, pope_inv_freq
from phaselab.kernels.pope.reference import pope_expand
from phaselab.kernels.registry import BackendUnsupported
from phaselab.kernels.rotary.reference import apply_rotary
from phaselab.kernels.rotary.scaling import default_inv_freq
from phaselab.kernels.testing import assert_close, calibrated_close, generator, shape_id

SDPA, REF = SdpaBackend(), R.ReferenceBackend()


def _qkv(B, H, G, T, S, D, dtype=torch.float32, seed=42):
    g = generator(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
                 for shape in ((B, H, T, D), (B, G, S, D), (B, G, S, D)))


def _mod(kind, H, D):
    if kind == "none":
        return None
    if kind == "pope":
        delta = -2 * math.pi * torch.rand(H, D, generator=generator(5))
        return ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(D), "delta": delta})
    return ScoreMod(kind="alibi", params={"slopes": alibi_slopes(H)})


def _positions(case: str, B: int, T: int, S: int):
    if case == "arange":
        return torch.arange(T)[None], torch.arange(S)[None]
    if case == "decode":  # bottom-right: queries at the last T positions
        return torch.arange(S - T, S)[None].expand(B, T), torch.arange(S)[None].expand(B, S)
    pos = torch.randint(0, 3 * S, (B, S), generator=generator(9)).sort(-1).values  # gaps, per batch
    return pos[:, S - T:], pos


CASES = [  # (B, H, G, T, S, D, positions)
    (2, 4, 2, 63, 63, 60, "arange"), (2, 4, 4, 63, 63, 48, "shifted"), (1, 4, 2, 1, 64, 32, "decode"),
    (2, 2, 1, 7, 64, 16, "decode"), (2, 6, 3, 17, 17, 8, "shifted"),
]


@pytest.mark.parametrize("kind", ["none", "pope", "alibi"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", CASES, ids=[shape_id(B=c[0], H=c[1], G=c[2], T=c[3], S=c[4], D=c[5]) + f"-{c[6]}"
                                             for c in CASES])
def test_sdpa_equals_reference(kind, causal, case):
    B, H, G, T, S, D, positions = case
    q, k, v = _qkv(B, H, G, T, S, D)
    pos_q, pos_k = _positions(positions, B, T, S)
    kw = {"pos_q": pos_q, "pos_k": pos_k, "scale": D**-0.5, "causal": causal, "score_mod": _mod(kind, H, D)}
    assert_close(f"sdpa-{kind}", REF(q, k, v, **kw), SDPA(q, k, v, **kw), 2e-6)


def test_sdpa_rope_and_gradients_match_reference():
    B, H, G, T, D = 2, 4, 2, 33, 16
    q, k, v = _qkv(B, H, G, T, T, D)
    pos = torch.arange(T)[None] + 500
    inv_freq = default_inv_freq(D)
    delta = (-torch.rand(H, D, generator=generator(3))).requires_grad_(True)
    grads = {}
    for name, backend in (("ref", REF), ("sdpa", SDPA)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        q_r = apply_rotary(leaves[0].transpose(1, 2), pos, inv_freq).transpose(1, 2)
        k_r = apply_rotary(leaves[1].transpose(1, 2), pos, inv_freq).transpose(1, 2)
        rope = backend(q_r, k_r, leaves[2], pos_q=pos, pos_k=pos, scale=D**-0.5, causal=True, score_mod=None)
        mod = ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(D), "delta": delta})
        pope = backend(*leaves, pos_q=pos, pos_k=pos, scale=D**-0.5, causal=True, score_mod=mod)
        grads[name] = [rope, pope, *torch.autograd.grad((rope.square().sum() + pope.square().sum()),
                                                        [*leaves, delta])]
    # ddelta: the reference puts +delta on the key phase, sdpa -delta on the query phase (MATH
    # §3.1); at positions ~500 the two fp32 angles round differently by ~3e-5 rad.
    ratios = [5e-6] * 5 + [3e-5]
    for label, ref, out, ratio in zip(["rope", "pope", "dq", "dk", "dv", "ddelta"], grads["ref"], grads["sdpa"],
                                      ratios):
        assert_close(f"sdpa-{label}", ref, out, ratio)


def test_is_causal_only_for_trivial_positions():
    arange = torch.arange(8)[None]
    assert build_mask(arange, arange, causal=True) == (None, True)
    for pos_q, pos_k in ((arange + 1, arange + 1), (arange[:, 3:], arange), (arange, arange.flip(-1))):
        mask, is_causal = build_mask(pos_q, pos_k, causal=True)
        assert not is_causal and torch.equal(mask, R.visibility(pos_q, pos_k))
    assert build_mask(arange, arange, causal=False) == (None, False)
    # declared trivial by the caller (the model's default positions): no comparison, no sync
    assert build_mask(arange + 1, arange + 1, causal=True, trivial_pos=True) == (None, True)
    with pytest.raises(ValueError, match="T == S"):
        build_mask(arange[:, 3:], arange, causal=True, trivial_pos=True)


def test_varlen_matches_reference_per_document():
    lens = [7, 1, 12, 4]
    T, H, D = sum(lens), 4, 16
    q, k, v = _qkv(1, H, 2, T, T, D)
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    cu = torch.tensor([0, 7, 8, 20, 24])
    for kind in ("none", "pope"):
        kw = {"pos_q": pos, "pos_k": pos, "scale": D**-0.5, "causal": True, "score_mod": _mod(kind, H, D), "cu_seqlens": cu}
        assert_close(f"varlen-{kind}", REF(q, k, v, **kw), SDPA(q, k, v, **kw), 2e-6)


def test_fully_masked_rows_give_zero_not_nan():
    q, k, v = _qkv(1, 2, 2, 3, 4, 8)
    pos_q, pos_k = torch.tensor([[0, 5, 9]]), torch.tensor([[3, 4, 5, 6]])
    for kind in ("none", "pope", "alibi"):
        out = SDPA(q, k, v, pos_q=pos_q, pos_k=pos_k, scale=0.3, causal=True, score_mod=_mod(kind, 2, 8))
        assert torch.equal(out[:, :, 0], torch.zeros(1, 2, 8))
        assert_close(f"masked-{kind}", REF(q, k, v, pos_q=pos_q, pos_k=pos_k, scale=0.3, causal=True,
                                           score_mod=_mod(kind, 2, 8)), out, 2e-6)


def test_unsupported_calls_raise():
    q, k, v = _qkv(1, 2, 2, 4, 4, 8)
    pos = torch.arange(4)[None]
    with pytest.raises(BackendUnsupported, match="TAPA"):
        SDPA(q, k, v, pos_q=pos, pos_k=pos, scale=1.0, causal=True, score_mod=ScoreMod(kind="tapa", params={}))
    with pytest.raises(BackendUnsupported, match="ALiBi"):
        SDPA(q.bfloat16(), k.bfloat16(), v.bfloat16(), pos_q=pos, pos_k=pos, scale=1.0, causal=True,
             score_mod=_mod("alibi", 2, 8))


def _pope_on(mod: ScoreMod | None, device, dtype=torch.float32) -> ScoreMod | None:
    if mod is None:
        return None
    return ScoreMod(kind="pope", params={"inv_freq": mod.params["inv_freq"].to(device),
                                         "delta": mod.params["delta"].to(device, dtype)})


def _naive_same_dtype(q, k, v, pos_q, pos_k, scale, mod):
    """PyTorch's own computation in q's dtype: the Cartesian form / plain dot, materialised."""
    H = q.shape[1]
    if mod is not None:
        q, k = pope_expand(q, k, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=mod.params["inv_freq"],
                             delta_HD=mod.params["delta"])
    logits = (q @ R.repeat_kv(k, H).transpose(-1, -2)) * scale
    logits = logits.masked_fill(~R.visibility(pos_q, pos_k), float("-inf"))
    return torch.softmax(logits, dim=-1) @ R.repeat_kv(v, H)


def _two_x_rule(kind, dims, positions, dtype, device):
    """Forward and dq/dk/dv of sdpa at `dtype` obey the 2x rule against the float64 reference."""
    B, H, G, T, S, D = dims
    q, k, v = (t.to(device) for t in _qkv(B, H, G, T, S, D, dtype=dtype))
    pos_q, pos_k = (p.to(device) for p in _positions(positions, B, T, S))
    mod, scale = _pope_on(_mod(kind, H, D), device), D**-0.5
    grad_out = torch.randn(B, H, T, D, generator=generator(8), dtype=torch.float64).to(device)
    results = []
    for name, fn, cast in (
        ("ref64", lambda q, k, v: R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=scale,
                                              score_mod=_pope_on(mod, device, torch.float64),
                                              compute_dtype=torch.float64), torch.float64),
        ("torch", lambda q, k, v: _naive_same_dtype(q, k, v, pos_q, pos_k, scale, mod), dtype),
        ("sdpa", lambda q, k, v: SDPA(q, k, v, pos_q=pos_q, pos_k=pos_k, scale=scale, causal=True,
                                      score_mod=mod), dtype),
    ):
        leaves = [t.detach().to(cast).requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        assert out.dtype == cast, name
        results.append([out, *torch.autograd.grad(out, leaves, grad_out.to(cast))])
    # Outputs: max-abs (flash-attention's rule). Gradients: RMS, because one max-abs outlier among
    # ~1e5 values varies by 2-3x between seeds for the naive and the fused kernel alike (seen on the
    # H200 with fp16 PoPE, T = 257), while the RMS errors stay within 5% of each other.
    for label, ref64, same, got in zip(["out", "dq", "dk", "dv"], *results, strict=True):
        calibrated_close(f"sdpa-{kind}-{label}-{shape_id(dtype=dtype)}", ref64, got, same, atol=1e-5 if
                         label == "out" else 0.0, metric="max" if label == "out" else "rms")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=[shape_id(dtype=torch.bfloat16),
                                                                        shape_id(dtype=torch.float16)])
@pytest.mark.parametrize("kind", ["none", "pope"])
def test_low_precision_obeys_the_2x_rule(dtype, kind):
    _two_x_rule(kind, (2, 4, 2, 63, 63, 60), "shifted", dtype, "cpu")


GPU_CASES = [((2, 8, 2, 257, 257, 64), "arange"), ((2, 8, 2, 1, 300, 128), "decode"),
             ((1, 4, 4, 63, 63, 60), "shifted"), ((2, 4, 1, 7, 500, 48), "decode")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=[shape_id(dtype=torch.bfloat16),
                                                                        shape_id(dtype=torch.float16)])
@pytest.mark.parametrize("kind", ["none", "pope"])
@pytest.mark.parametrize("case", GPU_CASES, ids=[shape_id(**dict(zip("BHGTSD", c[0], strict=True))) + f"-{c[1]}"
                                                 for c in GPU_CASES])
def test_cuda_sdpa_obeys_the_2x_rule(case, kind, dtype):
    # On CUDA the flash / memory-efficient kernels run; PoPE's v (D) is narrower than q/k (2D).
    _two_x_rule(kind, *case, dtype, "cuda")
