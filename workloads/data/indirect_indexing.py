"""Indirect Indexing (PoPE paper, EXPERIMENTS §2.1): a seeded generator, no external data.

An example reads `<source>,<source char>,<signed shift>,<target char>`, e.g.
`NZTUIGWkXFrhCJDzscat,N,+4,I`: the source is n in {20..40} distinct letters of [A-Za-z]; the
query names the letter at index i and a shift k in {-15..+15} ('-' = left, '+' = right,
explicit sign, `+0` allowed by default); the answer is the letter at j = i + k.

Decisions the paper leaves open (EXPERIMENTS §6 row 6), each an `ii.*` field:
- out-of-range j: `resample` redraws (i, k) jointly, i.e. uniform over valid pairs (default);
  `shift_first` draws k, then i uniformly among positions that keep j in range;
- `allow_zero_shift: true`; `include_spaces: false` (then 66 tokens incl. PAD, max length 48,
  block 48 with right padding).

Every example is a pure function of (data seed, split, example index): a numpy Generator is
seeded with that triple, the split code keeping train/valid/test streams disjoint.
Training reads the model on every token except the target and scores only the target.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from phaselab.workloads.data import (
    SPLIT_CODES,
    SPLITS,
    Batch,
    DataConfig,
    IndirectIndexingConfig,
    check_batch_args,
    check_split,
    epoch_order,
    make_batch,
    make_digest,
)

GENERATOR_VERSION = "ii-v1"  # bump when the generator changes: it is part of the digest
LETTERS = string.ascii_uppercase + string.ascii_lowercase  # 52
PAD_ID = 0
# Fixed id table: PAD, A-Z, a-z, 0-9, ',', '+', '-' (66 ids); ' ' (id 66) only with spaces.
ID_TO_CHAR = ("",) + tuple(LETTERS) + tuple(string.digits) + (",", "+", "-", " ")
CHAR_TO_ID = {c: i for i, c in enumerate(ID_TO_CHAR) if c}
_ORDER_TAG = 0x11  # mixed into the batch-order seed so it never equals an example seed


@dataclass(frozen=True)
class Example:
    source: str  # n distinct letters
    i: int  # source index
    k: int  # signed shift
    j: int  # target index = i + k

    def text(self, *, include_spaces: bool = False) -> str:
        sep = ", " if include_spaces else ","
        return sep.join((self.source, self.source[self.i], f"{self.k:+d}", self.source[self.j]))


def encode(text: str) -> np.ndarray:
    """Example text -> int64 token ids (raises ValueError on a character outside the vocab)."""
    try:
        return np.fromiter((CHAR_TO_ID[c] for c in text), dtype=np.int64, count=len(text))
    except KeyError as exc:
        raise ValueError(f"character {exc.args[0]!r} is not in the indirect-indexing vocabulary") from None


def decode_example(tokens: np.ndarray | list[int] | object) -> str:
    """Token ids (a 1-D array, list, or tensor row) -> text, dropping PAD."""
    ids = np.asarray(tokens.tolist() if hasattr(tokens, "tolist") else tokens, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"decode_example expects one sequence, got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= len(ID_TO_CHAR)):
        raise ValueError(f"token ids out of range [0, {len(ID_TO_CHAR)}): {ids.min()}..{ids.max()}")
    return "".join(ID_TO_CHAR[t] for t in ids)


def parse_example(text: str) -> Example:
    """Inverse of Example.text (spaces optional); validates the answer."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4 or parts[2][:1] not in "+-":
        raise ValueError(f"not an indirect-indexing example: {text!r}")
    source, char, k = parts[0], parts[1], int(parts[2])
    i = source.index(char)
    ex = Example(source=source, i=i, k=k, j=i + k)
    if not 0 <= ex.j < len(source) or source[ex.j] != parts[3]:
        raise ValueError(f"inconsistent example (target mismatch): {text!r}")
    return ex


def max_example_length(cfg: IndirectIndexingConfig) -> int:
    """Tokens in the longest example: n_max + ',' + char + ',' + (sign + digits) + ',' + char
    (48 with the defaults), plus one space after each comma with include_spaces."""
    return cfg.n_max + 3 + 2 + (1 + len(str(cfg.max_shift))) + (3 if cfg.include_spaces else 0)


def draw_example(rng: np.random.Generator, cfg: IndirectIndexingConfig) -> Example:
    """Steps 1-5 of EXPERIMENTS §2.1 with the generator `rng`."""
    n = int(rng.integers(cfg.n_min, cfg.n_max + 1))
    source = "".join(LETTERS[c] for c in rng.choice(len(LETTERS), size=n, replace=False))
    K = cfg.max_shift
    if cfg.out_of_range == "resample":
        while True:  # rejection sampling = uniform over the valid (i, k) pairs
            i, k = int(rng.integers(0, n)), int(rng.integers(-K, K + 1))
            if 0 <= i + k < n and (k != 0 or cfg.allow_zero_shift):
                break
    else:  # "shift_first": k uniform, then i uniform among the positions keeping j in range
        while True:
            k = int(rng.integers(-K, K + 1))
            if k != 0 or cfg.allow_zero_shift:
                break
        i = int(rng.integers(max(0, -k), min(n, n - k)))
    return Example(source=source, i=i, k=k, j=i + k)


