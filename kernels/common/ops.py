"""What the attention custom ops share (kernels/pope/ops.py `phaselab::pope_fwd/bwd`,
kernels/tapa/ops.py `phaselab::tapa_fwd/bwd`): last-dim density, the vmap rule that folds the
member dimension into the heads, and when an op's body may be called without the dispatcher.

Why custom ops (https://pytorch.org/docs/stable/notes/custom_operators.html):
- torch.compile treats an op as one opaque node, so a compiled model keeps ONE graph through its
  attention calls; dynamo never traces the host-side launch code (it failed on it: fp64 scalar
  arguments, "ListVariable is already tracked for mutation"), and the compiled regions around
  attention are not cut at every layer;
- `register_vmap` lets `torch.func.vmap` stack K models (benchmarks/ensemble.py): the member
  dimension is folded into the heads, so K members are one launch with K*H heads (PoPE's delta,
  a per-member parameter [K, H, D], becomes [K*H, D]); an autograd.Function without a vmap rule
  cannot run under vmap at all.
"""

from __future__ import annotations

import torch
from torch import Tensor


def plain_eager(*tensors: Tensor) -> bool:
    """True where the dispatcher would add nothing to a custom op's body but autograd: no
    torch.compile tracing, no functorch transform (vmap, grad), no torch function or dispatch
    mode (fake tensors, a `torch.device` context), plain tensors. There a plain
    `torch.autograd.Function` around the op's bodies does what the op's registered autograd does,
    without the op's host time before its kernel starts (`dispatch_adds_nothing`)."""
    return (not torch.compiler.is_compiling()
            and all(type(t) is Tensor for t in tensors)
            and torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._is_torch_function_mode_enabled()
            and torch._C._functorch.peek_interpreter_stack() is None)


def needs_grad(*tensors: Tensor) -> bool:
    """Autograd would record a call on these inputs: grad mode on and one of them requires grad."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def dispatch_adds_nothing(*tensors: Tensor) -> bool:
    """True where calling a custom op's body directly does what calling the op would: `plain_eager`
    and no autograd to record (`needs_grad` false). The dispatcher's hops then only cost host
    time, before the kernel starts: a Gluon TAPA forward took 470 us of the host through the op
    and 234 called directly on an H100 machine (the custom ops' known overhead,
    https://github.com/pytorch/pytorch/issues/139500)."""
    return plain_eager(*tensors) and not needs_grad(*tensors)


def last_dim_dense(*xs: Tensor) -> tuple[Tensor, ...]:
    """The kernels index the last dim with stride 1; a compiled caller may hand over any layout."""
    return tuple(x if x.stride(-1) == 1 else x.contiguous() for x in xs)


def no_aux(q: Tensor, dtype: torch.dtype = torch.int32) -> Tensor:
    return q.new_empty((0,), dtype=dtype)


def members_first(x: Tensor, bdim: int | None, K: int) -> Tensor:
    return x.movedim(bdim, 0) if bdim is not None else x.unsqueeze(0).expand(K, *x.shape)


def fold(x: Tensor, bdim: int | None, K: int) -> Tensor:
    """[K, B, H, L, D] (member dim at bdim, or none) -> [B, K*H, L, D], member-major heads."""
    x_KBHLD = members_first(x, bdim, K)
    _, B, H, L, D = x_KBHLD.shape
    return x_KBHLD.transpose(0, 1).reshape(B, K * H, L, D)


def unfold(y: Tensor, K: int) -> Tensor:
    """[B, K*H, ...] -> [K, B, H, ...]."""
    B, KH = y.shape[:2]
    return y.reshape(B, K, KH // K, *y.shape[2:]).transpose(0, 1)


def per_member(op, info, in_dims, args):
    """The general rule: one call per member (positions or frequencies that differ by member)."""
    outs = []
    for i in range(info.batch_size):
        outs.append(op(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims))))
    return tuple(torch.stack(o) for o in zip(*outs)), (0,) * len(outs[0])
