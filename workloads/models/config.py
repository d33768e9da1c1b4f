"""Model configs (CONTRACTS §3.2): frozen kw-only dataclasses, parsed by `workloads.config`.

No torch here: the orchestrator hashes and validates these without loading it. Defaults that
the papers leave open are phaselab decisions, cited to MATH.md / EXPERIMENTS.md §6. RoPE's
settings are the rotary kernel's own torch-free `RopeConfig` (`pe.rope`); the model supplies its
head_dim, and a `ContextExtension` overrides some of its fields.

Example:
    >>> from phaselab.workloads.config import from_dict
    >>> cfg = from_dict(ModelConfig, {"vocab_size": 66, "block_size": 48, "n_layer": 2,
    ...                               "n_head": 4, "d_model": 128, "pe": {"kind": "pope"}})
    >>> cfg.head_dim, cfg.kv_heads, cfg.pe.pope.delta_constraint
    (32, 4, 'project')
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from phaselab.kernels.common.options import AttentionOptions, Exp2Mode, FlashImpl, PopeImpl
from phaselab.kernels.rotary.config import RopeConfig
from phaselab.kernels.rotary.config import Scaling as ScalingRule

# A kind is a name in the encoding registry (`pe_registry`: built-ins, `phaselab.encodings` entry
# points) or a "package.module:Class" string; there is no closed list (docs/EXTENDING.md).
PEKind = str


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True, kw_only=True, slots=True)
class PopeConfig:
    """PoPE (MATH §3). delta_init: the paper uses "uniform" for II/JSB/MAESTRO/genome and "zero"
    for OpenWebText (MATH §3.2); presets set it explicitly."""

    base: float = 10_000.0
    delta_init: Literal["zero", "uniform"] = "zero"
    delta_constraint: Literal["project", "clamp"] = "project"  # MATH §3.2 phaselab's choice
    amplitude: Literal["softplus", "relu", "identity"] = "softplus"
    learn_delta: bool = True
    softmax_scale: Literal["inv_sqrt_d", "inv_sqrt_2d"] | float = "inv_sqrt_d"  # MATH §3.4
    # expand=False: the backend gets raw q/k and a "pope" ScoreMod (reference/triton: polar form;
    # sdpa expands internally). expand=True: the model expands q/k to the Cartesian 2D form in
    # `layout` (MATH §3.3) and any plain-attention backend runs it (qk_width 2D, v stays D).
    expand: bool = False
    layout: Literal["concat", "interleaved"] = "concat"
    # δ's weight decay and lr multiplier (EXPERIMENTS §6 #3) are optimiser settings: they live in
    # the train config (`train.delta_weight_decay`, `train.delta_lr_mult`), one home each.

    def __post_init__(self) -> None:
        _require(self.base > 1.0, f"pope.base={self.base} must be > 1")
        if isinstance(self.softmax_scale, float):
            _require(self.softmax_scale > 0, f"pope.softmax_scale={self.softmax_scale} must be > 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class TapaConfig:
    """TAPA (MATH §4.2): alpha is an exponent on |m-n|; theta the amplitude fraction."""

    alpha: float = 0.1
    theta: float = 0.5
    phase_scale: float = 2.0 * math.pi  # the paper; 1.0 reproduces the released code (§4.2)
    phase: Literal["quadratic", "linear"] = "quadratic"

    def __post_init__(self) -> None:
        _require(self.alpha > 0, f"tapa.alpha={self.alpha} must be > 0 (MATH §4.2)")
        _require(0.0 < self.theta < 1.0, f"tapa.theta={self.theta} must be in (0, 1)")


@dataclass(frozen=True, kw_only=True, slots=True)
class AlibiConfig:
    """ALiBi on the first round(heads_fraction*H) heads, NoPE on the rest (MATH §5).
    slopes: "geometric" = 2^(-8j/H_a), or an explicit list with one slope per ALiBi head."""

    heads_fraction: float = 0.5
    slopes: Literal["geometric"] | tuple[float, ...] = "geometric"

    def __post_init__(self) -> None:
        _require(0.0 < self.heads_fraction <= 1.0,
                 f"alibi.heads_fraction={self.heads_fraction} must be in (0, 1]")


@dataclass(frozen=True, kw_only=True, slots=True)
class PEConfig:
    """Which positional encoding, plus the settings of each kind (only `kind`'s are used).

    kind: a built-in (none, rope, pope, tapa, alibi, sinusoidal, learned), an installed
    `phaselab.encodings` entry point, or "package.module:Class" (docs/EXTENDING.md).
    options: the settings of an encoding that declares its own config dataclass (`config_cls`),
    checked against it here, with "did you mean" for unknown keys; empty for the built-ins.
    """

    kind: PEKind = "rope"
    rope: RopeConfig = field(default_factory=RopeConfig)
    pope: PopeConfig = field(default_factory=PopeConfig)
    tapa: TapaConfig = field(default_factory=TapaConfig)
    alibi: AlibiConfig = field(default_factory=AlibiConfig)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from phaselab.workloads.models import pe_registry

        if pe_registry.is_builtin(self.kind):
            _require(not self.options, f"pe.options is for plugin encodings; pe.kind={self.kind!r} "
                                       f"takes its settings from pe.{self.kind}")
            return
        pe_registry.check_plugin(self)   # imports it, checks options and a tiny forward


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionConfig:
    """backend: a name in `phaselab.kernels.registry`; never a silent fallback (DESIGN §3.2).
    "auto" is for interactive use only and records what it picked. pope_impl, tapa_series, exp2,
    autotune and flash_impl choose how the triton backend's kernels run (`kernels.common.options`:
    the PoPE implementation, "cudnn" being non-deterministic; TAPA's forward series; the softmax
    exponentials' pipe; timing every tile config; the core the flash and TAPA kernels run on, Gluon
    on Hopper or the portable `tl`); other backends ignore them. What ran is
    recorded in the stage's provenance."""

    backend: Literal["reference", "sdpa", "triton", "auto"] = "reference"
    deterministic: bool = False  # MATH §7.8
    qk_norm: bool = False  # RMSNorm on q and k per head; PoPE softplus comes after (EXPERIMENTS §6 #4)
    pope_impl: PopeImpl = "auto"
    tapa_series: bool = True
    exp2: Exp2Mode = "mufu"
    autotune: bool = False
    flash_impl: FlashImpl = "auto"

    @property
    def options(self) -> AttentionOptions:
        """The kernels' options (validated there too: direct kernel callers share the checks)."""
        return AttentionOptions(pope_impl=self.pope_impl, tapa_series=self.tapa_series, exp2=self.exp2,
                                autotune=self.autotune, flash_impl=self.flash_impl)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Decoder-only transformer: RMSNorm pre-norm, MLP without biases by default (EXPERIMENTS §1).

    n_kv_head: None means n_head (multi-head); fewer gives grouped-query attention.
    vocab_multiple: the embedding table is padded to a multiple of this (64 for GPT-2's 50257 ->
    50304); logits are returned for the true vocab_size only.
    mlp_ratio: hidden width = round(mlp_ratio * d_model) for both "gelu" and "swiglu".
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    d_model: int
    n_kv_head: int | None = None
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = True
    vocab_multiple: int = 1
    norm_eps: float = 1e-6
    pe: PEConfig = field(default_factory=PEConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model", "vocab_multiple"):
            _require(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        _require(self.d_model % self.n_head == 0,
                 f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        _require(self.n_head % self.kv_heads == 0,
                 f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head}")
        _require(0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")
        _require(self.mlp_ratio > 0, f"mlp_ratio={self.mlp_ratio} must be > 0")
        _require(self.pe.kind not in ("rope", "pope") or self.head_dim % 2 == 0,
                 f"head_dim={self.head_dim} must be even for pe.kind={self.pe.kind!r}")
        if self.pe.kind == "rope":
            self.pe.rope.rotary_dim(self.head_dim)  # rotary_fraction * head_dim: an even int >= 2

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def mlp_hidden(self) -> int:
        return round(self.mlp_ratio * self.d_model)


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextExtension:
    """A change of context for continued pretraining / fine-tuning (EXPERIMENTS §2.4, §3.2).

    Apart from block_size, its fields are the `RopeConfig` fields it overrides
    (:meth:`rope_overrides`): `rule` is RoPE's `scaling` (pi, ntk, dynamic_ntk, yarn), with its
    `factor` and `original_max_seq_len`; `base` optionally sets a new RoPE base (the TAPA study's
    b = 2e8 variant); `attention_factor` overrides YaRN's mscale. They are validated by
    `RopeConfig` itself. block_size is the new training length; it is recorded, never used to
    derive `factor` (MATH §2.4: s is never recomputed; the TAPA PI variant trains at 32k with
    s = 8 for L' = 64k). PoPE, TAPA, ALiBi, NoPE and sinusoidal accept only rule "none" without a
    base change (the "no interpolation" fine-tune); anything else is a ValueError when the model
    is extended.
    """

    rule: ScalingRule = "none"
    factor: float = 1.0
    original_max_seq_len: int | None = None
    block_size: int | None = None
    base: float | None = None
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        _require(self.block_size is None or self.block_size >= 1,
                 f"extension block_size={self.block_size} must be >= 1")
        try:
            self.apply(RopeConfig())
        except (ValueError, TypeError) as err:
            raise ValueError(f"extension: {err} (the extension's rule is RoPE's scaling)") from None

    def rope_overrides(self) -> dict[str, Any]:
        """The RopeConfig fields this extension sets (base only when given)."""
        out = {"scaling": self.rule, "factor": self.factor, "original_max_seq_len": self.original_max_seq_len,
               "attention_factor": self.attention_factor}
        return out if self.base is None else {**out, "base": self.base}

    def apply(self, rope: RopeConfig) -> RopeConfig:
        """``rope`` with this extension's fields (pairing, rotary_fraction, betas, ramp kept)."""
        return dataclasses.replace(rope, **self.rope_overrides())
