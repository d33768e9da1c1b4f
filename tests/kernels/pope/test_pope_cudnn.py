"""PoPE on cuDNN's attention core (kernels/pope/cudnn.py, `pope_attention(impl="cudnn")`):
where it runs, how the backward splits heads, and on the H200 its output and every gradient
against the float64 reference (the 2x calibrated rule, DESIGN §6), one head group or several.

CPU: the routing ("auto" takes "expand" where cuDNN cannot run, an explicit "cudnn" says why).
"""

from __future__ import annotations

import pytest
import torch
from test_triton_pope import triton_grads
from test_triton_pope_expand import assert_calibrated, make_inputs, seeded_like

from phaselab.kernels.pope import cudnn as pope_cudnn
from phaselab.kernels.pope.function import pope_attention
from phaselab.kernels.testing import shape_id


def cudnn_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, *, causal, impl="cudnn", deterministic=False):
    """`triton_grads` with the model's call: trivial positions when causal, not deterministic."""
    return triton_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=causal, impl=impl,
                        trivial_pos=causal, deterministic=deterministic)


def test_head_groups_bound_the_2d_wide_buffers():
    # 64k tokens of 16 heads, D=64, bf16: 64 MiB of q_hat/k_hat/dq_hat/dk_hat a head -> groups of 4
    assert pope_cudnn.head_groups(16, 16, 4096, 4096, 64, 2) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert pope_cudnn.head_groups(64, 8, 48, 48, 64, 2) == [(0, 8)]            # a small model: one call
    assert pope_cudnn.head_groups(1, 3, 2**20, 2**20, 64, 2) == [(0, 1), (1, 2), (2, 3)]  # > budget a head
    assert pope_cudnn.head_groups(4, 6, 16384, 16384, 64, 2) == [(0, 4), (4, 6)]  # the last group smaller


def test_auto_runs_expand_where_cudnn_cannot():
    """On the CPU (interpreter) "auto" is "expand", bitwise; an explicit "cudnn" names the reason."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 2, 2, 19, 19, 32, torch.float32, "cpu")
    do = seeded_like(q)
    auto = cudnn_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True, impl="auto")
    expand = cudnn_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True, impl="expand")
    for a, b in zip(auto, expand):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="cuDNN attention needs a CUDA device"):
        cudnn_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True)


def test_unsupported_reasons_name_the_constraint():
    q, *_ = make_inputs(1, 4, 2, 8, 8, 32, torch.bfloat16, "cpu")
    reason = pope_cudnn.unsupported_reason
    assert "not deterministic" in reason(q, q, causal=True, trivial_pos=True, deterministic=True)
    assert "CUDA device" in reason(q, q, causal=True, trivial_pos=True, deterministic=False)
    with pytest.raises(ValueError, match="trivial_pos=True needs T == S"):
        q2, k2, v2, pq, pk, f, d = make_inputs(1, 2, 2, 5, 9, 32, torch.float32, "cpu")
        pope_attention(q2, k2, v2, pos_q_BT=pq, pos_k_BS=pk, inv_freq_D=f, delta_HD=d, trivial_pos=True)
    with pytest.raises(ValueError, match="expected auto or one of"):
        q2, k2, v2, pq, pk, f, d = make_inputs(1, 2, 2, 5, 5, 32, torch.float32, "cpu")
        pope_attention(q2, k2, v2, pos_q_BT=pq, pos_k_BS=pk, inv_freq_D=f, delta_HD=d, impl="cuDNN")


@pytest.mark.gpu
def test_gpu_reasons():
    q, k, *_ = make_inputs(1, 4, 2, 8, 8, 64, torch.bfloat16, "cuda")
    reason = pope_cudnn.unsupported_reason
    assert "grouped-query" in reason(q, k, causal=True, trivial_pos=True, deterministic=False)
    assert "arbitrary positions" in reason(q, q, causal=True, trivial_pos=False, deterministic=False)
    assert reason(q, q, causal=False, trivial_pos=False, deterministic=False) is None
    assert "bf16/fp16" in reason(q.float(), q.float(), causal=True, trivial_pos=True, deterministic=False)
    wide = q.new_zeros(1, 4, 8, 128)
    assert "at most 128" in reason(wide, wide, causal=True, trivial_pos=True, deterministic=False)


GPU_CASES = [  # (B, H, T, S, D, causal, offset, dtype, group_bytes); causal calls use 0..T-1
    (2, 4, 217, 217, 48, True, 0, torch.float16, None), (1, 8, 1000, 1000, 64, True, 0, torch.bfloat16, None),
    (1, 4, 100, 733, 64, False, 2**24 + 7, torch.bfloat16, None),
    (2, 6, 512, 512, 64, True, 0, torch.bfloat16, 2 * 2 * 1024 * 128 * 2 * 2)]  # two heads a group


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,T,S,D,causal,offset,dtype,group_bytes", GPU_CASES,
                         ids=[shape_id(B=c[0], H=c[1], T=c[2], S=c[3], D=c[4], causal=c[5], off=c[6], dtype=c[7],
                                       groups=c[8] or 0) for c in GPU_CASES])
def test_cudnn_gpu_calibrated(monkeypatch, B, H, T, S, D, causal, offset, dtype, group_bytes):
    if group_bytes is not None:
        monkeypatch.setattr(pope_cudnn, "GROUP_BYTES", group_bytes)
        assert len(pope_cudnn.head_groups(B, H, T, S, D, 2)) == 3
    inputs = make_inputs(B, H, H, T, S, D, dtype, "cuda", offset=offset)
    assert_calibrated("cudnn", cudnn_grads, inputs, causal=causal)


@pytest.mark.gpu
def test_cudnn_gpu_auto_picks_cudnn_and_deterministic_picks_expand(monkeypatch):
    """The model's default call (trivial positions, not deterministic) runs on cuDNN; a call
    that asks for determinism gets the bitwise-reproducible expand path."""
    q, k, v, pos_q, pos_k, inv_freq, delta = make_inputs(1, 4, 4, 256, 256, 64, torch.bfloat16, "cuda")
    seen = []
    real = pope_cudnn.pope_cudnn_fwd
    monkeypatch.setattr(pope_cudnn, "pope_cudnn_fwd", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    do = seeded_like(q)
    cudnn_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True, impl=None)
    assert seen == [1]
    first = cudnn_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True, impl=None, deterministic=True)
    second = cudnn_grads(q, k, v, pos_q, pos_k, inv_freq, delta, do, causal=True, impl=None, deterministic=True)
    assert seen == [1]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
