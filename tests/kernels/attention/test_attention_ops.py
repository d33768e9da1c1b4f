"""The custom ops around the Triton kernels (kernels/pope/ops.py, kernels/tapa/ops.py): torch.compile keeps one
graph through them (fullgraph=True raises at any graph break) with the same values and gradients
as eager, the op schemas pass torch.library's checks, and vmap over K stacked members (PoPE's
delta per member) equals K separate calls.

CPU: TRITON_INTERPRET=1 on tiny shapes (tests/kernels/conftest.py sets it without CUDA); the
compile tests use the aot_eager backend (dynamo + AOTAutograd with fake tensors, no C++ build).
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.func import vmap

from phaselab.kernels.pope import ops as pope_ops
from phaselab.kernels.pope.function import pope_attention
from phaselab.kernels.tapa import ops as tapa_ops
from phaselab.kernels.tapa.function import tapa_attention
from phaselab.kernels.testing import assert_close, pope_inputs

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                reason="CPU interpreter test; the gpu tests cover CUDA")


def _pope(impl):
    def attend(q, k, v, pos_q, pos_k, inv_freq, delta):
        return pope_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, inv_freq_D=inv_freq, delta_HD=delta,
                              impl=impl)
    return attend


def _tapa(q, k, v, pos_q, pos_k, inv_freq, delta):
    return tapa_attention(q, k, v, pos_q_BT=pos_q, pos_k_BS=pos_k, alpha=0.2, theta=0.5)


def _leaves(seed=3, shape=(1, 4, 2, 13, 13, 16)):
    q, k, v, pos_q, pos_k, inv_freq, delta = pope_inputs(*shape, torch.float32, "cpu", seed=seed)
    return [t.requires_grad_() for t in (q, k, v, delta)], pos_q, pos_k, inv_freq


def _loss_and_grads(attend, w_D, seed=3):
    """A tiny block around the attention: a projection in front (compiled with it), a loss after."""
    (q, k, v, delta), pos_q, pos_k, inv_freq = _leaves(seed)

    def f(q, k, v, delta):
        out = attend(torch.tanh(q * w_D), k, v, pos_q, pos_k, inv_freq, delta)
        return (out * out).sum() + out.mean()
    return f, (q, k, v, delta)


@pytest.mark.parametrize("attend", [_pope("expand"), _pope("fused"), _tapa], ids=["pope-expand", "pope-fused", "tapa"])
def test_compile_fullgraph_matches_eager(attend):
    w_D = torch.linspace(0.5, 1.5, 16)
    f, leaves = _loss_and_grads(attend, w_D)
    eager = f(*leaves)
    g_eager = torch.autograd.grad(eager, leaves, allow_unused=True)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    g_comp = torch.autograd.grad(compiled, leaves, allow_unused=True)
    assert_close("loss", eager, compiled, 1e-6)
    for name, a, b in zip(("dq", "dk", "dv", "ddelta"), g_comp, g_eager):
        if b is None:  # TAPA has no delta
            assert a is None and name == "ddelta" and attend is _tapa
            continue
        assert torch.isfinite(b).all() and b.abs().max() > 0, name
        assert_close(name, b, a, 1e-6)


def test_dispatch_adds_nothing_only_without_autograd_tracing_transforms_or_modes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from phaselab.kernels.common.ops import dispatch_adds_nothing
    x, leaf = torch.zeros(2, 3), torch.zeros(2, 3, requires_grad=True)
    assert dispatch_adds_nothing(x) and not dispatch_adds_nothing(x, leaf)
    with torch.no_grad():
        assert dispatch_adds_nothing(x, leaf)
    assert not dispatch_adds_nothing(torch.nn.Parameter(torch.zeros(2), requires_grad=False))   # a subclass
    with FakeTensorMode():
        assert not dispatch_adds_nothing(x)
    with torch.device("cpu"):   # a torch function mode
        assert not dispatch_adds_nothing(x)
    seen = []
    vmap(lambda t: seen.append(dispatch_adds_nothing(t)) or t)(torch.zeros(2, 3))
    assert seen == [False]


def test_tapa_without_autograd_calls_the_op_body_with_the_same_values(monkeypatch):
    """No grad: tapa_attention runs the op's body directly (the op itself refused here) and gives
    the values the op gives where the dispatcher has work (a torch function mode), where the op
    is called."""
    (q, k, v, _), pos_q, pos_k, inv_freq = _leaves()
    with torch.no_grad(), torch.device("cpu"):
        with_op = _tapa(q, k, v, pos_q, pos_k, inv_freq, None)

    def refuse(*args):
        raise AssertionError("the dispatcher was called")
    monkeypatch.setattr(tapa_ops, "tapa_fwd", refuse)
    with torch.no_grad():
        direct = _tapa(q, k, v, pos_q, pos_k, inv_freq, None)
    assert direct.abs().max() > 0 and torch.equal(direct, with_op)
    with torch.no_grad(), torch.device("cpu"), pytest.raises(AssertionError, match="dispatcher"):
        _tapa(q, k, v, pos_q, pos_k, inv_freq, None)


def test_tapa_with_autograd_in_eager_runs_the_op_bodies_with_the_ops_values_and_gradients(monkeypatch):
    """Eager with grad: tapa_attention runs `TapaEager` around the op bodies (both ops refused here)
    and gives the values and gradients the ops give where the dispatcher has work (a torch
    function mode sends the call through them)."""
    (q, k, v, _), pos_q, pos_k, inv_freq = _leaves()
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    with torch.device("cpu"):   # a mode: plain_eager is false, the ops run
        through_ops = _tapa(q, k, v, pos_q, pos_k, inv_freq, None)
        grads_ops = torch.autograd.grad((through_ops * w).sum(), (q, k, v))
    assert type(through_ops.grad_fn).__name__ != "TapaEagerBackward"

    def refuse(*args):
        raise AssertionError("the dispatcher was called")
    monkeypatch.setattr(tapa_ops, "tapa_fwd", refuse)
    monkeypatch.setattr(tapa_ops, "tapa_bwd", refuse)
    eager = _tapa(q, k, v, pos_q, pos_k, inv_freq, None)
    assert type(eager.grad_fn).__name__ == "TapaEagerBackward"
    grads = torch.autograd.grad((eager * w).sum(), (q, k, v))
    assert torch.equal(eager, through_ops)
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_ops):
        assert b.abs().max() > 0 and torch.equal(a, b), name


def test_op_schemas_pass_torch_library_checks():
    (q, k, v, delta), pos_q, pos_k, inv_freq = _leaves()
    for impl in ("expand", "fused"):
        torch.library.opcheck(pope_ops.pope_fwd, (q, k, v, delta, pos_q, pos_k, inv_freq, 0.2, True, "softplus", impl,
                                             "poly", False),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    torch.library.opcheck(tapa_ops.tapa_fwd, (q, k, v, pos_q, pos_k, q.shape[-1] // 2, 0.1, 6.28, False, 1.0, True, True,
                                         "split", False, False, "tl"),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def _heads_strided(t):
    """Same values in the model's memory layout: [B, T, H, D] seen as [B, H, T, D]."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2)


