"""RoPE and its context-extension rules (MATH §1, §2) as a per-layer positional encoding.

The formulas live in `phaselab.kernels.rotary` (one home each, DESIGN §7 example 4), and so does
the config: `PEConfig.rope` is the kernel's `RopeConfig`. This module only rotates q and k with
`reference.apply_rotary` at the model's head_dim, and folds YaRN's temperature into the softmax scale (mscale**2/sqrt(D),
MATH §2.4) instead of into the rotation.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch
from torch import Tensor

from phaselab.kernels.rotary import reference as rotary
from phaselab.kernels.rotary.scaling import rope_frequencies
from phaselab.workloads.models.config import ContextExtension, PEConfig
from phaselab.workloads.models.positional.base import PositionalEncoding


class RoPE(PositionalEncoding):
    """Rotary positions on the first R = rotary_fraction*D features of q and k.

    Static rules (none, pi, ntk, yarn) compute `inv_freq` once, as a non-persistent fp32 buffer (it
    is derived from the config, so checkpoints never carry stale frequencies; it stays fp32 under
    model.to(bf16)). Dynamic NTK recomputes
    them from the current key length S at every call: phaselab caches store un-rotated keys, so
    every key is re-rotated with b'(S) (MATH §2.3).
    """

    name: ClassVar[str] = "rope"

    def __init__(self, pe_cfg: PEConfig, *, n_head: int, n_kv_head: int, head_dim: int) -> None:
        super().__init__(pe_cfg, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim)
        self.rope_cfg = pe_cfg.rope
        # dynamic NTK at l <= L is plain RoPE (MATH §2.3): the buffer holds those frequencies
        seq_len = self.rope_cfg.original_max_seq_len if self.rope_cfg.scaling == "dynamic_ntk" else None
        inv_freq, mscale = rope_frequencies(self.rope_cfg, head_dim, seq_len=seq_len)
        self.register_fp32_buffer("inv_freq", inv_freq)
        self.mscale = float(mscale)

    def _inv_freq(self, seq_len: int) -> Tensor:
        if self.rope_cfg.scaling != "dynamic_ntk":
            return self.inv_freq
        inv_freq, _ = rope_frequencies(self.rope_cfg, self.head_dim, seq_len=seq_len)
        return inv_freq.to(device=self.inv_freq.device, dtype=torch.float32)

    def prepare_qk(self, q_BTHD: Tensor, k_BSGD: Tensor, pos_q_BT: Tensor,
                   pos_k_BS: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate q at its positions and k at its positions (fp32 angles; dtype preserved)."""
        inv_freq = self._inv_freq(seq_len=k_BSGD.shape[1])
        pairing = self.rope_cfg.pairing
        q_BTHD = rotary.apply_rotary(q_BTHD, pos_q_BT, inv_freq, pairing=pairing)
        k_BSGD = rotary.apply_rotary(k_BSGD, pos_k_BS, inv_freq, pairing=pairing)
        return q_BTHD, k_BSGD

    def softmax_scale(self, head_dim: int) -> float:
        """mscale**2 / sqrt(D): YaRN's temperature (1 for every other rule), MATH §2.4."""
        return self.mscale ** 2 / head_dim ** 0.5

    def extended(self, ext: ContextExtension) -> RoPE:
        """A new RoPE with the extension's rule, factor, original length (and base)."""
        new = RoPE(replace(self.pe_cfg, rope=ext.apply(self.pe_cfg.rope)), n_head=self.n_head,
                   n_kv_head=self.n_kv_head, head_dim=self.head_dim)
        return new.to(self.inv_freq.device)

    def frequency_features(self, q_BTHD: Tensor, k_BTGD: Tensor) -> dict[str, Tensor]:
        """Mean over tokens of the 2-norm of each UN-rotated q/k pair (EXPERIMENTS §2.6).

        Returns fp32 tensors: "freq_F" [F] (rad/token, F = R/2 pairs, static frequencies),
        "q_HF" [H, F], "k_GF" [G, F]. Pair i is features (2i, 2i+1) for interleaved pairing and
        (i, i + R/2) for half-split (MATH §1.3).
        """
        n_pairs = self.inv_freq.shape[0]
        return {"freq_F": self.inv_freq.float().cpu(),
                "q_HF": _pair_norms(q_BTHD, n_pairs, self.rope_cfg.pairing).mean(dim=(0, 1)),
                "k_GF": _pair_norms(k_BTGD, n_pairs, self.rope_cfg.pairing).mean(dim=(0, 1))}

    def extra_repr(self) -> str:
        c = self.rope_cfg
        return (f"{super().extra_repr()}, base={c.base}, scaling={c.scaling!r}, factor={c.factor}, "
                f"pairing={c.pairing!r}, rotary_fraction={c.rotary_fraction}")


def _pair_norms(x_BTHD: Tensor, n_pairs: int, pairing: str) -> Tensor:
    """[B, T, H, F] fp32 norms of the F rotary pairs."""
    x = x_BTHD[..., : 2 * n_pairs].float()
    if pairing == "interleaved":
        pairs = x.unflatten(-1, (n_pairs, 2))
    else:
        pairs = torch.stack([x[..., :n_pairs], x[..., n_pairs:]], dim=-1)
    return pairs.norm(dim=-1)
