"""Fused linear + cross-entropy loss of the LM head: autograd Function and public wrapper.

The unfused path materialises bf16 logits, upcasts them for a softmax reduction, keeps them for a
pointwise backward kernel and returns them from the compiled graph: ~7.4 ms of a 72 ms GPT-124M
step on the H200. Here each chunk of rows takes one matmul into a logits buffer, one Triton pass
per row that turns the buffer into the loss's gradient in place (triton_ce.py), and the two
gradient matmuls right away, so the buffer is reused by the next chunk and nothing of size N x V
outlives the forward:
    G = d(loss)/d(logits)                      (Triton, in place, input dtype)
    grad_h = G @ W,  grad_W = G^T @ h          (saved; the backward multiplies them by the
                                                incoming scalar gradient g)
Spec: `reference.linear_cross_entropy`; tests: tests/kernels/loss/test_linear_ce.py.

Example:
    >>> loss = linear_cross_entropy(h_NC, model.lm_head.weight, y_N, mask_N, vocab_size=50257)
    >>> loss.backward()
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from phaselab.kernels.loss.reference import row_weights

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _fwd_bwd(h: Tensor, weight: Tensor, targets: Tensor, weight_N: Tensor, vocab_size: int,
             chunk_rows: int | None, needs_grad: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(loss fp32 [], grad_h [N, C] or None, grad_W [V_pad, C] or None) for g = 1, chunk by chunk."""
    # imported here, not at module level: importing the model must not import triton (the CPU
    # path never launches it), and this runs outside torch.compile's graph (see the wrapper)
    from phaselab.kernels.loss import triton_ce

    N = h.shape[0]
    rows = N if chunk_rows is None else min(chunk_rows, N)
    w_sum = weight_N.sum()  # stays on the device; the kernel reads it by pointer (no host sync)
    loss_N = torch.empty(N, dtype=torch.float32, device=h.device)
    buf = torch.empty((rows, weight.shape[0]), dtype=h.dtype, device=h.device)
    grad_h = torch.empty_like(h) if needs_grad else None
    # one chunk: grad_W is one matmul; several: fp32 accumulation across chunks (then cast once)
    grad_w32 = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if needs_grad and rows < N else None
    grad_w = None
    for start in range(0, N, rows):
        end = min(start + rows, N)
        x_NV = buf[: end - start]
        torch.mm(h[start:end], weight.t(), out=x_NV)  # [n, C] @ [C, V_pad] -> logits [n, V_pad]
        triton_ce.ce_rows_(x_NV, targets[start:end], weight_N[start:end], w_sum, loss_N[start:end], vocab_size)
        if not needs_grad:
            continue
        torch.mm(x_NV, weight, out=grad_h[start:end])  # [n, V_pad] @ [V_pad, C] -> [n, C]
        part_VC = x_NV.t() @ h[start:end]  # [V_pad, n] @ [n, C] -> [V_pad, C]
        if grad_w32 is None:
            grad_w = part_VC
        else:
            grad_w32 += part_VC
    if grad_w32 is not None:
        grad_w = grad_w32.to(weight.dtype)
    return loss_N.sum() / w_sum, grad_h, grad_w


class LinearCrossEntropyFunction(torch.autograd.Function):
    """loss = sum_i w_i nll_i / sum_i w_i of h @ W^T; gradients for h and W (computed in forward)."""

    @staticmethod
    def forward(ctx, h, weight, targets, weight_N, vocab_size, chunk_rows):
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # the matmuls run in the inputs' dtype, as given: an outer autocast must not re-cast them
        with torch.autocast(h.device.type, enabled=False):
            loss, grad_h, grad_w = _fwd_bwd(h, weight, targets, weight_N, vocab_size, chunk_rows, needs_grad)
        ctx.save_for_backward(grad_h, grad_w)
        return loss

    @staticmethod
    def backward(ctx, g):
        grad_h, grad_w = ctx.saved_tensors
        # g is an fp32 0-dim tensor: the product keeps the gradients' dtype, computed in fp32
        grad_h = grad_h * g if ctx.needs_input_grad[0] else None
        grad_w = grad_w * g if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None, None


# ----------------------------------------------------------------------------- validation


def _check_tensor(name: str, t: object, ndim: int) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    return t


