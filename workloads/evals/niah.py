"""Needle in a haystack / passkey retrieval (EXPERIMENTS §3.4, decision 25; DESIGN §5.8).

A sample of context length L is a token sequence of exactly L ids::

    [haystack ... | needle | ... haystack][question]
     \\________ context: C = L - len(question) tokens ________/

- needle   = encode(" The special magic number is N. ") with N a uniform 7-digit number;
- question = encode(" What is the special magic number? The special magic number is");
- ``answer: "letters"`` (not in the papers) swaps N for 7 uniform capital letters and "number"
  for "word", for vocabularies without digits (Tiny Shakespeare's characters hold only "3");
- the needle starts at the exact token index ``round(depth * (C - len(needle)))``, so depth 0
  puts it first and depth 1 makes it end right before the question;
- the haystack is a contiguous run of the document stream (Tiny Shakespeare offline, PG-19
  online) from a seeded random offset (tiled when the stream is shorter than C).

Scoring: greedy decoding of ``len(encode(" " + N)) + 1`` tokens; a trial is correct iff the
first alphanumeric run of the decoded text (after optional whitespace) is exactly N. Accuracy per
(length, depth) cell. Samples are generated once per (dataset/tokenizer digest, length, depth,
seed, trials) and cached on disk under a hash of that key (atomic write). Lengths are run in
increasing order; with ``stop_below`` set, once a length's mean accuracy over depths falls below
it, longer lengths are recorded as not attempted (``niah_not_attempted`` rows) instead of run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from phaselab.workloads.evals.options import NiahConfig
from phaselab.workloads.evals.perplexity import autocast, model_device

NEEDLE = " The special magic {noun} is {answer}. "
QUESTION = " What is the special magic {noun}? The special magic {noun} is"
_NOUN = {"digits": "number", "letters": "word"}
_FORMAT_VERSION = 1  # bump when the sample layout changes (it is part of the cache key)

Step = Callable[[torch.Tensor], torch.Tensor]  # ids_BT -> next-token logits_BV


@dataclass(frozen=True)
class NiahSamples:
    """ids [trials, L] int64; needle_start [trials]; answers [trials] (7-character strings)."""

    ids: np.ndarray
    needle_start: np.ndarray
    answers: np.ndarray
    context_len: int
    depth: float


def needle_index(context_tokens: int, needle_tokens: int, depth: float) -> int:
    """The needle's first token index for a depth in [0, 1] (module docstring)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"needle depth must lie in [0, 1], got {depth!r}")
    if needle_tokens > context_tokens:
        raise ValueError(f"needle of {needle_tokens} tokens does not fit a context of {context_tokens}")
    return round(depth * (context_tokens - needle_tokens))


def draw_answers(rng: np.random.Generator, trials: int, answer: str) -> np.ndarray:
    if answer == "digits":
        return np.array([str(n) for n in rng.integers(1_000_000, 10_000_000, size=trials)])
    if answer == "letters":
        letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
        return np.array(["".join(rng.choice(letters, size=7)) for _ in range(trials)])
    raise ValueError(f"niah answer must be 'digits' or 'letters', got {answer!r}")


def make_samples(tokenizer: Any, haystack: np.ndarray, *, length: int, depth: float, trials: int,
                 seed: int, answer: str = "digits") -> NiahSamples:
    """Generate ``trials`` samples of exactly ``length`` tokens (pure function of its arguments)."""
    if answer not in _NOUN:
        raise ValueError(f"niah answer must be 'digits' or 'letters', got {answer!r}")
    noun = _NOUN[answer]
    question = list(tokenizer.encode(QUESTION.format(noun=noun)))
    context = length - len(question)
    rng = np.random.default_rng([int(seed), int(length), round(depth * 1_000_000)])
    answers = draw_answers(rng, trials, answer)
    ids = np.empty((trials, length), dtype=np.int64)
    starts = np.empty(trials, dtype=np.int64)
    hay = np.asarray(haystack, dtype=np.int64)
    for t in range(trials):
        needle = list(tokenizer.encode(NEEDLE.format(noun=noun, answer=answers[t])))
        at = needle_index(context, len(needle), depth)
        fill = context - len(needle)
        offset = int(rng.integers(0, max(1, len(hay) - fill)))
        run = np.resize(hay[offset:], fill) if len(hay) - offset < fill else hay[offset:offset + fill]
        ids[t] = np.concatenate([run[:at], needle, run[at:], question])
        starts[t] = at
    return NiahSamples(ids, starts, answers, int(length), float(depth))


def cached_samples(tokenizer: Any, haystack: np.ndarray, *, digest: str, length: int, depth: float,
                   trials: int, seed: int, cache_dir: Path, answer: str = "digits") -> NiahSamples:
    """``make_samples`` through an on-disk cache keyed by (digest, length, depth, seed, trials,
    answer kind)."""
    key = json.dumps({"v": _FORMAT_VERSION, "digest": digest, "length": int(length), "depth": float(depth),
                      "trials": int(trials), "seed": int(seed), "needle": NEEDLE, "question": QUESTION,
                      "answer": answer}, sort_keys=True)
    path = Path(cache_dir) / f"niah-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"
    if path.exists():
        with np.load(path) as z:
            return NiahSamples(z["ids"], z["needle_start"], z["answers"], int(length), float(depth))
    s = make_samples(tokenizer, haystack, length=length, depth=depth, trials=trials, seed=seed, answer=answer)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, ids=s.ids, needle_start=s.needle_start, answers=s.answers)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old state or the whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return s


