"""The bias-table attention kernel (kernels/relbias) against its float64 reference: the output and
every gradient (dq, dk, dv, d table) over awkward shapes.

CPU: TRITON_INTERPRET=1 (tests/kernels/conftest.py; NaN-poisoned outputs) with 16x16 tiles:
lengths no block divides, GQA, T < S, positions offset, strided, shuffled (the d table by
atomics), non-causal (negative distances), index positions. GPU (`gpu`): bf16 / fp16 at the
shipped tiles, head dims 16..128.
"""

from __future__ import annotations

import os

import pytest
import torch

from phaselab.kernels.relbias import distance_range, relbias_attention
from phaselab.kernels.relbias import reference as ref
from phaselab.kernels.testing import assert_close, generator

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                       reason="CPU interpreter test; the gpu tests cover CUDA")


def _positions(kind: str, B: int, T: int, S: int, device: str = "cpu", seed: int = 5):
    ar = torch.arange(S, device=device)
    if kind == "offset":        # consecutive from 2**24 + 7: the tile-diagonal reduction
        pk = (ar + 2**24 + 7)[None]
    elif kind == "strided":     # sorted, not consecutive: block bounds by bisection, d table by atomics
        pk = torch.stack([3 * ar + 11 * b for b in range(B)])
    elif kind == "shuffled":    # no block skipping; the first queries see no key
        pk = ar[torch.randperm(S, generator=generator(seed))][None].to(device)
        pq = ar[S - T:][None].clone()
        pq[0, :2] = -1
        return pq, pk
    else:                       # "index"
        pk = ar[None]
    return pk[:, S - T:].contiguous(), pk


def _case(B, H, G, T, S, D, kind, causal, dtype=torch.float32, device="cpu", seed=0):
    gen = generator(seed, device)
    q = torch.randn(B, H, T, D, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(B, G, S, D, generator=gen, device=device).to(dtype) for _ in range(2))
    do = torch.randn(B, H, T, D, generator=gen, device=device).to(dtype)
    pq, pk = _positions(kind, B, T, S, device)
    trivial = kind == "index" and T == S
    d_min, n_dist = distance_range(pq, pk, causal=causal, trivial_pos=trivial)
    table = 0.5 * torch.randn(H, n_dist, generator=gen, device=device)
    return q, k, v, do, table, pq, pk, d_min, trivial


def _grads(fn, q, k, v, table, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, table)]
    out = fn(*leaves)
    out.backward(do.to(out.dtype))
    return out, *[t.grad for t in leaves]


def _compare(case, causal, ratio):
    q, k, v, do, table, pq, pk, d_min, trivial = case
    got = _grads(lambda *a: relbias_attention(*a, pos_q_BT=pq, pos_k_BS=pk, d_min=d_min, causal=causal,
                                              trivial_pos=trivial), q, k, v, table, do)
    want = _grads(lambda *a: ref.relbias_attention(*a, pos_q_BT=pq, pos_k_BS=pk, d_min=d_min, causal=causal,
                                                   compute_dtype=torch.float64),
                  *(t.double() for t in (q, k, v, table)), do.double())
    for name, w, g in zip(("out", "dq", "dk", "dv", "dtable"), want, got, strict=True):
        assert_close(name, w, g, ratio)
    return got


CASES = [  # B, H, G, T, S, D, positions, causal
    (1, 2, 1, 33, 33, 16, "index", True),       # ragged N, GQA 2:1, index positions (no position loads)
    (1, 4, 2, 21, 21, 32, "offset", True),     # consecutive from 2**24: d table by tile diagonals
    (1, 2, 2, 13, 29, 16, "index", True),      # T < S (decode-style, bottom-right)
    (2, 2, 1, 21, 30, 16, "strided", True),    # d table by atomics
    (1, 2, 1, 19, 19, 16, "shuffled", True),   # rows that see no key, unsorted keys
    (1, 2, 1, 19, 23, 24, "offset", False),    # non-causal: negative distances; D = 24 padded to 32
]


@needs_interpreter
@pytest.mark.parametrize("B,H,G,T,S,D,kind,causal", CASES, ids=[f"{c[6]}-T{c[3]}-S{c[4]}-G{c[2]}-D{c[5]}"
                                                                + ("" if c[7] else "-noncausal") for c in CASES])
def test_relbias_matches_the_float64_reference(B, H, G, T, S, D, kind, causal):
    _compare(_case(B, H, G, T, S, D, kind, causal), causal, 1e-5)