def test_backward_fakes_give_the_real_strides_for_the_models_layout():
    """Inductor trusts a fake's strides (assert_size_stride on the real output): with q, k, v
    in the model's [B, T, H, D] memory the gradients come back contiguous, and so must the fakes'."""
    (q, k, v, delta), pos_q, pos_k, inv_freq = _leaves()
    q, k, v = (_heads_strided(t) for t in (q, k, v))
    assert q.stride(1) == q.shape[-1]
    checks = ("test_schema", "test_faketensor")
    for impl in ("expand", "fused"):
        out, lse, aux = pope_ops.pope_fwd(q, k, v, delta.detach(), pos_q, pos_k, inv_freq, 0.2, True, "softplus", impl,
                                     "mufu", False)
        torch.library.opcheck(pope_ops.pope_bwd, (torch.ones_like(out), q, k, v, delta.detach(), out, lse, aux, pos_q,
                                             pos_k, inv_freq, 0.2, True, "softplus", impl, "mufu", False),
                              test_utils=checks)
    cfg = (q.shape[-1] // 2, 0.1, 6.28, False, 1.0, True, True, "mufu", True, False, "tl")
    out, lse = tapa_ops.tapa_fwd(q, k, v, pos_q, pos_k, *cfg)
    torch.library.opcheck(tapa_ops.tapa_bwd, (torch.ones_like(out), q, k, v, out, lse, pos_q, pos_k, *cfg),
                          test_utils=checks)


@pytest.mark.parametrize("kind", ["pope", "tapa"])
def test_vmap_over_members_equals_one_call_each(kind):
    """K=2 members with their own q/k/v (and PoPE delta), positions shared, GQA: the vmap rule
    folds the members into the heads; values and every gradient equal two separate calls."""
    members = [_leaves(seed, shape=(1, 4, 2, 11, 11, 16)) for seed in (1, 2)]
    (_, pos_q, pos_k, inv_freq) = members[0]
    attend = _pope("expand") if kind == "pope" else _tapa
    stacked = [torch.stack([m[0][i].detach() for m in members]).requires_grad_() for i in range(4)]
    out_K = vmap(lambda q, k, v, d: attend(q, k, v, pos_q, pos_k, inv_freq, d))(*stacked)
    w = torch.randn(out_K.shape, generator=torch.Generator().manual_seed(0))
    (out_K * w).sum().backward()
    for i, (leaves, *_rest) in enumerate(members):
        out = attend(*leaves[:3], pos_q, pos_k, inv_freq, leaves[3])
        (out * w[i]).sum().backward()
        assert_close(f"out[{i}]", out, out_K[i], 1e-6)
        for name, s, leaf in zip(("dq", "dk", "dv", "ddelta"), stacked, leaves):
            if leaf.grad is None:
                assert kind == "tapa" and name == "ddelta" and s.grad is None
                continue
            assert leaf.grad.abs().max() > 0
            assert_close(f"{name}[{i}]", leaf.grad, s.grad[i], 1e-6)


@pytest.mark.parametrize("pe", ["rope", "pope", "tapa"])
def test_compiled_model_has_no_graph_break(pe):
    """A 2-layer Transformer on the backend the quickstart's PoPE / TAPA cells use on GPU: dynamo
    captures the whole forward and loss as one graph (before the custom ops: two breaks a layer)."""
    from phaselab.workloads.models.presets import preset
    from phaselab.workloads.models.transformer import Transformer

    backend = "sdpa" if pe == "rope" else "triton"
    model = Transformer(preset("tiny", n_layer=2, d_model=32, n_head=2, block_size=16, dropout=0.0, pe={"kind": pe},
                               attention={"backend": backend}))
    x_BT = torch.randint(0, 10, (2, 16), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda x: model(x, targets_BT=x, logits=True)[1])(x_BT)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("kind", ["pope", "tapa"])
def test_inputs_strided_in_the_last_dim_equal_dense_ones(kind):
    """The ops make q, k, v dense in the last dim (the kernels index it with stride 1)."""
    (q, k, v, delta), pos_q, pos_k, inv_freq = _leaves()
    attend = _pope("expand") if kind == "pope" else _tapa
    q_t = q.detach().transpose(-1, -2).contiguous().transpose(-1, -2)   # same values, stride(-1) = T
    assert q_t.stride(-1) != 1
    dense = attend(q.detach(), k.detach(), v.detach(), pos_q, pos_k, inv_freq, delta.detach())
    assert_close("out", dense, attend(q_t, k.detach(), v.detach(), pos_q, pos_k, inv_freq, delta.detach()), 0.0)