def model_step(model: torch.nn.Module, *, max_length: int, precision: str = "auto",
               kv_cache: bool = True) -> Step:
    """Next-token logits_BV of ``model`` for ids_BT.

    With ``kv_cache`` (the model's ``KVCache``), a call whose ids extend the previous call's by
    one token feeds only that token, so greedy decoding costs one prefill plus one step per new
    token instead of a full forward each time; any other call starts a fresh cache. The prefill
    is left-truncated to ``max_length``; decoded tokens then extend past it (positions keep
    counting, as in ordinary generation). Without the cache every call re-reads the last
    ``max_length`` ids.
    """
    from phaselab.workloads.models.transformer import KVCache

    device = model_device(model)
    state: dict[str, Any] = {"ids": None, "cache": None}

    @torch.no_grad()
    def step(ids_BT: torch.Tensor) -> torch.Tensor:
        ids_BT = ids_BT.to(device)
        prev = state["ids"]
        extends = (kv_cache and prev is not None and ids_BT.shape == (prev.shape[0], prev.shape[1] + 1)
                   and torch.equal(ids_BT[:, :-1], prev))
        if extends:
            new_BT = ids_BT[:, -1:]
        else:
            state["cache"] = KVCache(len(model.h)) if kv_cache else None
            new_BT = ids_BT[:, -max_length:]
        with autocast(device, precision):
            logits_BTV, _ = model(new_BT, kv_cache=state["cache"]) if kv_cache else model(new_BT)
        state["ids"] = ids_BT if kv_cache else None
        return logits_BTV[:, -1].float()

    return step


def greedy_decode(step_or_model: Step | torch.nn.Module, prompts: Sequence[Sequence[int]], max_new: int, *,
                  max_length: int | None = None, precision: str = "auto",
                  stop: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """Greedy continuation of equal-length prompts; returns the new ids per prompt.

    ``step_or_model`` is a Step or a model (wrapped by ``model_step``, which needs max_length).
    A row stops after the token for which ``stop(new_ids)`` is true; decoding ends when all rows
    have stopped or after ``max_new`` tokens.
    """
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("greedy_decode needs prompts of one length (decode ragged prompts one at a time)")
    if isinstance(step_or_model, torch.nn.Module):
        if max_length is None:
            raise ValueError("greedy_decode with a model needs max_length")
        step = model_step(step_or_model, max_length=max_length, precision=precision)
    else:
        step = step_or_model
    ids_BT = torch.tensor([list(p) for p in prompts], dtype=torch.long)
    new: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_new):
        nxt_B = step(ids_BT).argmax(-1).cpu()
        ids_BT = torch.cat([ids_BT, nxt_B[:, None]], dim=1)
        for b, tok in enumerate(nxt_B.tolist()):
            if not done[b]:
                new[b].append(tok)
                done[b] = stop is not None and stop(new[b])
        if all(done):
            break
    return new


def is_correct(text: str, answer: str) -> bool:
    """The first alphanumeric run of ``text`` (after whitespace) is exactly ``answer``."""
    m = re.match(r"\s*([0-9A-Za-z]+)", text)
    return m is not None and m.group(1) == str(answer)


def score_samples(step: Step, tokenizer: Any, samples: NiahSamples, *, batch_size: int) -> float:
    """Exact-match accuracy of greedy decoding on one (length, depth) cell."""
    correct = 0
    for i in range(0, len(samples.ids), batch_size):
        rows, answers = samples.ids[i:i + batch_size], samples.answers[i:i + batch_size]
        n_new = max(len(tokenizer.encode(" " + str(a))) for a in answers) + 1
        outs = greedy_decode(step, rows.tolist(), n_new)
        correct += sum(is_correct(tokenizer.decode(o), a) for o, a in zip(outs, answers))
    return correct / len(samples.ids)


def run_grid(step: Step, tokenizer: Any, haystack: np.ndarray, cfg: NiahConfig, *, digest: str,
             cache_dir: Path) -> dict[tuple[int, float], float | None]:
    """Accuracy per (length, depth); None for cells not attempted (``stop_below``)."""
    grid: dict[tuple[int, float], float | None] = {}
    stopped = False
    for length in sorted(cfg.lengths):
        accs = []
        for depth in cfg.depths:
            if stopped:
                grid[(length, depth)] = None
                continue
            s = cached_samples(tokenizer, haystack, digest=digest, length=length, depth=depth,
                               trials=cfg.trials, seed=cfg.seed, cache_dir=cache_dir, answer=cfg.answer)
            grid[(length, depth)] = score_samples(step, tokenizer, s, batch_size=cfg.batch_size)
            accs.append(grid[(length, depth)])
        if not stopped and cfg.stop_below is not None and float(np.mean(accs)) < cfg.stop_below:
            stopped = True
    return grid


def niah_records(grid: dict[tuple[int, float], float | None], cfg: NiahConfig) -> list:
    """``niah_acc`` per attempted cell (n = trials); ``niah_not_attempted`` per skipped length."""
    from phaselab.catalog.tracking import MetricRecord

    out, skipped = [], set()
    for (length, depth), acc in sorted(grid.items()):
        if acc is None:
            skipped.add(length)
            continue
        out.append(MetricRecord(name="niah_acc", value=float(acc), unit="fraction", context_len=length,
                                depth=float(depth), task="niah", n=cfg.trials))
    for length in sorted(skipped):
        out.append(MetricRecord(name="niah_not_attempted", value=1.0, unit="flag", context_len=length,
                                task="niah", n=0))
    return out