@needs_interpreter
def test_the_table_gradient_is_bitwise_deterministic_and_index_positions_equal_explicit_ones():
    q, k, v, do, table, pq, pk, _, trivial = _case(1, 1, 1, 30, 30, 16, "index", True, seed=3)
    assert trivial
    first = _grads(lambda *a: relbias_attention(*a, pos_q_BT=pq, pos_k_BS=pk, trivial_pos=True), q, k, v, table, do)
    again = _grads(lambda *a: relbias_attention(*a, pos_q_BT=pq, pos_k_BS=pk, trivial_pos=True), q, k, v, table, do)
    explicit = _grads(lambda *a: relbias_attention(*a, pos_q_BT=pq, pos_k_BS=pk), q, k, v, table, do)
    for a, b, c in zip(first, again, explicit, strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
    assert first[4].abs().min() > 0   # every distance 0..29 is seen, so every entry has a gradient


@needs_interpreter
def test_a_table_without_grad_gets_none_and_the_same_input_gradients():
    q, k, v, do, table, pq, pk, d_min, _ = _case(1, 2, 2, 17, 17, 16, "offset", True, seed=4)
    table = table.detach()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    relbias_attention(*leaves, table, pos_q_BT=pq, pos_k_BS=pk, d_min=d_min).backward(do)
    with_table = _grads(lambda *a: relbias_attention(*a, pos_q_BT=pq, pos_k_BS=pk, d_min=d_min), q, k, v, table, do)
    for leaf, g in zip(leaves, with_table[1:4], strict=True):
        torch.testing.assert_close(leaf.grad, g, rtol=0, atol=0)


def _kernel_grads(case, flags, causal):
    """out, lse, dq, dk, dv, d table straight from the kernels' host functions with these flags."""
    from phaselab.kernels.relbias import triton_relbias

    q, k, v, do, table, pq, pk, d_min, _ = case
    scale = q.shape[-1] ** -0.5
    out, lse = triton_relbias.relbias_fwd(q, k, v, table, pq, pk, flags, d_min, scale=scale, causal=causal)
    grads = triton_relbias.relbias_bwd(do, q, k, v, out, lse, table, pq, pk, flags, d_min, scale=scale,
                                       causal=causal, need_dbias=True)
    return out, lse, *grads


@needs_interpreter
@pytest.mark.parametrize("T,S,causal", [(40, 40, True), (21, 37, True), (19, 23, False)])
def test_consecutive_positions_take_the_strip_path_and_match_the_gathered_one(T, S, causal):
    from phaselab.kernels.flash.triton_flash import pos_flags

    case = _case(1, 2, 1, T, S, 16, "offset", causal, seed=7)
    flags = pos_flags(case[5], case[6])
    assert int(flags[0]) & 4   # consecutive: the strip path (`_toeplitz`, `_diag_blocks`)
    strip = _kernel_grads(case, flags, causal)
    gathered = _kernel_grads(case, flags & ~4, causal)   # the per-score fallback (atomics for d table)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dtable"), strip, gathered, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6, msg=name)
    # the flag alone selects the path: strided positions declared consecutive read the wrong biases
    strided = _case(1, 2, 1, T, S, 16, "strided", causal, seed=7)
    honest = _kernel_grads(strided, pos_flags(strided[5], strided[6]), causal)
    lied = _kernel_grads(strided, pos_flags(strided[5], strided[6]) | 4, causal)
    assert (honest[0] - lied[0]).abs().max() > 1e-2


def test_distance_range_covers_every_visible_pair():
    pk = torch.tensor([[3, 5, 9]])
    pq = torch.tensor([[6, 11]])
    assert distance_range(pq, pk, causal=True) == (0, 9)      # 11 - 3 + 1
    assert distance_range(pq, pk, causal=False) == (-3, 12)   # 6 - 9 .. 11 - 3
    assert distance_range(pq, pq, causal=True, trivial_pos=True) == (0, 2)


def test_reference_refuses_a_table_that_misses_a_visible_distance():
    q = torch.randn(1, 2, 4, 8)
    pos = torch.arange(4)[None]
    with pytest.raises(ValueError, match=r"outside the table \[0, 3\)"):
        ref.relbias_attention(q, q, q, torch.zeros(2, 3), pos_q_BT=pos, pos_k_BS=pos)


def test_the_public_op_refuses_a_bad_table_by_shape_and_dtype():
    q = torch.randn(1, 2, 4, 8)
    pos = torch.arange(4)[None]
    with pytest.raises(ValueError, match=r"table must be fp32 \[H=2"):
        relbias_attention(q, q, q, torch.zeros(3, 4), pos_q_BT=pos, pos_k_BS=pos)
    with pytest.raises(ValueError, match="table must be fp32"):
        relbias_attention(q, q, q, torch.zeros(2, 4, dtype=torch.float64), pos_q_BT=pos, pos_k_BS=pos)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind,T,S,G", [("index", 1000, 1000, 4), ("offset", 777, 2049, 2), ("strided", 300, 300, 4)])
def test_relbias_on_cuda_matches_the_float64_reference(D, dtype, kind, T, S, G):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    case = _case(2, 8, G, T, S, D, kind, True, dtype=dtype, device="cuda")
    # 16-bit inputs: the reference runs on the same rounded q, k, v in float64
    _compare(case, True, 2e-2 if dtype == torch.bfloat16 else 5e-3)


@pytest.mark.gpu
def test_relbias_table_gradient_is_bitwise_deterministic_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v, do, table, pq, pk, _, _ = _case(4, 16, 16, 2048, 2048, 64, "index", True, dtype=torch.bfloat16,
                                             device="cuda")
    runs = [_grads(lambda *a: relbias_attention(*a, pos_q_BT=pq, pos_k_BS=pk, trivial_pos=True), q, k, v, table, do)
            for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)
