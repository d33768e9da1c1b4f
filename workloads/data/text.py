"""Token-stream datasets: the shared window sampler and the text dataset (Tiny Shakespeare).

`StreamDataset` holds one 1-D token array per split (in memory or a numpy memmap) and serves
- training batches: B random contiguous windows of T+1 tokens (x = w[:-1], y = w[1:]), starts
  drawn by a Generator seeded with (seed, split, index), so batch `index` is a pure function of
  its arguments (nanoGPT's get_batch, made resumable);
- evaluation batches: consecutive non-overlapping windows covering the whole split; the partial
  tail window is right-padded with mask 0, so every token but the first is scored exactly once
  (EXPERIMENTS §2.3 "eval.val_tokens: all").
The DNA and real-scale corpora reuse it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from phaselab.workloads.data import (
    ASSETS_DIR,
    SPLIT_CODES,
    Batch,
    DataConfig,
    batch_rng,
    cache_root,
    check_batch_args,
    check_split,
    file_sha256,
    make_batch,
    make_digest,
    resolve_path,
    token_dtype,
)
from phaselab.workloads.data.text_sources import files_sha256, read_text, text_files
from phaselab.workloads.data.tokenizers import Tokenizer, build_tokenizer, check_tokenizer_name

_WINDOW_TAG = 0x57  # mixed into window-start seeds (distinct from other datasets' tags)


class StreamDataset:
    """Windows over per-split token arrays. `tokens_by_split` values are 1-D integer arrays."""

    def __init__(self, *, name: str, tokens_by_split: Mapping[str, np.ndarray], vocab_size: int,
                 block_size: int, digest: str, tokenizer: Any = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        for split, arr in tokens_by_split.items():
            if arr.ndim != 1 or len(arr) < 2:
                raise ValueError(f"{name}: split {split!r} needs a 1-D array of >= 2 tokens, got {arr.shape}")
        self.name, self.vocab_size, self.block_size = name, vocab_size, block_size
        self.digest, self.tokenizer = digest, tokenizer
        self._tokens = dict(tokens_by_split)
        self.splits = tuple(self._tokens)

    def tokens(self, split: str) -> np.ndarray:
        """The whole split as one 1-D token array (documents joined by EOT where the corpus has them)."""
        check_split(split, self.splits)
        return self._tokens[split]

    def get_batch(self, split: str, index: int, batch_size: int, *, seed: int) -> Batch:
        check_split(split, self.splits)
        check_batch_args(index, batch_size, seed)
        data, T = self._tokens[split], self.block_size
        if len(data) < T + 1:
            raise ValueError(f"{self.name}/{split} has {len(data)} tokens, fewer than block_size+1={T + 1}")
        rng = batch_rng(_WINDOW_TAG, seed, SPLIT_CODES.get(split, 9), index)
        starts = rng.integers(0, len(data) - T, size=batch_size)
        w = np.asarray(data[starts[:, None] + np.arange(T + 1)], dtype=np.int64)
        return make_batch(w[:, :-1], w[:, 1:], np.ones((batch_size, T), dtype=np.float32))

    def num_eval_windows(self, split: str) -> int:
        check_split(split, self.splits)
        return -(-(len(self._tokens[split]) - 1) // self.block_size)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        """Non-overlapping windows in order; window w predicts tokens w*T+1 .. (w+1)*T."""
        check_split(split, self.splits)
        check_batch_args(0, batch_size, 0)
        data, T = self._tokens[split], self.block_size
        n_pred = len(data) - 1
        n_win = self.num_eval_windows(split)
        for w0 in range(0, n_win, batch_size):
            rows = range(w0, min(w0 + batch_size, n_win))
            x = np.zeros((len(rows), T), dtype=np.int64)
            y = np.zeros((len(rows), T), dtype=np.int64)
            mask = np.zeros((len(rows), T), dtype=np.float32)
            for r, w in enumerate(rows):
                s, L = w * T, min(T, n_pred - w * T)
                chunk = np.asarray(data[s : s + L + 1], dtype=np.int64)
                x[r, :L], y[r, :L], mask[r, :L] = chunk[:-1], chunk[1:], 1.0
            yield make_batch(x, y, mask)


@functools.lru_cache(maxsize=8)
def _tokenize_text(paths: tuple[str, ...], sha: str, tokenizer_kind: str, train_fraction: float,
                   cache_dir: str | None) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    text = read_text([Path(p) for p in paths])
    cut = int(len(text) * train_fraction)  # nanoGPT: split the characters, then tokenise each part
    train_text, valid_text = text[:cut], text[cut:]
    tiktoken_dir = cache_root(cache_dir) / "tiktoken" if tokenizer_kind != "char" else None  # char: no cache
    tok = build_tokenizer(tokenizer_kind, text=train_text, cache_dir=tiktoken_dir)
    dtype = token_dtype(tok.vocab_size)
    if tokenizer_kind == "char":
        enc = tok.encode_array  # type: ignore[attr-defined]
    else:
        def enc(s: str) -> np.ndarray:
            return np.asarray(tok.encode(s), dtype=np.int64)
    train, valid = enc(train_text).astype(dtype), enc(valid_text).astype(dtype)
    train.flags.writeable = False
    valid.flags.writeable = False
    return tok, train, valid


class TextDataset(StreamDataset):
    """UTF-8 text from a file, a folder of ``.txt`` files or a glob (``text_sources``: files in
    sorted order, concatenated), split by characters (first `train_fraction` train, rest valid),
    then tokenised with 'char' (sorted character set of the training text), 'gpt2' (offline BPE)
    or 'tiktoken:<encoding>' (tokenizers.build_tokenizer)."""

    @classmethod
    def from_config(cls, cfg: DataConfig) -> TextDataset:
        tc = cfg.text
        if not 0.0 < tc.train_fraction < 1.0:
            raise ValueError(f"text.train_fraction must be in (0, 1), got {tc.train_fraction}")
        check_tokenizer_name(tc.tokenizer)
        base, files = text_files(tc.path, root=ASSETS_DIR)
        single = len(files) == 1 and base / files[0].name == resolve_path(tc.path, root=ASSETS_DIR, what="text.path")
        # one named file keeps the digest of its bytes alone (the keys of stages over it stay)
        sha = file_sha256(files[0]) if single else files_sha256(base, files)
        tok, train, valid = _tokenize_text(tuple(map(str, files)), sha, tc.tokenizer, tc.train_fraction,
                                           cfg.cache_dir)
        block = cfg.block_size or 256
        digest = make_digest(sha, {"kind": "text", "tokenizer": tok.config(),
                                   "train_fraction": tc.train_fraction, "block_size": block})
        stem = files[0].stem if single else base.name
        return cls(name=f"text:{stem}:{tc.tokenizer}", tokens_by_split={"train": train, "valid": valid},
                   vocab_size=tok.vocab_size, block_size=block, digest=digest, tokenizer=tok)