def _check_inputs(h_NC, weight_VC, targets_N, mask_N, vocab_size, chunk_rows) -> None:
    _check_tensor("h_NC", h_NC, 2)
    _check_tensor("weight_VC", weight_VC, 2)
    _check_tensor("targets_N", targets_N, 1)
    N, C = h_NC.shape
    if N == 0 or C == 0:
        raise ValueError(f"h_NC has shape {tuple(h_NC.shape)}: no rows or no features")
    if weight_VC.shape[1] != C:
        raise ValueError(f"weight_VC has shape {tuple(weight_VC.shape)}, expected [V_pad, C={C}] like h_NC")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= weight_VC.shape[0]:
        raise ValueError(f"vocab_size={vocab_size!r} must be an int in [1, V_pad={weight_VC.shape[0]}]")
    if targets_N.shape != (N,) or targets_N.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets_N must be int64 of shape ({N},), got {targets_N.dtype} {tuple(targets_N.shape)}")
    if mask_N is not None and (_check_tensor("mask_N", mask_N, 1).shape != (N,) or mask_N.is_complex()):
        raise ValueError(f"mask_N must be a real tensor of shape ({N},), got {mask_N.dtype} {tuple(mask_N.shape)}")
    for name, t in (("weight_VC", weight_VC), ("targets_N", targets_N), ("mask_N", mask_N)):
        if t is not None and t.device != h_NC.device:
            raise ValueError(f"{name} is on {t.device}, h_NC is on {h_NC.device}")
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"chunk_rows={chunk_rows!r} must be None or a positive int")


def _check_runnable(h_NC: Tensor) -> None:
    """Checked after the arguments (a bad argument is named first on every machine)."""
    if h_NC.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"h_NC is on {h_NC.device}: the Triton kernel needs CUDA (or TRITON_INTERPRET=1); "
                         "use reference.linear_cross_entropy on the CPU")


def _compute_dtype(h_NC: Tensor, weight_VC: Tensor) -> torch.dtype:
    """The matmul dtype: autocast's when it is on (fp32 inputs are cast, as nn.Linear's are), else
    the inputs' own, which must agree and be fp16, bf16 or fp32."""
    dtype = h_NC.dtype
    if torch.is_autocast_enabled(h_NC.device.type):
        dtype = torch.get_autocast_dtype(h_NC.device.type)
    elif weight_VC.dtype != dtype:
        raise ValueError(f"h_NC is {h_NC.dtype} but weight_VC is {weight_VC.dtype} (outside autocast they must agree)")
    if dtype not in _DTYPES or h_NC.dtype not in _DTYPES or weight_VC.dtype not in _DTYPES:
        raise ValueError(f"dtypes h_NC={h_NC.dtype}, weight_VC={weight_VC.dtype} (compute {dtype}): the kernel "
                         f"takes {_DTYPES}")
    return dtype


# ----------------------------------------------------------------------------- public wrapper


# Outside torch.compile's graph, as the attention kernels (kernels/attention/function.py): the
# compiled model breaks its graph at the loss and this runs eagerly (the kernel writes its input in
# place and its launches are host code dynamo need not trace).
@torch.compiler.disable
def linear_cross_entropy(h_NC: Tensor, weight_VC: Tensor, targets_N: Tensor, mask_N: Tensor | None = None, *,
                         vocab_size: int, chunk_rows: int | None = None) -> Tensor:
    """Fused sum_i w_i nll_i / sum_i w_i of the linear head h @ W^T, differentiable in h and W.

    Semantics: `reference.linear_cross_entropy` (= `masked_cross_entropy` of the model): w_i =
    (target_i >= 0) * mask_i; an all-zero weight gives NaN, not 0; columns >= vocab_size of the
    padded head are excluded (zero probability, zero gradient). Logits come from the matmul in the
    compute dtype (autocast's when on); log-sum-exp, softmax and the loss in fp32.

    Args:
        h_NC: hidden states [N, C] (the final norm's output, B*T rows), fp16 / bf16 / fp32.
        weight_VC: head weight [V_pad, C] (e.g. `lm_head.weight`), h's dtype unless under autocast.
        targets_N: int64 (or int32) [N], -1 = ignored; others must be < vocab_size (not checked:
            that would be a host sync every step).
        mask_N: real loss weights [N] (0 = not scored) or None (default: all ones).
        vocab_size: real columns, 1 <= vocab_size <= V_pad.
        chunk_rows: rows per logits buffer (memory ~ chunk_rows * V_pad); grad_W then accumulates
            in fp32 across chunks. Default None: all rows at once.
    Returns:
        loss, fp32 scalar tensor on h's device.
    Raises:
        ValueError naming the offending argument (shapes, dtypes, devices, CPU without the
        interpreter); TypeError for a non-tensor.
    """
    _check_inputs(h_NC, weight_VC, targets_N, mask_N, vocab_size, chunk_rows)
    dtype = _compute_dtype(h_NC, weight_VC)
    _check_runnable(h_NC)
    h, weight = h_NC.to(dtype).contiguous(), weight_VC.to(dtype).contiguous()
    targets = targets_N.to(torch.int64).contiguous()
    weight_N = row_weights(targets, mask_N).contiguous()
    return LinearCrossEntropyFunction.apply(h, weight, targets, weight_N, vocab_size, chunk_rows)
