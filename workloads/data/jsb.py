"""JSB Chorales from the shipped `Jsb16thSeparated.json` (EXPERIMENTS §2.2, §5.1).

Each chorale is a list of 16th-note steps of 4 MIDI pitches (S, A, T, B; -1 = silence). It is
serialised in raster order (Music Transformer): S,A,T,B of step 0, then step 1, ... =
`np.asarray(chorale).reshape(-1)`. Token map (phaselab's, vocabulary 90): PAD = 0, silence = 1,
pitch p in [21, 108] -> p - 19. There is no BOS, so the first token of a sequence is never a
target. Batches are padded to their longest sequence with loss masking; no packing, unless
`jsb.train_batches: packed` (training rows are random block_size windows of the concatenated
training chorales, starting on a step boundary; an ablation of the paper's unstated batching).

Six chorales exceed 2048 tokens (1 train, 3 valid, 2 test). `jsb.long_sequence_policy`:
"split" (default) cuts every chorale longer than block_size into consecutive windows of
block_size // 4 steps (512 at 2048), each an independent sequence; "truncate" keeps the first
window only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import numpy as np

from phaselab.workloads.data import (
    ASSETS_DIR,
    SPLIT_CODES,
    SPLITS,
    Batch,
    DataConfig,
    JsbConfig,
    batch_rng,
    check_batch_args,
    check_split,
    epoch_order,
    file_sha256,
    make_batch,
    make_digest,
    resolve_path,
)

PAD_ID, SILENCE_ID, PITCH_OFFSET = 0, 1, 19
MIN_PITCH, MAX_PITCH = 21, 108
VOCAB_SIZE = MAX_PITCH - PITCH_OFFSET + 1  # 90
VOICES = 4
_ORDER_TAG = 0x15B


def tokenize_chorale(chorale: Sequence[Sequence[int]]) -> np.ndarray:
    """[steps][4] MIDI pitches (-1 = silence) -> raster-order token ids (int64, length 4*steps)."""
    arr = np.asarray(chorale, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != VOICES:
        raise ValueError(f"a chorale must be [steps, 4] pitches, got shape {arr.shape}")
    flat = arr.reshape(-1)
    bad = (flat != -1) & ((flat < MIN_PITCH) | (flat > MAX_PITCH))
    if bad.any():
        raise ValueError(f"pitch {int(flat[bad][0])} outside [{MIN_PITCH}, {MAX_PITCH}] and not -1")
    return np.where(flat == -1, SILENCE_ID, flat - PITCH_OFFSET)


def detokenize(tokens: np.ndarray) -> np.ndarray:
    """Inverse of tokenize_chorale (PAD must have been stripped): -> [steps, 4] pitches."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size % VOICES or (tokens < SILENCE_ID).any() or (tokens >= VOCAB_SIZE).any():
        raise ValueError("tokens must be a multiple of 4 ids in [1, 90)")
    return np.where(tokens == SILENCE_ID, -1, tokens + PITCH_OFFSET).reshape(-1, VOICES)


def apply_policy(tokens: np.ndarray, *, block_size: int, policy: str) -> list[np.ndarray]:
    """Cut one tokenised chorale per the long-sequence policy (windows of block_size//4 steps)."""
    if len(tokens) <= block_size:
        return [tokens]
    window = (block_size // VOICES) * VOICES
    if policy == "truncate":
        return [tokens[:window]]
    if policy == "split":
        return [tokens[s : s + window] for s in range(0, len(tokens), window)]
    raise ValueError(f"jsb.long_sequence_policy must be 'split' or 'truncate', got {policy!r}")


def pad_batch(seqs: Sequence[np.ndarray]) -> Batch:
    """Variable-length sequences -> one batch padded to the longest (x = s[:-1], y = s[1:])."""
    T = max(len(s) for s in seqs) - 1
    x = np.full((len(seqs), T), PAD_ID, dtype=np.int64)
    y = np.full((len(seqs), T), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(seqs), T), dtype=np.float32)
    for r, s in enumerate(seqs):
        n = len(s) - 1
        x[r, :n], y[r, :n], mask[r, :n] = s[:-1], s[1:], 1.0
    return make_batch(x, y, mask)


