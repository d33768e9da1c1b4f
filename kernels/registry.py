"""Attention backend registry (DESIGN.md §3.2): names -> lazy "module:Class" targets.

Policy: a backend named in a config never falls back silently. `resolve(name, call)` returns the
backend or raises `BackendUnsupported(name, reason)`. "auto" (interactive use only) tries triton
(CUDA only), then sdpa, then reference, and records what it picked exactly like an explicit
choice. Importing this module does not import torch (the orchestrator and catalog import it
without torch; DESIGN §2), because targets are strings resolved on first use.

Example:
    >>> call = AttnCall.describe(q, k, v, causal=True, score_mod=None)
    >>> backend = resolve("sdpa", call, layer="h.0.attn")
    >>> out = backend(q, k, v, pos_q=pos_q, pos_k=pos_k, scale=0.125, causal=True, score_mod=None)
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from phaselab.kernels.common.options import AttentionOptions
    from phaselab.kernels.common.score_mod import ScoreMod

log = logging.getLogger(__name__)

AUTO = "auto"
_AUTO_ORDER = ("triton", "sdpa", "reference")


@dataclass(frozen=True, slots=True)
class AttnCall:
    """Everything a backend needs to accept or refuse a call (checked when the model is built)."""

    dtype: Any  # torch.dtype; typed loosely so this module never imports torch
    device_type: str
    head_dim: int
    qk_width: int
    causal: bool
    q_shorter_than_k: bool
    varlen: bool
    score_mod: str | None
    needs_grad: bool
    deterministic: bool

    @classmethod
    def describe(cls, q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, causal: bool,
                 score_mod: ScoreMod | None, cu_seqlens: Tensor | None = None,
                 deterministic: bool = False, needs_grad: bool | None = None) -> AttnCall:
        """The AttnCall of concrete tensors (head_dim = v's width; qk_width = q's width)."""
        if needs_grad is None:
            needs_grad = any(t.requires_grad for t in (q_BHTD, k_BGSD, v_BGSD))
        return cls(dtype=q_BHTD.dtype, device_type=q_BHTD.device.type, head_dim=v_BGSD.shape[-1],
                   qk_width=q_BHTD.shape[-1], causal=causal,
                   q_shorter_than_k=q_BHTD.shape[-2] < k_BGSD.shape[-2], varlen=cu_seqlens is not None,
                   score_mod=None if score_mod is None else score_mod.kind, needs_grad=needs_grad,
                   deterministic=deterministic)


class BackendUnsupported(RuntimeError):
    """A named backend cannot run this call; `reason` says why (never a silent fallback)."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"attention backend {backend!r} unsupported: {reason}")
        self.backend = backend
        self.reason = reason


@runtime_checkable
class AttentionBackend(Protocol):
    name: ClassVar[str]

    def unsupported_reason(self, call: AttnCall) -> str | None: ...

    def __call__(self, q_BHTD: Tensor, k_BGSD: Tensor, v_BGSD: Tensor, *, pos_q: Tensor, pos_k: Tensor,
                 scale: float, causal: bool, score_mod: ScoreMod | None,
                 cu_seqlens: Tensor | None = None, trivial_pos: bool = False,
                 deterministic: bool = False, options: AttentionOptions | None = None) -> Tensor: ...
    # trivial_pos: the caller guarantees pos_q == pos_k == 0..T-1 (T == S) without looking at
    # them, so a backend may take a fast path (sdpa: is_causal) with no device sync (a sync per attention call is also a graph break under torch.compile)
    # deterministic: the model's `attention.deterministic`; a backend with a faster non-deterministic
    # path takes it only when this is False (triton: PoPE on cuDNN's core)
    # options: the model's kernel choices (`attention.options.AttentionOptions`: PoPE implementation,
    # TAPA series, exp2, autotuning); a backend without such choices ignores them


