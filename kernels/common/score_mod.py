"""Score modifiers: the part of a positional encoding that lives *inside* the attention logit.

A `ScoreMod` tells an attention backend what to compute in place of the plain dot product
(MATH.md §3 PoPE, §4 TAPA, §5 ALiBi). Its `params` are validated and completed with the MATH
defaults at construction, so every backend reads the same, explicit values:

    pope:  {"inv_freq": Tensor[D] (theta_c = base**(-c/D)), "delta": Tensor[H, D] | None,
            "amplitude": "softplus" | "relu" | "identity"}
    tapa:  {"alpha": 0.1, "theta": 0.5, "phase_scale": 2*pi, "phase": "quadratic" | "linear"}
    alibi: {"slopes": Tensor[H] (0 for heads without ALiBi)}
    relbias: {"table": (dist int64 [N], dtype) -> Tensor[H, N] (see `bias_table`), "name": the encoding's kind}
    custom: {"fn": score -> score (see `apply_score_fn`), "name": the encoding's kind}

"relbias" is a score modification that depends only on (head, pos_q - pos_k) and its parameters,
added to the scaled score: logit = scale * <q, k> + table[h, pos_q - pos_k]. Its table is plain
PyTorch (differentiable in the encoding's parameters); on CUDA it runs in the bias-table flash
kernel of `phaselab.kernels.relbias`, whose backward returns the table's gradient.

For `pope` and `tapa` the q and k handed to the backend are the RAW projections (D wide,
pre-softplus, un-rotated). `reference.logits(q, k, ..., score_mod=mod)` is the spec every fused
kernel must match (reference.py imports this module, never the other way round).

Example:
    >>> mod = ScoreMod(kind="pope", params={"inv_freq": pope_inv_freq(64), "delta": None})
    >>> mod.params["amplitude"]
    'softplus'
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch stays a lazy import so that importing this module stays cheap
    import torch
    from torch import Tensor

KINDS = ("pope", "tapa", "alibi", "relbias", "custom")
POPE_AMPLITUDES = ("softplus", "relu", "identity")
TAPA_PHASES = ("quadratic", "linear")

_DEFAULTS: dict[str, dict[str, Any]] = {
    "pope": {"delta": None, "amplitude": "softplus"},
    # MATH §4.2: alpha = 0.1, theta = 0.5, phase_scale = 2*pi (paper); quadratic phase (Eq. 12).
    "tapa": {"alpha": 0.1, "theta": 0.5, "phase_scale": 2.0 * math.pi, "phase": "quadratic"},
    "alibi": {},
    "relbias": {"name": "relbias"},
    "custom": {"name": "custom"},
}
_REQUIRED = {"pope": ("inv_freq",), "tapa": (), "alibi": ("slopes",), "relbias": ("table",), "custom": ("fn",)}


class FrozenParams(Mapping[str, Any]):
    """A read-only mapping that, unlike types.MappingProxyType, survives pickle and deepcopy
    (models holding a ScoreMod are deep-copied and pickled by DeepSpeed and Ray)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_data", dict(data))

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"FrozenParams({self._data!r})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ScoreMod params are read-only")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenParams, (self._data,))


@dataclass(frozen=True, kw_only=True, eq=False)
class ScoreMod:
    """What a kernel computes inside the logit. `params` is completed with defaults and frozen.

    eq=False: params hold tensors, whose `==` is elementwise; identity is the only sound equality.
    """

    kind: Literal["pope", "tapa", "alibi", "relbias", "custom"]
    params: Mapping[str, Any]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ScoreMod.kind={self.kind!r}: expected one of {KINDS}")
        if not isinstance(self.params, Mapping):
            raise TypeError(f"ScoreMod.params must be a mapping, got {type(self.params).__name__}")
        allowed = set(_DEFAULTS[self.kind]) | set(_REQUIRED[self.kind])
        unknown = sorted(set(self.params) - allowed)
        if unknown:
            raise ValueError(f"ScoreMod(kind={self.kind!r}): unknown params {unknown}; "
                             f"allowed: {sorted(allowed)}")
        missing = [key for key in _REQUIRED[self.kind] if key not in self.params]
        if missing:
            raise ValueError(f"ScoreMod(kind={self.kind!r}): missing required params {missing}")
        full = {**_DEFAULTS[self.kind], **self.params}
        _VALIDATORS[self.kind](full)
        object.__setattr__(self, "params", FrozenParams(full))


