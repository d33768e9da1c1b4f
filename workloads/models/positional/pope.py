"""PoPE (MATH §3): softplus magnitudes, D frequencies, and a learned per-head phase bias δ.

By default the score is computed by the attention backend from a `ScoreMod(kind="pope")` and the
RAW q/k projections: the reference and Triton backends evaluate the polar form, the sdpa backend
its Cartesian 2D expansion (MATH §3.3). With `pope.expand` the model itself expands q and k to
that 2D-wide form (`reference.pope_expand`, in `pope.layout`) and the backend sees a plain dot
product of width 2D ("pre-expanded PoPE", DESIGN §3.1; q̂/k̂ are stored in q's dtype, MATH §6).
This module owns the parameter δ [H, D] of its layer, its initialisation, and its constraint to
[-2π, 0] (MATH §3.2):

- "project" (default): the forward pass uses the raw δ; `after_optimizer_step` clamps it in place
  (projected gradient descent), so a component pushed above 0 still gets gradients and can come
  back. A forward clamp would zero them (the stuck-at-boundary pitfall).
- "clamp": the forward pass uses clamp(δ, -2π, 0), as the public reimplementations do.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from phaselab.kernels.common.score_mod import ScoreMod, pope_inv_freq
from phaselab.kernels.pope.reference import pope_amplitude, pope_expand
from phaselab.workloads.models.config import PEConfig
from phaselab.workloads.models.positional.base import PositionalEncoding

DELTA_MIN, DELTA_MAX = -2.0 * math.pi, 0.0


class PoPE(PositionalEncoding):
    """Per-layer PoPE. Parameter `delta` [H, D] (named `...pe.delta` so the optimiser can put it
    in its own group, MATH §3.2) unless `pope.learn_delta` is false (then δ ≡ 0, no parameter)."""

    name: ClassVar[str] = "pope"

    def __init__(self, pe_cfg: PEConfig, *, n_head: int, n_kv_head: int, head_dim: int) -> None:
        super().__init__(pe_cfg, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim)
        self.cfg = pe_cfg.pope
        self.register_fp32_buffer("inv_freq", pope_inv_freq(head_dim, self.cfg.base))
        self.delta = nn.Parameter(torch.zeros(n_head, head_dim)) if self.cfg.learn_delta else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """δ = 0 ("zero") or δ ~ U(-2π, 0) ("uniform"), MATH §3.2."""
        if self.delta is None:
            return
        if self.cfg.delta_init == "uniform":
            self.delta.uniform_(DELTA_MIN, DELTA_MAX)
        else:
            self.delta.zero_()

    def effective_delta(self) -> Tensor | None:
        """δ as the score sees it: raw ("project") or clamped ("clamp")."""
        if self.delta is None:
            return None
        if self.cfg.delta_constraint == "clamp":
            return self.delta.clamp(DELTA_MIN, DELTA_MAX)
        return self.delta

    def qk_width(self, head_dim: int) -> int:
        return 2 * head_dim if self.cfg.expand else head_dim

    def prepare_qk(self, q_BTHD: Tensor, k_BSGD: Tensor, pos_q_BT: Tensor,
                   pos_k_BS: Tensor) -> tuple[Tensor, Tensor]:
        """Raw q/k (fused form), or the Cartesian q̂_BTH(2D), k̂_BSG(2D) when `pope.expand`."""
        if not self.cfg.expand:
            return q_BTHD, k_BSGD
        delta = self.effective_delta()
        q_hat, k_hat = pope_expand(q_BTHD.transpose(1, 2), k_BSGD.transpose(1, 2), pos_q_BT=pos_q_BT,
                                   pos_k_BS=pos_k_BS, inv_freq_D=self.inv_freq,
                                   delta_HD=None if delta is None else delta.float(),
                                   amplitude=self.cfg.amplitude, layout=self.cfg.layout)
        return q_hat.transpose(1, 2), k_hat.transpose(1, 2)

    def score_mod(self) -> ScoreMod | None:
        if self.cfg.expand:
            return None
        delta = self.effective_delta()
        return ScoreMod(kind="pope", params={
            "inv_freq": self.inv_freq,
            "delta": None if delta is None else delta.float(),
            "amplitude": self.cfg.amplitude})

    def softmax_scale(self, head_dim: int) -> float:
        """1/sqrt(D) (default), 1/sqrt(2D), or an explicit float; D before expansion (MATH §3.4)."""
        scale = self.cfg.softmax_scale
        if scale == "inv_sqrt_d":
            return head_dim ** -0.5
        if scale == "inv_sqrt_2d":
            return (2 * head_dim) ** -0.5
        return float(scale)

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Project δ back onto [-2π, 0] ("project" mode only)."""
        if self.delta is not None and self.cfg.delta_constraint == "project":
            self.delta.clamp_(DELTA_MIN, DELTA_MAX)

    def frequency_features(self, q_BTHD: Tensor, k_BTGD: Tensor) -> dict[str, Tensor]:
        """Mean over tokens of the magnitudes μ = amplitude(x) per component (EXPERIMENTS §2.6).

        Returns fp32 tensors: "freq_F" [D] (θ_c rad/token), "q_HF" [H, D], "k_GF" [G, D], and
        "delta_HD" [H, D] (the effective δ; zeros when δ is not learned) for the heat maps.
        """
        amp = self.cfg.amplitude
        delta = self.effective_delta()
        return {"freq_F": self.inv_freq.float().cpu(),
                "q_HF": pope_amplitude(q_BTHD.float(), amp).mean(dim=(0, 1)),
                "k_GF": pope_amplitude(k_BTGD.float(), amp).mean(dim=(0, 1)),
                "delta_HD": (torch.zeros(self.n_head, self.head_dim) if delta is None
                             else delta.detach().float().cpu())}

    def extra_repr(self) -> str:
        c = self.cfg
        return (f"{super().extra_repr()}, base={c.base}, delta_init={c.delta_init!r}, "
                f"constraint={c.delta_constraint!r}, amplitude={c.amplitude!r}")
