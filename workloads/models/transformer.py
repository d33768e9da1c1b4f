"""A decoder-only transformer with a pluggable positional encoding, read top to bottom.

nanoGPT style (karpathy/nanoGPT model.py): RMSNorm pre-norm blocks, causal self-attention with
grouped-query heads, a GELU (ratio 4, no biases; EXPERIMENTS §1) or SwiGLU MLP, tied embeddings.
Shape suffixes: B batch, T queries, S keys, H query heads, G kv heads, D head dim, C width,
V vocab (CONTRACTS). The model is BTHD; attention kernels take BHTD.

Attention runs on a backend from `phaselab.kernels.registry`, resolved when the layer is built
and recorded under the layer's name (DESIGN §3.2). Each call is described by an `AttnCall`; a
call that differs from the ones already checked (a decode with T < S, bf16 autocast, another
device) is re-checked against the SAME backend, and its refusal raises `BackendUnsupported`:
nothing ever falls back to another backend.

Positions: `pos_BT` defaults to 0..T-1 (or continues the KV cache). When given, positions that
restart (pos[t] <= pos[t-1]) start a new document; the batch is then attended as packed
documents (cu_seqlens), so no token sees another document (MATH §0, §7.6).

Dropout is applied to the embeddings and to each residual branch; the attention backends have
no attention-probability dropout, so there is none.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from phaselab.kernels.loss.function import linear_cross_entropy
from phaselab.kernels.loss.reference import row_weights
from phaselab.kernels.registry import AttnCall, BackendUnsupported, resolve
from phaselab.workloads.models.config import ContextExtension, ModelConfig
from phaselab.workloads.models.positional import build_input_pe, build_pe
from phaselab.workloads.models.positional.base import check_positions


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and cast back to x's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        out = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return out.to(x.dtype)


class LayerCache:
    """One layer's KV cache: RAW (un-rotated, pre-softplus) k_BSGD and v_BSGD, positions pos_BS.

    Un-rotated keys let every encoding re-apply itself at each step: dynamic NTK re-rotates all
    keys with b'(S) (MATH §2.3), PoPE/TAPA kernels read raw keys (MATH §6 "PoPE KV cache").
    """

    def __init__(self) -> None:
        self.k_BSGD: Tensor | None = None
        self.v_BSGD: Tensor | None = None
        self.pos_BS: Tensor | None = None

    def append(self, k_BTGD: Tensor, v_BTGD: Tensor, pos_BT: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.k_BSGD is not None:
            k_BTGD = torch.cat([self.k_BSGD, k_BTGD], dim=1)
            v_BTGD = torch.cat([self.v_BSGD, v_BTGD], dim=1)
            pos_BT = torch.cat([self.pos_BS.expand(pos_BT.shape[0], -1), pos_BT], dim=1)
        self.k_BSGD, self.v_BSGD, self.pos_BS = k_BTGD, v_BTGD, pos_BT
        return k_BTGD, v_BTGD, pos_BT


class KVCache:
    """Per-layer caches for incremental decoding. `length` = number of cached positions S."""

    def __init__(self, n_layer: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layer)]

    @property
    def length(self) -> int:
        k = self.layers[0].k_BSGD
        return 0 if k is None else k.shape[1]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: str, device_type: str) -> None:
        super().__init__()
        C, H, G, D = cfg.d_model, cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.n_head, self.n_kv_head, self.head_dim, self.layer = H, G, D, layer
        self.c_q = nn.Linear(C, H * D, bias=cfg.bias)
        self.c_k = nn.Linear(C, G * D, bias=cfg.bias)
        self.c_v = nn.Linear(C, G * D, bias=cfg.bias)
        self.c_proj = nn.Linear(H * D, C, bias=cfg.bias)
        self.q_norm = RMSNorm(D, cfg.norm_eps) if cfg.attention.qk_norm else None
        self.k_norm = RMSNorm(D, cfg.norm_eps) if cfg.attention.qk_norm else None
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.pe = build_pe(cfg)  # this layer's own encoding module (DESIGN §3.1)
        self.deterministic = cfg.attention.deterministic
        self.options = cfg.attention.options  # the kernels' choices (PoPE implementation, exp2, ...)
        score_mod = self.pe.score_mod()
        self.built_call = AttnCall(
            dtype=torch.get_default_dtype(), device_type=device_type, head_dim=D, qk_width=self.pe.qk_width(D),
            causal=True, q_shorter_than_k=False, varlen=False,
            score_mod=None if score_mod is None else score_mod.kind, needs_grad=True,
            deterministic=self.deterministic)
        self.backend = resolve(cfg.attention.backend, self.built_call, layer=layer)
        self._checked_calls = {self.built_call}

    def project_qkv(self, x_BTC: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Raw projections q_BTHD, k_BTGD, v_BTGD (after the optional QK-norm, before any PE)."""
        B, T, _ = x_BTC.shape
        q_BTHD = self.c_q(x_BTC).view(B, T, self.n_head, self.head_dim)
        k_BTGD = self.c_k(x_BTC).view(B, T, self.n_kv_head, self.head_dim)
        v_BTGD = self.c_v(x_BTC).view(B, T, self.n_kv_head, self.head_dim)
        if self.q_norm is not None:
            q_BTHD, k_BTGD = self.q_norm(q_BTHD), self.k_norm(k_BTGD)
        return q_BTHD, k_BTGD, v_BTGD

    def check_call(self, call: AttnCall) -> None:
        """Accept a call already checked; re-check a new one against the same backend or raise."""
        if call in self._checked_calls:
            return
        reason = self.backend.unsupported_reason(call)
        if reason is not None:
            changed = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)
                       if getattr(call, f.name) != getattr(self.built_call, f.name)}
            raise BackendUnsupported(self.backend.name, f"layer {self.layer}: a call with {changed} "
                                     f"differs from the one checked at build time: {reason}")
        self._checked_calls.add(call)

    def forward(self, x_BTC: Tensor, pos_BT: Tensor, *, cache: LayerCache | None = None,
                cu_seqlens: Tensor | None = None, trivial_pos: bool = False) -> Tensor:
        B, T, _ = x_BTC.shape
        q_BTHD, k_BSGD, v_BSGD = self.project_qkv(x_BTC)
        pos_k_BS = pos_BT
        if cache is not None:
            k_BSGD, v_BSGD, pos_k_BS = cache.append(k_BSGD, v_BSGD, pos_BT)
        q_BTHD, k_BSGD = self.pe.prepare_qk(q_BTHD, k_BSGD, pos_BT, pos_k_BS)
        pos_q_BT = pos_BT
        if cu_seqlens is not None:  # packed documents: one row of B*T tokens (B = 1 for the kernel)
            q_BTHD, k_BSGD, v_BSGD = (t.reshape(1, B * T, *t.shape[2:]) for t in (q_BTHD, k_BSGD, v_BSGD))
            pos_q_BT = pos_k_BS = pos_BT.reshape(1, B * T)
        q_BHTD, k_BGSD, v_BGSD = (t.transpose(1, 2) for t in (q_BTHD, k_BSGD, v_BSGD))
        score_mod = self.pe.score_mod()
        self.check_call(AttnCall.describe(q_BHTD, k_BGSD, v_BGSD, causal=True, score_mod=score_mod,
                                          cu_seqlens=cu_seqlens, deterministic=self.deterministic))
        y_BHTD = self.backend(q_BHTD, k_BGSD, v_BGSD, pos_q=pos_q_BT, pos_k=pos_k_BS,
                              scale=self.pe.softmax_scale(self.head_dim), causal=True,
                              score_mod=score_mod, cu_seqlens=cu_seqlens, trivial_pos=trivial_pos,
                              deterministic=self.deterministic, options=self.options)
        y_BTC = y_BHTD.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)
        return self.resid_drop(self.c_proj(y_BTC))