def tapa_split(head_dim: int, theta: float) -> tuple[int, int]:
    """(D_A, D_P) = (int(theta*D), D - D_A); MATH §4.2: 1 <= D_A <= D-1, else ValueError."""
    d_amp = int(theta * head_dim)
    if not 1 <= d_amp <= head_dim - 1:
        raise ValueError(f"TAPA theta={theta} with head_dim={head_dim} gives D_A={d_amp}, "
                         f"outside [1, {head_dim - 1}] (MATH §4.2; no silent clamping)")
    return d_amp, head_dim - d_amp


def pope_inv_freq(head_dim: int, base: float = 10_000.0) -> Tensor:
    """PoPE frequencies theta_c = base**(-c/D), c = 0..D-1, fp32 [D] (MATH §3.1).

    Computed in float64 and rounded once, exactly like `rotary.scaling.default_inv_freq`, so that
    theta_{2i} equals RoPE's theta_i bit for bit (MATH §3.6).
    """
    import torch

    if not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim={head_dim!r} must be a positive int")
    if not base > 1.0:
        raise ValueError(f"base={base!r} must be > 1")
    c = torch.arange(head_dim, dtype=torch.float64)
    return (float(base) ** (-c / head_dim)).to(torch.float32)


def alibi_slopes(n_heads: int, n_alibi_heads: int | None = None) -> Tensor:
    """Slopes 2**(-8j/H_a) for the first H_a heads (j = 1..H_a), 0 for the rest (MATH §5)."""
    import torch

    n_alibi = n_heads if n_alibi_heads is None else n_alibi_heads
    if not 0 <= n_alibi <= n_heads:
        raise ValueError(f"n_alibi_heads={n_alibi_heads} must be in [0, n_heads={n_heads}]")
    slopes = torch.zeros(n_heads, dtype=torch.float32)
    j = torch.arange(1, n_alibi + 1, dtype=torch.float64)
    slopes[:n_alibi] = (2.0 ** (-8.0 * j / max(n_alibi, 1))).to(torch.float32)
    return slopes


def alibi_table(slopes_H: Tensor, dist: Tensor, dtype: torch.dtype) -> Tensor:
    """ALiBi's bias -slope_h * (m - n) (MATH §5) at signed distances `dist` (int64, any shape),
    [H, *dist.shape] in `dtype`: the formula's one home (the encoding's table, the reference)."""
    return -slopes_H.to(dtype).view(-1, *([1] * dist.ndim)) * dist.to(dtype)[None]


def _check_float_tensor(name: str, value: Any, ndim: int) -> None:
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be floating point (fp32), got dtype {value.dtype}")
    if value.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dim(s), got shape {tuple(value.shape)}")


def _validate_pope(p: dict[str, Any]) -> None:
    _check_float_tensor("pope inv_freq", p["inv_freq"], 1)
    if p["delta"] is not None:
        _check_float_tensor("pope delta", p["delta"], 2)
        if p["delta"].shape[1] != p["inv_freq"].shape[0]:
            raise ValueError(f"pope delta shape {tuple(p['delta'].shape)} must be [H, D] with "
                             f"D = len(inv_freq) = {p['inv_freq'].shape[0]}")
    if p["amplitude"] not in POPE_AMPLITUDES:
        raise ValueError(f"pope amplitude={p['amplitude']!r}: expected one of {POPE_AMPLITUDES}")


