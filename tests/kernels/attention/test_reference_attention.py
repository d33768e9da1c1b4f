"""Reference attention vs a direct float64 loop of MATH.md's formulas; masking, GQA, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from phaselab.kernels.attention import reference as R
from phaselab.kernels.common.score_mod import ScoreMod, alibi_slopes, pope_inv_freq
from phaselab.kernels.pope.reference import pope_expand
from phaselab.kernels.rotary.reference import apply_rotary
from phaselab.kernels.rotary.scaling import default_inv_freq
from phaselab.kernels.testing import assert_close, generator, shape_id


def _rand(*shape, dtype=torch.float32, seed=42, scale=1.0):
    return (scale * torch.randn(*shape, generator=generator(seed), dtype=torch.float64)).to(dtype)


def _mod(kind: str, H: int, D: int, dtype=torch.float32, **extra) -> ScoreMod | None:
    if kind == "none":
        return None
    if kind == "pope":
        delta = -2 * math.pi * torch.rand(H, D, generator=generator(7), dtype=torch.float64)
        # delta is rounded to fp32 first so that fp32 and float64 runs share the same values
        return ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(D), "delta": delta.float().to(dtype),
                                             **extra})
    if kind == "tapa":
        return ScoreMod(kind="tapa", params={"alpha": 0.5, **extra})
    return ScoreMod(kind="alibi", params={"slopes": alibi_slopes(H, H // 2 or 1).to(dtype)})


def _softplus(x: float) -> float:
    return x if x > 20 else math.log1p(math.exp(x))


def _loop_score(mod: ScoreMod | None, q: list[float], k: list[float], m: int, n: int, h: int) -> float:
    """One score a_mn straight from MATH §1-§5, in Python floats (float64)."""
    D = len(q)
    if mod is None or mod.kind == "alibi":
        return sum(a * b for a, b in zip(q, k))
    p = mod.params
    if mod.kind == "pope":
        amp = {"softplus": _softplus, "relu": lambda x: max(x, 0.0), "identity": lambda x: x}[p["amplitude"]]
        delta = [0.0] * D if p["delta"] is None else p["delta"][h].tolist()
        theta = p["inv_freq"].tolist()
        return sum(amp(q[c]) * amp(k[c]) * math.cos((n - m) * theta[c] + delta[c]) for c in range(D))
    d_a = int(p["theta"] * D)
    d_p = D - d_a
    amp_term = sum(q[j] * k[j] for j in range(d_a)) / math.sqrt(d_a)
    if p["phase"] == "quadratic":
        phi = sum(q[j] * k[j] for j in range(d_a, D)) / math.sqrt(d_p)
    else:
        phi = (sum(q[d_a:]) + sum(k[d_a:])) / math.sqrt(d_p)
    return amp_term * math.cos(p["phase_scale"] * abs(m - n) ** p["alpha"] * phi)


def _loop_attention(q, k, v, pos_q, pos_k, scale, causal, mod):
    B, H, T, _ = q.shape
    G, S, Dv = k.shape[1], k.shape[2], v.shape[-1]
    out = torch.zeros(B, H, T, Dv, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            for t in range(T):
                m = int(pos_q[b, t])
                logits, keys = [], []
                for s in range(S):
                    n = int(pos_k[b, s])
                    if causal and n > m:
                        continue
                    a = scale * _loop_score(mod, q[b, h, t].tolist(), k[b, g, s].tolist(), m, n, h)
                    if mod is not None and mod.kind == "alibi":
                        a -= float(mod.params["slopes"][h]) * (m - n)
                    logits.append(a)
                    keys.append(s)
                if not keys:
                    continue  # a row that sees no key outputs 0
                top = max(logits)
                w = [math.exp(x - top) for x in logits]
                for s, wi in zip(keys, w):
                    out[b, h, t] += wi / sum(w) * v[b, g, s].double()
    return out


KINDS = ["none", "pope", "tapa", "alibi"]
LOOP_SHAPES = [{"B": 2, "H": 4, "G": 2, "T": 5, "S": 7, "D": 6}, {"B": 1, "H": 3, "G": 3, "T": 6, "S": 6, "D": 8},
               {"B": 1, "H": 2, "G": 1, "T": 1, "S": 9, "D": 4}]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dims", LOOP_SHAPES, ids=lambda d: shape_id(**d))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_attention_matches_float64_loop(kind, dims, causal):
    B, H, G, T, S, D = dims.values()
    q, k, v = _rand(B, H, T, D, seed=1), _rand(B, G, S, D, seed=2), _rand(B, G, S, D, seed=3)
    pos_k = torch.randint(0, 50, (B, S), generator=generator(4)).sort(dim=-1).values
    pos_q = pos_k[:, -T:] if T <= S else torch.arange(T)[None].expand(B, T)
    if not causal:  # arbitrary, unsorted positions are fine without a mask
        pos_q = torch.randint(0, 50, (B, T), generator=generator(5))
    mod = _mod(kind, H, D)
    scale = 1.0 if kind == "tapa" else 1 / math.sqrt(D)
    want = _loop_attention(q, k, v, pos_q, pos_k, scale, causal, mod)
    got = R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=scale, causal=causal, score_mod=mod)
    assert got.dtype == torch.float32
    assert_close(f"{kind}-fp32", want, got, 2e-6)
    mod64 = _mod(kind, H, D, dtype=torch.float64)
    got64 = R.attention(q.double(), k.double(), v.double(), pos_q_BT=pos_q, pos_k_BS=pos_k, scale=scale,
                        causal=causal, score_mod=mod64, compute_dtype=torch.float64)
    assert_close(f"{kind}-fp64", want, got64, 1e-12)


@pytest.mark.parametrize("amplitude", ["softplus", "relu", "identity"])
def test_pope_amplitudes_match_loop_scores(amplitude):
    q, k = _rand(1, 2, 4, 8, seed=1, scale=3.0), _rand(1, 1, 5, 8, seed=2, scale=3.0)
    q[0, 0, 0, 0] = 25.0  # softplus region above the threshold
    pos_q, pos_k = torch.tensor([[3, 8, 9, 40]]), torch.tensor([[0, 1, 5, 9, 30]])
    mod = _mod("pope", 2, 8, amplitude=amplitude)
    want = torch.tensor([[[[_loop_score(mod, q[0, h, t].tolist(), k[0, 0, s].tolist(), int(pos_q[0, t]),
                                        int(pos_k[0, s]), h) for s in range(5)] for t in range(4)]
                          for h in range(2)]], dtype=torch.float64)
    got = R.scores(q, k, pos_q_BT=pos_q, pos_k_BS=pos_k, score_mod=mod, compute_dtype=torch.float32)
    assert_close(f"pope-{amplitude}", want, got, 2e-6)
    assert torch.equal(got, R.logits(q, k, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0, score_mod=mod))


@pytest.mark.parametrize("T,S", [(1, 64), (7, 64), (1, 1), (63, 63)], ids=lambda v: str(v))
@pytest.mark.parametrize("kind", KINDS)
def test_causal_bottom_right_equals_per_row_manual_masking(T, S, kind):
    # float64 throughout, so a masking error cannot hide behind fp32 summation-order noise
    B, H, G, D, f64 = 2, 4, 2, 8, torch.float64
    q, k, v = (_rand(*shape, dtype=f64, seed=i) for i, shape in enumerate([(B, H, T, D), (B, G, S, D)] + [(B, G, S, D)]))
    pos_k = torch.arange(S)[None].expand(B, S)
    pos_q = pos_k[:, S - T:]  # decode: queries at the last T positions, never at 0 (MATH §7.6)
    mod = _mod(kind, H, D, dtype=f64)
    kw = {"scale": 1.0 if kind == "tapa" else D**-0.5, "score_mod": mod, "compute_dtype": f64}
    got = R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, causal=True, **kw)
    for t in sorted({*range(0, T, 9), T - 1}):  # a spread of rows keeps T = 63 cheap
        n_vis = S - T + t + 1  # keys 0 .. pos_q[t]
        row = R.attention(q[:, :, t:t + 1], k[:, :, :n_vis], v[:, :, :n_vis], pos_q_BT=pos_q[:, t:t + 1],
                          pos_k_BS=pos_k[:, :n_vis], causal=False, **kw)
        assert_close(f"row{t}", row, got[:, :, t:t + 1], 1e-12)
    if T == 1:  # a single decode query sees every cached key
        full = R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, causal=False, **kw)
        assert_close("decode-all-visible", full, got, 1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_gqa_equals_explicit_head_repetition(kind):
    B, H, G, T, D = 2, 6, 2, 9, 8
    q, k, v = _rand(B, H, T, D, seed=1), _rand(B, G, T, D, seed=2), _rand(B, G, T, D, seed=3)
    pos = torch.arange(T)[None] + 11
    mod = _mod(kind, H, D)
    got = R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=1.0, score_mod=mod)
    heads = [h * G // H for h in range(H)]  # MATH §0: head h reads kv head floor(h*G/H)
    k_rep, v_rep = k[:, heads], v[:, heads]
    assert heads == [0, 0, 0, 1, 1, 1]
    assert_close(f"gqa-{kind}", R.attention(q, k_rep, v_rep, pos_q_BT=pos, pos_k_BS=pos, scale=1.0,
                                            score_mod=mod), got, 1e-7)
    with pytest.raises(ValueError, match="divisible"):
        R.attention(q, k[:, :1].expand(B, 4, T, D), v[:, :1].expand(B, 4, T, D), pos_q_BT=pos,
                    pos_k_BS=pos, scale=1.0)


def test_fully_masked_rows_are_zero_with_finite_gradients():
    q, k, v = (_rand(1, 2, 3, 4, seed=i).requires_grad_(True) for i in range(3))
    pos_q, pos_k = torch.tensor([[0, 5, 6]]), torch.tensor([[2, 3, 4]])  # query at 0 sees nothing
    out = R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=0.5)
    assert torch.equal(out[:, :, 0], torch.zeros(1, 2, 4))
    assert bool(out[:, :, 1:].abs().sum() > 0)
    out.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, :, 0], torch.zeros(1, 2, 4))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_an_empty_key_set_gives_zeros_and_zero_gradients(kind, causal):
    """S = 0 (no cached key yet): every row sees no key, so it outputs 0 (module docstring), as
    the float64 loop does; causal masking must not reduce over the empty key axis."""
    B, H, T, D = 1, 2, 3, 4
    q = _rand(B, H, T, D, seed=1).requires_grad_(True)
    k, v = _rand(B, 1, 0, D, seed=2), _rand(B, 1, 0, 5, seed=3)
    pos_q, pos_k = torch.arange(T)[None], torch.zeros(1, 0, dtype=torch.int64)
    mod = _mod(kind, H, D, **({"amplitude": "softplus"} if kind == "pope" else
                              {"theta": 0.5, "phase": "quadratic", "phase_scale": 1.0} if kind == "tapa" else {}))
    out = R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=0.5, causal=causal, score_mod=mod)
    expected = _loop_attention(q.detach(), k, v, pos_q, pos_k, 0.5, causal, mod)
    assert out.shape == (B, H, T, 5) and torch.equal(out.double(), expected)
    assert torch.equal(out, torch.zeros(B, H, T, 5))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=[shape_id(dtype=torch.bfloat16),
                                                                        shape_id(dtype=torch.float16)])
@pytest.mark.parametrize("kind", KINDS)
def test_low_precision_inputs_are_computed_in_fp32(dtype, kind):
    B, H, T, D = 2, 4, 63, 60
    q, k, v = _rand(B, H, T, D, dtype=dtype, seed=1), _rand(B, 2, T, D, dtype=dtype, seed=2), \
        _rand(B, 2, T, D, dtype=dtype, seed=3)
    pos = torch.arange(T)[None] + 9000  # bf16 cannot represent these positions (MATH §7.2)
    mod = _mod(kind, H, D)
    out = R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D**-0.5, score_mod=mod)
    assert out.dtype == dtype
    want = R.attention(q.float(), k.float(), v.float(), pos_q_BT=pos, pos_k_BS=pos, scale=D**-0.5,
                       score_mod=mod)
    assert torch.equal(out, want.to(dtype))


def _gradcheck_inputs(B=1, H=2, G=1, T=4, S=5, D=4):
    g = generator(3)
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True)
               for shape in ((B, H, T, D), (B, G, S, D), (B, G, S, D)))
    return q, k, v, torch.tensor([[2, 3, 4, 9]]), torch.tensor([[0, 1, 3, 4, 7]])


def test_gradcheck_rope_rotated_inputs():
    q, k, v, pos_q, pos_k = _gradcheck_inputs(D=6)
    inv_freq = default_inv_freq(6)

    def fn(q, k, v):
        q_r = apply_rotary(q.transpose(1, 2), pos_q, inv_freq).transpose(1, 2)
        k_r = apply_rotary(k.transpose(1, 2), pos_k, inv_freq).transpose(1, 2)
        return R.attention(q_r, k_r, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=0.4,
                           compute_dtype=torch.float64)

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradcheck_pope_q_k_delta():
    q, k, v, pos_q, pos_k = _gradcheck_inputs()
    delta = (-torch.rand(2, 4, generator=generator(9), dtype=torch.float64)).requires_grad_(True)

    def fn(q, k, v, delta):
        mod = ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(4), "delta": delta})
        return R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=0.5, score_mod=mod,
                           compute_dtype=torch.float64)

    assert torch.autograd.gradcheck(fn, (q, k, v, delta))


@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_gradcheck_tapa(phase):
    q, k, v, pos_q, pos_k = _gradcheck_inputs(D=6)
    mod = ScoreMod(kind="tapa", params={"phase": phase, "alpha": 0.5})

    def fn(q, k, v):
        return R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=1.0, score_mod=mod,
                           compute_dtype=torch.float64)

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradcheck_alibi_gqa():
    q, k, v, pos_q, pos_k = _gradcheck_inputs(H=4, G=2)
    mod = ScoreMod(kind="alibi", params={"slopes": alibi_slopes(4, 2).double()})
    assert torch.autograd.gradcheck(
        lambda q, k, v: R.attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, scale=0.5, score_mod=mod,
                                    compute_dtype=torch.float64), (q, k, v))


def test_reference_backend_varlen_is_a_per_document_loop():
    H, D = 2, 8
    lens = [5, 1, 9]
    T = sum(lens)
    q, k, v = _rand(1, H, T, D, seed=1), _rand(1, H, T, D, seed=2), _rand(1, H, T, D, seed=3)
    pos = torch.cat([torch.arange(n) for n in lens])[None]  # positions restart per document
    cu = torch.tensor([0, 5, 6, 15])
    mod = _mod("pope", H, D)
    out = R.ReferenceBackend()(q, k, v, pos_q=pos, pos_k=pos, scale=D**-0.5, causal=True, score_mod=mod,
                               cu_seqlens=cu)
    for a, b in ((0, 5), (5, 6), (6, 15)):
        seg = R.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], pos_q_BT=pos[:, a:b], pos_k_BS=pos[:, a:b],
                          scale=D**-0.5, score_mod=mod)
        assert torch.equal(out[:, :, a:b], seg)
    packed = R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D**-0.5, score_mod=mod)
    assert not torch.allclose(packed[:, :, 6:], out[:, :, 6:])  # without cu_seqlens documents leak
    with pytest.raises(ValueError, match="cu_seqlens"):
        R.ReferenceBackend()(q, k, v, pos_q=pos, pos_k=pos, scale=1.0, causal=True, score_mod=None,
                             cu_seqlens=torch.tensor([0, 5, 14]))


def test_input_validation_names_the_value():
    q, k, v = _rand(1, 2, 3, 4), _rand(1, 2, 3, 4), _rand(1, 2, 3, 4)
    pos = torch.arange(3)[None]
    kw = {"scale": 1.0}
    with pytest.raises(TypeError, match="bfloat16"):
        R.attention(q, k, v, pos_q_BT=pos.to(torch.bfloat16), pos_k_BS=pos, **kw)
    with pytest.raises(ValueError, match=r"\(1, 4\)"):
        R.attention(q, k, v, pos_q_BT=torch.arange(4)[None], pos_k_BS=pos, **kw)
    with pytest.raises(ValueError, match="float16"):
        R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, compute_dtype=torch.float16, **kw)
    with pytest.raises(ValueError, match="width"):
        R.attention(q, _rand(1, 2, 3, 5), v, pos_q_BT=pos, pos_k_BS=pos, **kw)
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos,
                    score_mod=ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(4),
                                                            "delta": torch.zeros(3, 4)}), **kw)
    with pytest.raises(ValueError, match="D_A=0"):
        R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, score_mod=ScoreMod(kind="tapa", params={"theta": 0.2}),
                    **kw)


def test_pre_expanded_pope_with_narrow_v_matches_fused_reference():
    B, H, G, T, D = 1, 4, 2, 63, 60
    q, k, v = _rand(B, H, T, D, seed=1), _rand(B, G, T, D, seed=2), _rand(B, G, T, D, seed=3)
    pos = torch.arange(T)[None] + 3
    mod = _mod("pope", H, D)
    p = mod.params
    for layout in ("concat", "interleaved"):
        q_hat, k_hat = pope_expand(q, k, pos_q_BT=pos, pos_k_BS=pos, inv_freq_D=p["inv_freq"],
                                     delta_HD=p["delta"], amplitude="softplus", layout=layout)
        assert q_hat.shape == (B, H, T, 2 * D) and k_hat.shape == (B, G, T, 2 * D)
        out = R.attention(q_hat, k_hat, v, pos_q_BT=pos, pos_k_BS=pos, scale=D**-0.5)
        fused = R.attention(q, k, v, pos_q_BT=pos, pos_k_BS=pos, scale=D**-0.5, score_mod=mod)
        assert_close(f"pope-expanded-{layout}", fused, out, 2e-6)


def test_reference_logits_scale_the_score_and_add_the_alibi_bias_unscaled():
    H, T, D = 4, 6, 8
    q, k = _rand(1, H, T, D, seed=1), _rand(1, H, T, D, seed=2)
    pos = torch.tensor([[0, 2, 3, 7, 8, 20]])
    mod = _mod("alibi", H, D)
    dot = q.double() @ k.double().transpose(-1, -2)
    dist = (pos[0][:, None] - pos[0][None, :]).double()
    bias = -mod.params["slopes"].double()[:, None, None] * dist
    got = R.logits(q, k, pos_q_BT=pos, pos_k_BS=pos, scale=0.3, score_mod=mod)
    assert_close("alibi-logits", 0.3 * dot + bias, got, 1e-6)
    assert torch.equal(R.scores(q, k, pos_q_BT=pos, pos_k_BS=pos, score_mod=mod), q @ k.transpose(-1, -2))
    assert bool((bias[H // 2:] == 0).all()) and bool((bias[0] != 0).any())  # half the heads are NoPE
    tapa = _mod("tapa", H, D)
    assert torch.equal(R.logits(q, k, pos_q_BT=pos, pos_k_BS=pos, scale=1.0, score_mod=tapa),
                       R.scores(q, k, pos_q_BT=pos, pos_k_BS=pos, score_mod=tapa))


def test_alibi_slopes_are_press_et_al():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -(j + 1) for j in range(8)]))
    assert torch.equal(alibi_slopes(4, 2), torch.tensor([2.0**-4, 2.0**-8, 0.0, 0.0]))
    with pytest.raises(ValueError, match="n_alibi_heads=5"):
        alibi_slopes(4, 5)