class MLP(nn.Module):
    """GELU MLP, or SwiGLU (silu(x W_gate) * x W_up) with gate and up fused in c_fc."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_hidden
        self.swiglu = cfg.mlp == "swiglu"
        self.c_fc = nn.Linear(cfg.d_model, 2 * hidden if self.swiglu else hidden, bias=cfg.bias)
        self.c_proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x_BTC: Tensor) -> Tensor:
        h_BTF = self.c_fc(x_BTC)
        if self.swiglu:
            gate_BTF, up_BTF = h_BTF.chunk(2, dim=-1)
            h_BTF = F.silu(gate_BTF) * up_BTF
        else:
            h_BTF = F.gelu(h_BTF)
        return self.drop(self.c_proj(h_BTF))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, device_type: str) -> None:
        super().__init__()
        self.ln_1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg, layer=f"h.{index}.attn", device_type=device_type)
        self.ln_2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x_BTC: Tensor, pos_BT: Tensor, *, cache: LayerCache | None = None,
                cu_seqlens: Tensor | None = None, trivial_pos: bool = False) -> Tensor:
        x_BTC = x_BTC + self.attn(self.ln_1(x_BTC), pos_BT, cache=cache, cu_seqlens=cu_seqlens,
                                  trivial_pos=trivial_pos)
        return x_BTC + self.mlp(self.ln_2(x_BTC))


def masked_cross_entropy(logits_BTV: Tensor, targets_BT: Tensor, mask_BT: Tensor | None = None) -> Tensor:
    """Mean fp32 cross-entropy over tokens with mask > 0 (weighted by the mask) and target >= 0.

    An all-zero mask gives NaN (0/0), which training reports as divergence, never a silent 0.
    """
    nll_BT = F.cross_entropy(logits_BTV.float().flatten(0, 1), targets_BT.flatten(), ignore_index=-1,
                             reduction="none").view_as(targets_BT)
    weight_BT = row_weights(targets_BT, mask_BT)  # the fused loss's weights too (kernels/loss)
    return (nll_BT * weight_BT).sum() / weight_BT.sum()


def document_segments(pos_BT: Tensor) -> Tensor | None:
    """cu_seqlens [N+1] int32 over the flattened B*T tokens when positions restart inside a row
    (pos[t] <= pos[t-1]: packed documents; every row also starts a document), else None (rows
    of increasing positions, strided ones included, are plain causal rows)."""
    starts_BT = torch.ones_like(pos_BT, dtype=torch.bool)
    starts_BT[:, 1:] = pos_BT[:, 1:] <= pos_BT[:, :-1]
    if not bool(starts_BT[:, 1:].any()):
        return None
    idx = starts_BT.flatten().nonzero().flatten()
    end = torch.tensor([pos_BT.numel()], device=pos_BT.device)
    return torch.cat([idx, end]).to(torch.int32)


class Transformer(nn.Module):
    """Decoder-only LM. `cfg` is kept up to date by `extended` and embedded in checkpoints."""

    def __init__(self, cfg: ModelConfig, *, device_type: str | None = None) -> None:
        """`device_type` is where the model will run ("cpu" | "cuda"); the attention backend is
        checked for it at build time (a model built on the host and moved to the GPU must resolve
        the triton backend). None: "cuda" when a GPU is visible, else "cpu"."""
        super().__init__()
        if device_type is None:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)
        self.input_pe = build_input_pe(cfg)  # sinusoidal / learned absolute positions, else None
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg, i, device_type) for i in range(cfg.n_layer))
        self.ln_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.padded_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def positions(self, idx_BT: Tensor, pos_BT: Tensor | None, start: int = 0) -> Tensor:
        """int64 pos_BT: the given positions (validated) or start..start+T-1 for every row."""
        B, T = idx_BT.shape
        if pos_BT is None:
            return torch.arange(start, start + T, device=idx_BT.device).expand(B, T)
        check_positions(pos_BT)
        if pos_BT.shape != (B, T):
            raise ValueError(f"pos_BT has shape {tuple(pos_BT.shape)}, expected {(B, T)} like idx_BT")
        return pos_BT.to(idx_BT.device)

    def forward(self, idx_BT: Tensor, *, pos_BT: Tensor | None = None, targets_BT: Tensor | None = None,
                loss_mask_BT: Tensor | None = None, kv_cache: KVCache | None = None,
                logits: bool = True) -> tuple[Tensor | None, Tensor | None]:
        """Logits for every position and, with targets, the masked mean cross-entropy.

        Args:
            idx_BT: int64 token ids [B, T].
            pos_BT: int64 positions [B, T]; default 0..T-1 (after a KV cache: S..S+T-1).
                Restarting positions mark packed documents (not allowed with a KV cache).
            targets_BT: int64 next-token ids [B, T] (-1 = ignored) or None.
            loss_mask_BT: float weights [B, T] (0 = not scored) or None (all scored).
            kv_cache: a `KVCache` for incremental decoding (queries after the cached keys).
            logits: False returns no logits, only the loss (needs targets_BT): training discards
                the logits, and on CUDA the loss then comes from the fused kernel (`_loss_only`).
        Returns:
            (logits_BTV with V = vocab_size (padding rows dropped) or None when logits=False,
             loss fp32 scalar or None).
        """
        if not logits and targets_BT is None:
            raise ValueError("logits=False needs targets_BT: without them there is nothing to return")
        # packed documents can only come from explicit positions: the default needs no host sync
        packed = pos_BT is not None and kv_cache is None
        trivial_pos = pos_BT is None and kv_cache is None  # 0..T-1 for queries and keys, known here
        start = 0 if kv_cache is None else kv_cache.length
        pos_BT = self.positions(idx_BT, pos_BT, start)
        cu_seqlens = document_segments(pos_BT) if packed else None
        x_BTC = self.wte(idx_BT)
        if self.input_pe is not None:
            x_BTC = x_BTC + self.input_pe(pos_BT).to(x_BTC.dtype)
        x_BTC = self.drop(x_BTC)
        for i, block in enumerate(self.h):
            cache = None if kv_cache is None else kv_cache.layers[i]
            x_BTC = block(x_BTC, pos_BT, cache=cache, cu_seqlens=cu_seqlens, trivial_pos=trivial_pos)
        h_BTC = self.ln_f(x_BTC)
        if not logits:
            return None, self._loss_only(h_BTC, targets_BT, loss_mask_BT)
        logits_BTV = self.lm_head(h_BTC)[..., : self.cfg.vocab_size]
        loss = None if targets_BT is None else masked_cross_entropy(logits_BTV, targets_BT, loss_mask_BT)
        return logits_BTV, loss

    def _loss_only(self, h_BTC: Tensor, targets_BT: Tensor, loss_mask_BT: Tensor | None) -> Tensor:
        """The loss of `forward(logits=False)`. On CUDA: the fused linear + cross-entropy kernel
        (the logits are written once, in the matmul's dtype, and become their own gradient;
        none leave the compiled graph). Elsewhere: the same `masked_cross_entropy` as logits=True,
        so CPU training stays bitwise identical (the Triton kernel needs a GPU)."""
        if h_BTC.device.type != "cuda":
            logits_BTV = self.lm_head(h_BTC)[..., : self.cfg.vocab_size]
            return masked_cross_entropy(logits_BTV, targets_BT, loss_mask_BT)
        mask_N = None if loss_mask_BT is None else loss_mask_BT.flatten()
        return linear_cross_entropy(h_BTC.flatten(0, 1), self.lm_head.weight, targets_BT.flatten(), mask_N,
                                    vocab_size=self.cfg.vocab_size)

    def after_optimizer_step(self) -> None:
        """Call after every optimizer.step(): projects PoPE δ onto [-2π, 0] (MATH §3.2)."""
        for block in self.h:
            block.attn.pe.after_optimizer_step()

    def extended(self, ext: ContextExtension) -> None:
        """Apply a context extension in place: every layer's encoding is replaced by
        `pe.extended(ext)` (weights, including PoPE δ, are kept) and `cfg` records the new RoPE
        rule and block_size. Invalid extensions raise ValueError before anything changes."""
        new_pes = [block.attn.pe.extended(ext) for block in self.h]
        if self.input_pe is not None:
            self.input_pe.check_extension(ext)
        for block, pe in zip(self.h, new_pes):
            block.attn.pe = pe
        block_size = self.cfg.block_size if ext.block_size is None else ext.block_size
        self.cfg = dataclasses.replace(self.cfg, pe=new_pes[0].pe_cfg, block_size=block_size)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Unique parameters (a tied lm_head counts once). exclude_embeddings drops the token
        embedding table (padded rows included) and a learned position table; an untied lm_head
        is an output projection and stays counted."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.wte.weight.numel()
            if self.cfg.pe.kind == "learned":
                n -= self.input_pe.wpe.weight.numel()
        return n

    @torch.no_grad()
    def frequency_features(self, idx_BT: Tensor, *, pos_BT: Tensor | None = None) -> list[dict[str, Tensor]]:
        """Per-layer frequency usage of the raw (un-rotated) q and k (EXPERIMENTS §2.6).

        Returns one dict per layer, means over all B*T tokens, fp32 on the CPU:
            "freq_F": [F] frequencies in rad/token;
            "q_HF": [H, F] and "k_GF": [G, F]: RoPE: 2-norm of each un-rotated pair (F = R/2);
                PoPE: mean magnitude μ of each component (F = D);
            "delta_HD": [H, D] (PoPE only) the effective phase bias δ.
        Raises ValueError for encodings without frequencies.
        """
        cu_seqlens = None if pos_BT is None else document_segments(pos_BT)
        pos_BT = self.positions(idx_BT, pos_BT)
        x_BTC = self.drop(self.wte(idx_BT))
        features = []
        for block in self.h:
            q_BTHD, k_BTGD, _ = block.attn.project_qkv(block.ln_1(x_BTC))
            features.append({k: v.float().cpu() for k, v in block.attn.pe.frequency_features(q_BTHD, k_BTGD).items()})
            x_BTC = block(x_BTC, pos_BT, cu_seqlens=cu_seqlens)
        return features