_TARGETS: dict[str, str] = {
    "reference": "phaselab.kernels.attention.reference:ReferenceBackend",
    "sdpa": "phaselab.kernels.attention.sdpa:SdpaBackend",
    "triton": "phaselab.kernels.attention.function:TritonBackend",
}
_INSTANCES: dict[str, AttentionBackend] = {}
_USED: dict[str, str] = {}
_IMPLS: dict[str, dict[str, bool]] = {}   # op -> {implementation: its backward is deterministic}


def register(name: str, target: str) -> None:
    """Register `name` -> lazy "package.module:Class"; re-registering a name differently raises."""
    if not isinstance(name, str) or not name or name == AUTO:
        raise ValueError(f"backend name {name!r} must be a non-empty string other than {AUTO!r}")
    module, sep, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not (sep and module and attr):
        raise ValueError(f"backend target {target!r} must look like 'package.module:Class'")
    if _TARGETS.get(name, target) != target:
        raise ValueError(f"backend {name!r} is already registered as {_TARGETS[name]!r}; "
                         f"refusing to replace it with {target!r}")
    _TARGETS[name] = target


def registered() -> Mapping[str, str]:
    """Read-only view of name -> target."""
    return MappingProxyType(_TARGETS)


def _instance(name: str) -> AttentionBackend:
    if name not in _TARGETS:
        raise ValueError(f"unknown attention backend {name!r}; registered: {sorted(_TARGETS)} "
                         f"or {AUTO!r}")
    if name not in _INSTANCES:
        module_name, _, attr = _TARGETS[name].partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise BackendUnsupported(name, f"cannot load {_TARGETS[name]!r}: {exc}") from exc
        _INSTANCES[name] = cls()
    return _INSTANCES[name]


def _check(name: str, call: AttnCall) -> AttentionBackend:
    backend = _instance(name)
    reason = backend.unsupported_reason(call)
    if reason is not None:
        raise BackendUnsupported(name, reason)
    return backend


def resolve(name: str, call: AttnCall, *, layer: str | None = None) -> AttentionBackend:
    """The backend `name` for `call`, or BackendUnsupported(name, reason); never another backend.

    "auto" tries triton (only when call.device_type == "cuda"), sdpa, reference in that order and
    records its pick under `layer` (or under "auto" when no layer is given). With an explicit
    name the pick is recorded under `layer` when one is given.
    """
    if name != AUTO:
        backend = _check(name, call)
        if layer is not None:
            record_use(layer, name)
        return backend
    reasons = []
    for candidate in _AUTO_ORDER:
        if candidate == "triton" and call.device_type != "cuda":
            continue
        try:
            backend = _check(candidate, call)
        except BackendUnsupported as exc:
            reasons.append(f"{candidate}: {exc.reason}")
            continue
        log.info("attention backend auto -> %s (skipped: %s)", candidate, "; ".join(reasons) or "none")
        record_use(AUTO if layer is None else layer, candidate)
        return backend
    raise BackendUnsupported(AUTO, "; ".join(reasons))


def record_use(layer: str, backend: str) -> None:
    """Record that `layer` runs on `backend` (logged once as the param attn.backend; lineage)."""
    _USED[layer] = backend


def backends_used() -> Mapping[str, str]:
    """A copy of layer -> backend recorded so far."""
    return dict(_USED)


def record_impl(op: str, impl: str, *, deterministic: bool) -> None:
    """Record that ``op`` ("pope", "tapa", "sdpa", ...) ran as ``impl`` ("cudnn", "fused", ...)
    and whether that implementation's backward is deterministic (provenance of a run)."""
    _IMPLS.setdefault(op, {})[impl] = bool(deterministic)


def impls_used() -> Mapping[str, Mapping[str, bool]]:
    """A copy of op -> {implementation: deterministic} recorded so far."""
    return {op: dict(v) for op, v in _IMPLS.items()}


def reset() -> None:
    """Forget the recorded uses (between runs and tests); registrations and instances stay."""
    _USED.clear()
    _IMPLS.clear()
