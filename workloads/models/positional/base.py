"""The positional-encoding protocol (DESIGN §3.1) and NoPE.

Every attention layer builds its OWN encoding module from `PEConfig` (DESIGN §3.1: "each layer
builds its own PE module"), so per-layer parameters (PoPE δ) and per-layer state never alias.

Two kinds of encoding share one interface:
- q/k transforms applied before the kernel (`prepare_qk`: RoPE and its scaling rules);
- logit changes applied inside the kernel (`score_mod`: PoPE, TAPA, ALiBi), where the kernel
  receives the RAW projections.
Absolute encodings (sinusoidal, learned) act on the embeddings instead (`absolute.py`); their
attention layers use `NoPE`.

Shapes: q_BTHD (H query heads), k_BSGD (G kv heads), positions int64 pos_q_BT / pos_k_BS.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

if TYPE_CHECKING:   # annotations only: config validates plugins against this module (pe_registry)
    from phaselab.kernels.common.score_mod import ScoreMod
    from phaselab.workloads.models.config import ContextExtension, PEConfig


class Fp32Buffers(nn.Module):
    """Non-persistent fp32 buffers (frequencies, slopes) that follow the module's device but never
    its dtype: `model.to(torch.bfloat16)` or DeepSpeed's bf16 cast would otherwise round θ_i to 8
    bits (MATH §7.1). After any `_apply` that changed their dtype, the exact fp32 values are
    restored from a master copy."""

    def __init__(self) -> None:
        super().__init__()
        self._fp32_masters: dict[str, Tensor] = {}

    def register_fp32_buffer(self, name: str, value: Tensor) -> None:
        value = value.to(torch.float32)
        self._fp32_masters[name] = value
        self.register_buffer(name, value.clone(), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        module = super()._apply(fn, recurse)
        for name, master in self._fp32_masters.items():
            buf = self._buffers[name]
            if buf.dtype != torch.float32:
                self._buffers[name] = master.to(buf.device)
        return module


class PositionalEncoding(Fp32Buffers):
    """The public positional-encoding interface (docs/EXTENDING.md); built-ins and plugins alike.
    Subclasses override what they change; the defaults are NoPE behaviour.

    - `config_cls`: a frozen dataclass of the encoding's settings (grid: `pe.options`), parsed
      into `self.config` (None when the class declares none);
    - parameters and buffers: created in `__init__`, one module per layer (`register_fp32_buffer`
      keeps a buffer fp32 under a bf16 cast);
    - `prepare_qk`: a q/k transform (RoPE, xPos);
    - `score`: a score modification in plain PyTorch over (score, query position, key position,
      head), differentiable in the encoding's parameters; run inside the attention backend;
    - `bias_table`: a distance-only score modification as a table bias[h, m - n] (ALiBi, KERPLE),
      run in the bias-table kernel on CUDA;
    - `input_module`: the embedding side (absolute encodings);
    - `score_mod`: a fused kernel's ScoreMod (PoPE, TAPA, ALiBi) instead of `score`.

    Args:
        pe_cfg: the whole PEConfig (each class reads its own sub-config or `options`).
        n_head, n_kv_head, head_dim: the attention layer's shape (H, G, D).
    """

    name: ClassVar[str] = "none"
    config_cls: ClassVar[type | None] = None

    def __init__(self, pe_cfg: PEConfig, *, n_head: int, n_kv_head: int, head_dim: int) -> None:
        super().__init__()
        self.pe_cfg = pe_cfg
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.config = type(self).parse_options(pe_cfg.options, kind=pe_cfg.kind)

    @classmethod
    def parse_options(cls, options: dict[str, Any], *, kind: str) -> Any:
        """`options` converted to `config_cls` strictly (unknown keys get "did you mean")."""
        from phaselab.workloads.config import ConfigError, from_dict

        if cls.config_cls is None:
            if options:
                raise ValueError(f"encoding {kind!r} declares no config_cls, so it takes no pe.options "
                                 f"(got {sorted(options)})")
            return None
        try:
            return from_dict(cls.config_cls, options, path="options")
        except ConfigError as err:
            raise ValueError(f"encoding {kind!r}: {err}") from None

    @classmethod
    def input_module(cls, cfg: Any) -> nn.Module | None:
        """The embedding-side module (called with the ModelConfig), or None: no absolute positions."""
        return None

    def score(self, score: Tensor, q_pos: Tensor, k_pos: Tensor, head: Tensor) -> Tensor:
        """The modified score, or NotImplemented for no score modification (the default).

        Args: score [B, H, T, S] (already scaled by `softmax_scale`); q_pos [B, 1, T, 1] and
        k_pos [B, 1, 1, S] int64 positions; head [1, H, 1, 1] int64. Returns a tensor of score's
        shape. Written once in plain PyTorch; backends broadcast it (reference: elementwise).
        """
        return NotImplemented

    def bias_table(self, dist: Tensor, dtype: torch.dtype) -> Tensor:
        """A distance-only score modification, or NotImplemented (the default): the bias [H, N]
        added to the scaled score at the signed distances `dist` (int64 [N], query position minus
        key position), in `dtype` (fp32 in the kernels, float64 in a reference test), in plain
        PyTorch and differentiable in the encoding's parameters. Declaring it runs the encoding in
        the bias-table kernel (kernels/relbias) on CUDA, learned parameters included; it takes the
        place of `score` (docs/EXTENDING.md)."""
        return NotImplemented

    def qk_width(self, head_dim: int) -> int:
        """Width of q and k as handed to the backend (D; the sdpa backend expands PoPE itself)."""
        return head_dim

    def prepare_qk(self, q_BTHD: Tensor, k_BSGD: Tensor, pos_q_BT: Tensor,
                   pos_k_BS: Tensor) -> tuple[Tensor, Tensor]:
        """Transform q and k before the kernel; identity unless overridden."""
        return q_BTHD, k_BSGD

    def score_mod(self) -> ScoreMod | None:
        """Kernel-side part of the encoding, or None: a "relbias" ScoreMod when `bias_table` is
        defined, else a "custom" one when `score` is."""
        from phaselab.kernels.common.score_mod import ScoreMod

        if type(self).bias_table is not PositionalEncoding.bias_table:
            return ScoreMod(kind="relbias", params={"table": self.bias_table, "name": self.pe_cfg.kind})
        if type(self).score is PositionalEncoding.score:
            return None
        return ScoreMod(kind="custom", params={"fn": self.score, "name": self.pe_cfg.kind})

    def softmax_scale(self, head_dim: int) -> float:
        """Multiplier of the score: 1/sqrt(D) (MATH §0, §5 NoPE)."""
        return head_dim ** -0.5

    def extended(self, ext: ContextExtension) -> PositionalEncoding:
        """The encoding after a context extension. Encodings without RoPE frequencies accept only
        rule "none" without a base change (the "no interpolation" fine-tune) and return self, so
        their learned parameters are kept; anything else is a ValueError (nothing silent)."""
        if ext.rule != "none" or ext.base is not None:
            raise ValueError(f"pe.kind={self.pe_cfg.kind!r} has no RoPE frequencies: extension rule="
                             f"{ext.rule!r}, base={ext.base!r} cannot apply (use rule 'none')")
        return self

    def after_optimizer_step(self) -> None:
        """Hook run after every optimiser step (PoPE δ projection); no-op by default."""

    def frequency_features(self, q_BTHD: Tensor, k_BTGD: Tensor) -> dict[str, Tensor]:
        """Per-frequency usage statistics (EXPERIMENTS §2.6); only RoPE and PoPE define them."""
        raise ValueError(f"frequency_features is defined for pe.kind 'rope' and 'pope', "
                         f"not {self.pe_cfg.kind!r}")

    def extra_repr(self) -> str:
        return f"n_head={self.n_head}, n_kv_head={self.n_kv_head}, head_dim={self.head_dim}"


class NoPE(PositionalEncoding):
    """No positional signal in attention; scale 1/sqrt(D) (MATH §5)."""

    name: ClassVar[str] = "none"


def with_extension(pe_cfg: PEConfig, ext: ContextExtension) -> PEConfig:
    """The PEConfig after `ext`: RoPE gets the new rule/factor/original length (and base or YaRN
    attention_factor when given); other kinds are returned unchanged (validated by `extended`)."""
    if pe_cfg.kind != "rope":
        return pe_cfg
    rope = replace(pe_cfg.rope, scaling=ext.rule, factor=ext.factor,
                   original_max_seq_len=ext.original_max_seq_len,
                   attention_factor=ext.attention_factor,
                   base=pe_cfg.rope.base if ext.base is None else ext.base)
    return replace(pe_cfg, rope=rope)


def check_positions(pos_BT: Tensor, name: str = "pos_BT") -> None:
    """Positions are int64 and never floating point (MATH §0, §7.2)."""
    if pos_BT.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 positions, got dtype {pos_BT.dtype} (MATH §7.2)")