class JsbChorales:
    """JSB Chorales as a Dataset: `sequences[split]` holds the token sequences after the policy."""

    name = "jsb"
    splits = SPLITS
    vocab_size = VOCAB_SIZE

    def __init__(self, cfg: JsbConfig, *, block_size: int = 2048) -> None:
        if block_size < 2 * VOICES:
            raise ValueError(f"data.block_size must be >= 8 for JSB, got {block_size}")
        path = resolve_path(cfg.path, root=ASSETS_DIR, what="jsb.path")
        if not path.is_file():
            raise ValueError(f"jsb.path {path} does not exist")
        raw = json.loads(path.read_bytes())
        missing = [s for s in SPLITS if s not in raw]
        if missing:
            raise ValueError(f"{path} lacks the split(s) {missing}")
        self.block_size, self.cfg = block_size, cfg
        self.num_chorales = {s: len(raw[s]) for s in SPLITS}
        self.sequences: dict[str, list[np.ndarray]] = {
            s: [w for ch in raw[s] for w in apply_policy(tokenize_chorale(ch), block_size=block_size,
                                                         policy=cfg.long_sequence_policy)]
            for s in SPLITS
        }
        packed = cfg.train_batches == "packed"
        # "train_batches" enters the digest only when packed, so padded datasets keep their digest
        self.digest = make_digest(file_sha256(path), {
            "kind": "jsb", "token_map": "pad0-silence1-pitch-minus-19", "raster": True, "bos": False,
            "long_sequence_policy": cfg.long_sequence_policy, "block_size": block_size,
            **({"train_batches": "packed"} if packed else {})})
        self._train_stream = np.concatenate(self.sequences["train"]) if packed else None

    @classmethod
    def from_config(cls, cfg: DataConfig) -> JsbChorales:
        return cls(cfg.jsb, block_size=cfg.block_size or 2048)

    def num_scored(self, split: str) -> int:
        """Scored tokens in a whole split (every token except each sequence's first)."""
        check_split(split, self.splits)
        return sum(len(s) - 1 for s in self.sequences[split])

    def get_batch(self, split: str, index: int, batch_size: int, *, seed: int) -> Batch:
        """Batch `index` of an epoch-shuffled pass over the split's sequences."""
        check_split(split, self.splits)
        check_batch_args(index, batch_size, seed)
        if split == "train" and self.cfg.train_batches == "packed":
            return self._packed_batch(index, batch_size, seed)
        seqs = self.sequences[split]
        ids = epoch_order(len(seqs), index, batch_size, _ORDER_TAG, SPLIT_CODES[split], seed)
        return pad_batch([seqs[i] for i in ids])

    def _packed_batch(self, index: int, batch_size: int, seed: int) -> Batch:
        """Rows of block_size + 1 tokens from the training stream at random step-aligned offsets,
        a pure function of (seed, index) like every other batch."""
        stream, n = self._train_stream, self.block_size + 1
        if len(stream) < n:
            raise ValueError(f"jsb.train_batches=packed needs more than block_size={self.block_size} training tokens")
        starts = batch_rng(seed, SPLIT_CODES["train"], index, _ORDER_TAG).integers(0, (len(stream) - n) // VOICES + 1,
                                                                              size=batch_size) * VOICES
        return pad_batch([stream[s : s + n] for s in starts])

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        """The split's sequences in file order, batch_size at a time (last batch smaller)."""
        check_split(split, self.splits)
        check_batch_args(0, batch_size, 0)
        seqs = self.sequences[split]
        for start in range(0, len(seqs), batch_size):
            yield pad_batch(seqs[start : start + batch_size])
