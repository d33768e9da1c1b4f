"""Perplexity by context length over long documents (EXPERIMENTS §2.4, §3.3).

A *document* is a 1-D token array (a book, or the whole validation stream). A document of N tokens
has N − 1 next-token *targets*: target t is token t + 1 predicted from tokens 0..t. A *window* of
context length L is the input ``doc[start : start + L]`` with targets ``doc[start + 1 : start + L + 1]``,
fed at positions 0..L−1 (each window is an independent forward pass).

Protocols (``mode``):

- ``"nonoverlap"`` (the PoPE protocol, EXPERIMENTS §2.4): windows start at 0, L, 2L, ...; every
  target of a window is scored; the partial tail (fewer than L targets) is dropped.
- ``"sliding"`` (Press et al., arXiv 2108.12409; the TAPA protocol, EXPERIMENTS §3.3): windows of
  length L start at 0, s, 2s, ... (s = ``stride`` ≤ L). The first window scores all of its L
  targets; each later window scores only its last s targets, so every target in the covered range
  is scored exactly once, each with at least L − s tokens of context. Windows are always full
  length; the last < s targets of a document (not reachable by a full advance) are dropped like
  the nonoverlap tail, so ``stride == L`` reproduces ``"nonoverlap"`` exactly.

Documents shorter than L + 1 tokens contribute nothing at that length. The result per length is
the token-weighted mean NLL in nats/token, perplexity = exp(mean NLL), and the scored token count.

Memory: the forward pass is the model's own; the loss is computed over the scored positions in
chunks of ``_CE_CHUNK`` rows, so the eval adds at most ``_CE_CHUNK × V`` floats on top of the
model's logits (with a fused attention backend the whole pass is linear in L).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from phaselab.workloads.evals.options import PplConfig
from phaselab.workloads.precision import resolved_precision

_CE_CHUNK = 2048  # rows of logits turned into fp32 log-probs at a time


@dataclass(frozen=True, slots=True)
class Window:
    """Input ``doc[start:start+L]``; targets ``doc[start+1:start+L+1]``; scored targets ``[score_from:]``."""

    doc: int
    start: int
    score_from: int


@dataclass(frozen=True, slots=True)
class PplResult:
    context_len: int
    nll: float  # nats/token, token-weighted mean
    ppl: float
    n_tokens: int
    n_windows: int


def plan_windows(doc_lengths: Sequence[int], length: int, *, mode: str, stride: int,
                 max_tokens: int | None = None) -> list[Window]:
    """The windows (and scored ranges) of one protocol at context length ``length``.

    Example: one document of 11 tokens (10 targets), L = 4, sliding, stride 2 →
    windows start 0 (targets 0..3), 2 (scores 4..5), 4 (scores 6..7), 6 (scores 8..9).
    """
    if length < 1:
        raise ValueError(f"context length must be >= 1, got {length!r}")
    if mode == "nonoverlap":
        step, later_from = length, 0
    elif mode == "sliding":
        if not 1 <= stride <= length:
            raise ValueError(f"sliding stride must be in [1, {length}] for length {length}, got {stride!r}")
        step, later_from = stride, length - stride
    else:
        raise ValueError(f"ppl mode must be 'nonoverlap' or 'sliding', got {mode!r}")
    windows: list[Window] = []
    scored = 0
    for d, n_tok in enumerate(doc_lengths):
        n_targets = int(n_tok) - 1
        for start in range(0, n_targets - length + 1, step):
            score_from = 0 if start == 0 else later_from
            windows.append(Window(d, start, score_from))
            scored += length - score_from
            if max_tokens is not None and scored >= max_tokens:
                return windows
    return windows


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """``precision``: "fp32" | "bf16" | "auto" (bf16 autocast on CUDA, fp32 elsewhere)."""
    if resolved_precision(precision, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def token_logprobs(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """log p(target) per position in fp32, ``_CE_CHUNK`` rows at a time. Returns [B, T].

    Works on views of ``logits_BTV`` (a slice along T is never copied whole), so the extra
    memory is one fp32 chunk of ``_CE_CHUNK × V``.
    """
    B, T, _ = logits_BTV.shape
    out_BT = torch.empty(B, T, dtype=torch.float32, device=logits_BTV.device)
    for b in range(B):
        for i in range(0, T, _CE_CHUNK):
            j = min(i + _CE_CHUNK, T)
            out_BT[b, i:j] = -F.cross_entropy(logits_BTV[b, i:j].float(), targets_BT[b, i:j], reduction="none")
    return out_BT


def _batches(windows: list[Window], batch_size: int) -> Iterator[list[Window]]:
    for i in range(0, len(windows), batch_size):
        yield windows[i:i + batch_size]


@torch.no_grad()
def score_windows(model: torch.nn.Module, documents: Sequence[np.ndarray], windows: list[Window], *,
                  length: int, batch_size: int = 1, precision: str = "auto") -> tuple[float, int]:
    """Sum of NLL (nats, float64) and count over the scored targets of ``windows``."""
    device = model_device(model)
    nll_sum, count = 0.0, 0
    for batch in _batches(windows, batch_size):
        rows = [np.asarray(documents[w.doc][w.start:w.start + length + 1], dtype=np.int64) for w in batch]
        seq_BT1 = torch.from_numpy(np.stack(rows)).to(device)
        x_BT, y_BT = seq_BT1[:, :-1], seq_BT1[:, 1:]
        # Windows of one batch share score_from except the first window of a document.
        for from_ in sorted({w.score_from for w in batch}):
            idx = [i for i, w in enumerate(batch) if w.score_from == from_]
            with autocast(device, precision):
                logits_BTV, _ = model(x_BT[idx])
            lp_BT = token_logprobs(logits_BTV[:, from_:], y_BT[idx, from_:])
            nll_sum -= float(lp_BT.double().sum())
            count += lp_BT.numel()
            del logits_BTV
    return nll_sum, count


def perplexity_by_length(model: torch.nn.Module, documents: Sequence[np.ndarray], cfg: PplConfig, *,
                         precision: str = "auto") -> list[PplResult]:
    """One :class:`PplResult` per length in ``cfg.lengths`` (model put in eval mode)."""
    if not documents:
        raise ValueError("perplexity_by_length needs at least one document")
    model.eval()
    doc_lengths = [len(d) for d in documents]
    results = []
    for length in cfg.lengths:
        windows = plan_windows(doc_lengths, int(length), mode=cfg.mode, stride=cfg.stride,
                               max_tokens=cfg.max_tokens)
        if not windows:
            raise ValueError(f"no document has more than {length} tokens (longest: {max(doc_lengths)}); "
                             f"cannot evaluate context length {length}")
        nll_sum, n = score_windows(model, documents, windows, length=int(length),
                                   batch_size=cfg.batch_size, precision=precision)
        nll = nll_sum / n
        results.append(PplResult(int(length), nll, math.exp(nll), n, len(windows)))
    return results


# --------------------------------------------------------------------------------------------
# The ``ppl-by-length`` suite (called by api.run_eval)
# --------------------------------------------------------------------------------------------
def ppl_records(results: Sequence[PplResult], *, task: str, split: str) -> list:
    """Two MetricRecord rows per length: ``nll`` (nats/token) and ``ppl``; n = scored tokens."""
    from phaselab.catalog.tracking import MetricRecord

    out = []
    for r in results:
        for name, value, unit in (("nll", r.nll, "nats/token"), ("ppl", r.ppl, "ppl")):
            out.append(MetricRecord(name=name, value=float(value), unit=unit, context_len=r.context_len,
                                    task=task, split=split, n=r.n_tokens))
    return out