def _validate_tapa(p: dict[str, Any]) -> None:
    for key in ("alpha", "theta", "phase_scale"):
        if isinstance(p[key], bool) or not isinstance(p[key], (int, float)) or not math.isfinite(p[key]):
            raise ValueError(f"tapa {key}={p[key]!r} must be a finite number")
    if p["alpha"] <= 0:
        raise ValueError(f"tapa alpha={p['alpha']} must be > 0 (an exponent on |m-n|; MATH §4.2)")
    if not 0.0 < p["theta"] < 1.0:
        raise ValueError(f"tapa theta={p['theta']} must be in (0, 1) (amplitude fraction; MATH §4.2)")
    if p["phase"] not in TAPA_PHASES:
        raise ValueError(f"tapa phase={p['phase']!r}: expected one of {TAPA_PHASES}")


def _validate_alibi(p: dict[str, Any]) -> None:
    _check_float_tensor("alibi slopes", p["slopes"], 1)


def _validate_relbias(p: dict[str, Any]) -> None:
    if not callable(p["table"]):
        raise TypeError(f"relbias table must be callable, got {type(p['table']).__name__}")


def _validate_custom(p: dict[str, Any]) -> None:
    if not callable(p["fn"]):
        raise TypeError(f"custom fn must be callable, got {type(p['fn']).__name__}")


def apply_score_fn(mod: ScoreMod, logits_BHTS: Tensor, pos_q_BT: Tensor, pos_k_BS: Tensor) -> Tensor:
    """A "custom" ScoreMod applied to scaled logits [B, H, T, S]: fn(score, q_pos [B,1,T,1],
    k_pos [B,1,1,S], head [1,H,1,1]) in plain PyTorch (differentiable in the encoding's
    parameters). A result of another shape is a ValueError naming the encoding."""
    import torch

    H = logits_BHTS.shape[1]
    head = torch.arange(H, device=logits_BHTS.device)[None, :, None, None]
    out = mod.params["fn"](logits_BHTS, pos_q_BT[:, None, :, None], pos_k_BS[:, None, None, :], head)
    if not isinstance(out, torch.Tensor) or out.shape != logits_BHTS.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"encoding {mod.params['name']!r}: score() returned {got}, expected the "
                         f"score's shape {tuple(logits_BHTS.shape)} [B, H, T, S]")
    return out


def bias_table(mod: ScoreMod, dist_N: Tensor, n_head: int, dtype: torch.dtype) -> Tensor:
    """A "relbias" ScoreMod's table [n_head, N] at the signed distances dist_N (int64 m - n), in
    `dtype` (fp32 for the kernels, float64 in a reference test). Another shape or a non-float
    result is a ValueError naming the encoding."""
    import torch

    out = mod.params["table"](dist_N, dtype)
    want = (n_head, dist_N.shape[0])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or not out.is_floating_point():
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"encoding {mod.params['name']!r}: bias_table() returned {got}, expected a float "
                         f"tensor of shape {want} [H, len(dist)]")
    return out.to(dtype)


def distance_bias(mod: ScoreMod, pos_q_BT: Tensor, pos_k_BS: Tensor, n_head: int, dtype: torch.dtype) -> Tensor:
    """A "relbias" ScoreMod's additive bias [B, H, T, S] in `dtype`: its table over the distances
    that occur, gathered at m - n (exact int64 before any conversion)."""
    import torch

    dist_BTS = pos_q_BT.to(torch.int64)[:, :, None] - pos_k_BS.to(torch.int64)[:, None, :]
    if dist_BTS.numel() == 0:
        return torch.zeros((dist_BTS.shape[0], n_head, *dist_BTS.shape[1:]), dtype=dtype, device=pos_q_BT.device)
    lo, hi = int(dist_BTS.min()), int(dist_BTS.max())
    table_HN = bias_table(mod, torch.arange(lo, hi + 1, device=pos_q_BT.device), n_head, dtype)
    return table_HN[:, dist_BTS - lo].transpose(0, 1)


_VALIDATORS = {"pope": _validate_pope, "tapa": _validate_tapa, "alibi": _validate_alibi,
               "relbias": _validate_relbias, "custom": _validate_custom}
