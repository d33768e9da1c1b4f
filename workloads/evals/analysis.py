"""Frequency-usage analysis (EXPERIMENTS §2.6; Barbero et al. 2025, arXiv 2410.06205).

For every layer ℓ, head h and frequency component f, the mean over the tokens of fixed passages
of the q (and k) feature size of that component:

- RoPE: the 2-norm of the un-rotated q/k pair f (F = rotary dims / 2 components);
- PoPE: the magnitude μ = softplus(q_f) of component f (F = D components).

The per-layer values come from ``Transformer.frequency_features`` (the model's hook, which
returns per-call means over tokens); passages of different lengths are combined token-weighted,
so the result is the mean over all scored tokens. Component index 0 is the highest frequency
(θ_c = b^(−c/·) decreases with c).

Outputs (under out_dir): ``freq_q_LHF.npy`` [L, H, F], ``freq_k_LGF.npy`` [L, G, F],
``freq_F.npy`` [F] (rad/token), ``freq_q_LF.npy`` (head mean, the paper's plot), a heat map
``freq_usage.png`` (layer × component, q and k), and for PoPE ``delta_LHD.npy`` plus
``delta_heatmaps.png`` (one head × component panel per layer). Records: per layer
``freq_high_share_q/layer{ℓ}`` — the share of the head-mean q size in the highest-frequency
quarter of components (a scalar summary of "RoPE avoids the highest frequencies").

Offline passages: 10 fixed 14-line passages of Tiny Shakespeare (the sonnets are a real-scale
input), starting at lines ``round(i · (n_lines − 14) / 9)``, i = 0..9.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from phaselab.workloads.evals.perplexity import model_device

N_PASSAGES = 10
PASSAGE_LINES = 14


def fixed_passages(text: str, *, n: int = N_PASSAGES, lines: int = PASSAGE_LINES) -> list[str]:
    """``n`` passages of ``lines`` consecutive lines, evenly spaced over ``text`` (deterministic)."""
    all_lines = text.splitlines(keepends=True)
    if len(all_lines) < lines or n < 1:
        raise ValueError(f"need at least {lines} lines and n >= 1, got {len(all_lines)} lines and n={n}")
    span = len(all_lines) - lines
    starts = [round(i * span / max(1, n - 1)) for i in range(n)]
    return ["".join(all_lines[s:s + lines]) for s in starts]


@dataclass(frozen=True)
class FreqUsage:
    q_LHF: np.ndarray
    k_LGF: np.ndarray
    freq_F: np.ndarray
    delta_LHD: np.ndarray | None  # PoPE only
    n_tokens: int


@torch.no_grad()
def frequency_usage(model: torch.nn.Module, passages: Sequence[Sequence[int]], *, max_len: int) -> FreqUsage:
    """Token-weighted mean of the model's per-layer ``frequency_features`` over ``passages``
    (each truncated to ``max_len`` tokens and run as its own sequence from position 0)."""
    if not hasattr(model, "frequency_features"):
        raise TypeError(f"{type(model).__name__} has no frequency_features hook")
    device = model_device(model)
    model.eval()
    q_sum = k_sum = None
    n_tokens = 0
    feats = None
    for ids in passages:
        ids = list(ids)[:max_len]
        if not ids:
            continue
        feats = model.frequency_features(torch.tensor([ids], dtype=torch.long, device=device))
        q = np.stack([f["q_HF"].double().numpy() for f in feats]) * len(ids)
        k = np.stack([f["k_GF"].double().numpy() for f in feats]) * len(ids)
        q_sum = q if q_sum is None else q_sum + q
        k_sum = k if k_sum is None else k_sum + k
        n_tokens += len(ids)
    if feats is None:
        raise ValueError("frequency_usage needs at least one non-empty passage")
    delta = np.stack([f["delta_HD"].double().numpy() for f in feats]) if "delta_HD" in feats[0] else None
    return FreqUsage(q_sum / n_tokens, k_sum / n_tokens, feats[0]["freq_F"].double().numpy(), delta, n_tokens)


def high_share(q_LF: np.ndarray) -> np.ndarray:
    """Per layer, the fraction of the summed size carried by the highest-frequency quarter."""
    top = max(1, q_LF.shape[1] // 4)
    return q_LF[:, :top].sum(axis=1) / q_LF.sum(axis=1)


def save_usage(u: FreqUsage, out_dir: Path, *, label: str) -> dict[str, Path]:
    """Write the arrays and figures listed in the module docstring; returns name -> path."""
    from phaselab.workloads.evals.plots import layer_heatmaps

    out_dir = Path(out_dir)
    arrays = {"freq_q_LHF.npy": u.q_LHF, "freq_k_LGF.npy": u.k_LGF, "freq_F.npy": u.freq_F,
              "freq_q_LF.npy": u.q_LHF.mean(axis=1)}
    if u.delta_LHD is not None:
        arrays["delta_LHD.npy"] = u.delta_LHD
    arts = {}
    for name, arr in arrays.items():
        np.save(out_dir / name, arr)
        arts[name] = out_dir / name
    arts["freq_usage.png"] = layer_heatmaps(
        [("q (mean over heads)", u.q_LHF.mean(axis=1)), ("k (mean over kv heads)", u.k_LGF.mean(axis=1))],
        out_dir / "freq_usage.png", xlabel="frequency component (0 = highest)", ylabel="layer",
        title=f"{label}: mean q/k size per frequency")
    if u.delta_LHD is not None:
        arts["delta_heatmaps.png"] = layer_heatmaps(
            [(f"layer {i}", d) for i, d in enumerate(u.delta_LHD)], out_dir / "delta_heatmaps.png",
            xlabel="component", ylabel="head", title=f"{label}: PoPE δ per layer", cmap="twilight")
    return arts


def freq_records(u: FreqUsage, *, task: str) -> list:
    from phaselab.catalog.tracking import MetricRecord

    return [MetricRecord(name=f"freq_high_share_q/layer{i}", value=float(v), unit="fraction", task=task,
                         n=u.n_tokens) for i, v in enumerate(high_share(u.q_LHF.mean(axis=1)))]