def _validate(cfg: IndirectIndexingConfig, block_size: int) -> None:
    if not 1 <= cfg.n_min <= cfg.n_max <= len(LETTERS):
        raise ValueError(f"ii.n_min/n_max must satisfy 1 <= n_min <= n_max <= 52, got {cfg.n_min}/{cfg.n_max}")
    if not 0 <= cfg.max_shift < cfg.n_min:
        raise ValueError(f"ii.max_shift must be in [0, n_min), got {cfg.max_shift}")
    if cfg.out_of_range not in ("resample", "shift_first"):
        raise ValueError(f"ii.out_of_range must be 'resample' or 'shift_first', got {cfg.out_of_range!r}")
    if cfg.max_shift == 0 and not cfg.allow_zero_shift:
        raise ValueError("ii.max_shift=0 with ii.allow_zero_shift=false leaves no shift to draw")
    for name in ("n_train", "n_valid", "n_test"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"ii.{name} must be >= 1, got {getattr(cfg, name)}")
    need = max_example_length(cfg)
    if block_size < need:
        raise ValueError(f"data.block_size={block_size} cannot hold the longest example ({need} tokens)")


class IndirectIndexing:
    """The Indirect Indexing task as a Dataset (CONTRACTS §3.3).

    Row layout of a batch (T = block_size, L = example length): x[:L-1] = the example without
    its target (the model reads everything but the answer), y[t] = example[t+1], mask = 1 only at
    t = L-2 (where y is the target letter); positions >= L-1 are PAD with mask 0.
    """

    name = "indirect_indexing"
    splits = SPLITS

    def __init__(self, cfg: IndirectIndexingConfig, *, block_size: int = 48, seed: int = 0) -> None:
        _validate(cfg, block_size)
        self.cfg, self.block_size, self.seed = cfg, block_size, seed
        self.vocab_size = 67 if cfg.include_spaces else 66
        self.pad_id = PAD_ID
        self.split_sizes = {"train": cfg.n_train, "valid": cfg.n_valid, "test": cfg.n_test}
        self.digest = make_digest(
            GENERATOR_VERSION, {"ii": asdict(cfg), "block_size": block_size, "seed": seed}
        )

    @classmethod
    def from_config(cls, cfg: DataConfig) -> IndirectIndexing:
        return cls(cfg.ii, block_size=cfg.block_size or 48, seed=cfg.seed)

    # -- examples --------------------------------------------------------------------------
    def example(self, split: str, index: int) -> Example:
        """Example `index` of `split` (a pure function of data seed, split and index)."""
        check_split(split, self.splits)
        if not 0 <= index < self.split_sizes[split]:
            raise ValueError(f"example index {index} out of range for {split} ({self.split_sizes[split]})")
        rng = np.random.default_rng([self.seed, SPLIT_CODES[split], index])
        return draw_example(rng, self.cfg)

    def _rows(self, split: str, ids: np.ndarray) -> Batch:
        B, T = len(ids), self.block_size
        x = np.full((B, T), PAD_ID, dtype=np.int64)
        y = np.full((B, T), PAD_ID, dtype=np.int64)
        mask = np.zeros((B, T), dtype=np.float32)
        for r, idx in enumerate(ids):
            tok = encode(self.example(split, int(idx)).text(include_spaces=self.cfg.include_spaces))
            L = len(tok)
            x[r, : L - 1] = tok[:-1]
            y[r, : L - 1] = tok[1:]
            mask[r, L - 2] = 1.0  # y[L-2] is the target letter: the only scored position
        return make_batch(x, y, mask)

    # -- Dataset protocol -------------------------------------------------------------------
    def get_batch(self, split: str, index: int, batch_size: int, *, seed: int) -> Batch:
        """Batch `index` of an epoch-shuffled pass over `split` (training seed `seed` orders it)."""
        check_split(split, self.splits)
        check_batch_args(index, batch_size, seed)
        ids = epoch_order(self.split_sizes[split], index, batch_size, _ORDER_TAG, self.seed,
                          SPLIT_CODES[split], seed)
        return self._rows(split, ids)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        """Examples 0..n-1 of `split` in order; the last batch may be smaller."""
        check_split(split, self.splits)
        check_batch_args(0, batch_size, 0)
        n = self.split_sizes[split]
        for start in range(0, n, batch_size):
            yield self._rows(split, np.arange(start, min(start + batch_size, n)))


def target_accuracy(logits_BTV: object, batch: Batch) -> tuple[int, int]:
    """Exact-match (argmax) accuracy on the scored positions: returns (correct, n).

    logits_BTV: [B, T, V] tensor aligned with batch.x_BT; only positions with mask_BT > 0 count
    (for Indirect Indexing: one target letter per example, EXPERIMENTS §2.1)."""
    if tuple(logits_BTV.shape[:2]) != tuple(batch.y_BT.shape):
        raise ValueError(f"logits shape {tuple(logits_BTV.shape)} does not match targets "
                         f"{tuple(batch.y_BT.shape)}")
    sel = batch.mask_BT.to(logits_BTV.device) > 0
    pred = logits_BTV.argmax(dim=-1)
    correct = (pred[sel] == batch.y_BT.to(logits_BTV.device)[sel]).sum()
    return int(correct.item()), int(sel.sum().item())
