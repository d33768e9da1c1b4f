"""MAESTRO v3.0.0 piano MIDI (PoPE music task, EXPERIMENTS §2.2); real scale only.

Tokeniser choice (documented, since the paper's REMI parameters are not confirmed): miditok's
REMI with miditok's default TokenizerConfig plus the special tokens PAD, BOS, EOS, MASK (PAD = 0).
With miditok 3.1.0 that vocabulary has 357 tokens, not the paper's 328; the tokenizer config is
part of the dataset digest, so a different miditok default changes the cache key. Every piece
is one sequence BOS, REMI tokens, EOS.

Splits: a random 90/5/5 split of the pieces (data seed), not MAESTRO's official split.
Training batches: a piece per row (epoch-shuffled), a random crop of block_size+1 tokens, and a
transposition by k semitones with k uniform over the shifts in {-3..+3} that keep every pitch of
the crop inside the tokenizer's pitch range (k = 0 always qualifies). Evaluation: each piece in
consecutive non-overlapping windows, untransposed. Rows are right-padded with loss masking.

Sources: `maestro.root` = an extracted maestro-v3.0.0/ folder, or None to download the MIDI zip
(https://storage.googleapis.com/magentadata/datasets/maestro/v3.0.0/maestro-v3.0.0-midi.zip)
into the cache. Tokens are cached as shards (real_scale.write_shards) keyed by the digest.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from phaselab.workloads.data import (
    SPLIT_CODES,
    SPLITS,
    Batch,
    DataConfig,
    MaestroConfig,
    batch_rng,
    cache_root,
    check_batch_args,
    check_split,
    epoch_order,
    file_sha256,
    make_digest,
    require,
    resolve_path,
)
from phaselab.workloads.data.jsb import pad_batch
from phaselab.workloads.data.real_scale import read_meta, write_shards

MAESTRO_URL = "https://storage.googleapis.com/magentadata/datasets/maestro/v3.0.0/maestro-v3.0.0-midi.zip"
SPECIAL_TOKENS = ("PAD", "BOS", "EOS", "MASK")
_ORDER_TAG, _CROP_TAG = 0x3A, 0x3B


def remi_tokenizer() -> Any:
    """miditok REMI with default parameters and PAD/BOS/EOS/MASK (PAD id 0)."""
    miditok = require("miditok", extra="data", purpose="tokenising MAESTRO MIDI (REMI)")
    tok = miditok.REMI(miditok.TokenizerConfig(special_tokens=list(SPECIAL_TOKENS)))
    if tok.vocab["PAD_None"] != 0:
        raise ValueError(f"miditok put PAD at id {tok.vocab['PAD_None']}, phaselab needs 0")
    return tok


def transpose_tables(vocab: Mapping[str, int], max_shift: int) -> tuple[np.ndarray, np.ndarray]:
    """For a REMI vocabulary, (table_KV, pitch_V): table_KV[k + max_shift] maps every id to its
    id after shifting Pitch_p to Pitch_{p+k} (-1 where that pitch does not exist); pitch_V marks
    the Pitch ids. Non-pitch ids map to themselves."""
    V = max(vocab.values()) + 1
    pitch_V = np.zeros(V, dtype=bool)
    table_KV = np.tile(np.arange(V, dtype=np.int64), (2 * max_shift + 1, 1))
    for name, i in vocab.items():
        if name.startswith("Pitch_"):
            pitch_V[i] = True
            p = int(name.split("_")[1])
            for k in range(-max_shift, max_shift + 1):
                table_KV[k + max_shift, i] = vocab.get(f"Pitch_{p + k}", -1)
    return table_KV, pitch_V


def transpose(tokens: np.ndarray, table_KV: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Shift all pitches by k drawn uniformly among the shifts that keep every pitch in range."""
    max_shift = (len(table_KV) - 1) // 2
    mapped_KT = table_KV[:, tokens]
    valid = np.flatnonzero((mapped_KT >= 0).all(axis=1))  # always contains k = 0
    row = int(valid[rng.integers(len(valid))])
    return mapped_KT[row], row - max_shift


def split_pieces(pieces: list[str], *, seed: int, valid_fraction: float, test_fraction: float) -> dict[str, list[str]]:
    """Random split of piece paths (sorted first, so the split depends only on the names and seed)."""
    if not (0 <= valid_fraction and 0 <= test_fraction and valid_fraction + test_fraction < 1):
        raise ValueError(f"maestro fractions invalid: valid={valid_fraction}, test={test_fraction}")
    order = sorted(pieces)
    perm = batch_rng(0x3C, seed).permutation(len(order))
    n_valid, n_test = round(len(order) * valid_fraction), round(len(order) * test_fraction)
    picked = [order[i] for i in perm]
    return {"valid": sorted(picked[:n_valid]), "test": sorted(picked[n_valid : n_valid + n_test]),
            "train": sorted(picked[n_valid + n_test :])}


def maestro_root(mc: MaestroConfig, cache: Path) -> Path:
    """The extracted MIDI folder: `maestro.root`, or the official zip downloaded into the cache."""
    if mc.root:
        root = resolve_path(mc.root, root=cache, what="maestro.root")
        if not root.is_dir():
            raise ValueError(f"maestro.root {root} is not a directory")
        return root
    target = cache / "maestro"
    root = target / "maestro-v3.0.0"
    if not root.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        zpath = target / "maestro-v3.0.0-midi.zip"
        if not zpath.is_file():
            tmp = zpath.with_suffix(".part")
            urllib.request.urlretrieve(MAESTRO_URL, tmp)
            os.replace(tmp, zpath)
        with zipfile.ZipFile(zpath) as z:
            z.extractall(target)
    return root


def _piece_ids(tok: Any, path: Path) -> np.ndarray:
    seq = tok.encode(path)
    if isinstance(seq, list):  # one sequence per track; MAESTRO pieces are one piano track
        seq = [s for s in seq if s.ids]
        if len(seq) != 1:
            raise ValueError(f"{path}: expected one piano track, got {len(seq)}")
        seq = seq[0]
    v = tok.vocab
    return np.asarray([v["BOS_None"], *seq.ids, v["EOS_None"]], dtype=np.int64)


class Maestro:
    """MAESTRO as a Dataset over cached REMI token shards (one document per piece)."""

    name = "maestro"
    splits = SPLITS

    def __init__(self, cfg: DataConfig) -> None:
        mc, cache = cfg.maestro, cache_root(cfg.cache_dir)
        if not 0 <= mc.max_transpose <= 12:
            raise ValueError(f"maestro.max_transpose must be in [0, 12], got {mc.max_transpose}")
        self.block_size, self.max_transpose = cfg.block_size or 2048, mc.max_transpose
        self.tokenizer = remi_tokenizer()
        self.vocab_size = len(self.tokenizer)
        root = maestro_root(mc, cache)
        pieces = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix.lower() in (".mid", ".midi"))
        if not pieces:
            raise ValueError(f"no .mid/.midi files under {root}")
        source = hashlib.sha256("".join(f"{p}:{file_sha256(root / p)}\n" for p in pieces).encode()).hexdigest()
        tok_cfg = {"remi": self.tokenizer.config.to_dict(serialize=True), "specials": list(SPECIAL_TOKENS)}
        split_cfg = {"seed": cfg.seed, "valid": mc.valid_fraction, "test": mc.test_fraction}
        shard_digest = make_digest(source, {"tokenizer": tok_cfg, "split": split_cfg})
        shards = cache / f"maestro-{shard_digest[:16]}"
        if not (shards / "meta.json").is_file():
            by_split = split_pieces(pieces, seed=cfg.seed, valid_fraction=mc.valid_fraction,
                                    test_fraction=mc.test_fraction)
            docs = ((s, _piece_ids(self.tokenizer, root / p)) for s in SPLITS for p in by_split[s])
            write_shards(shards, docs, splits=SPLITS, vocab_size=self.vocab_size, eot_token_id=None,
                         tokenizer=tok_cfg, source={"pieces_sha256": source, "split": split_cfg})
        dtype = read_meta(shards)["dtype"]  # also checks the cached files are complete
        self._tokens = {s: np.memmap(shards / f"{s}.bin", dtype=dtype, mode="r") for s in SPLITS}
        self._starts = {s: np.load(shards / f"{s}.docs.npy") for s in SPLITS}
        self._tables = transpose_tables(self.tokenizer.vocab, mc.max_transpose)[0]
        self.digest = make_digest(shard_digest, {"block_size": self.block_size, "max_transpose": mc.max_transpose})

    @classmethod
    def from_config(cls, cfg: DataConfig) -> Maestro:
        return cls(cfg)

    def num_pieces(self, split: str) -> int:
        check_split(split, self.splits)
        return len(self._starts[split])

    def piece(self, split: str, i: int) -> np.ndarray:
        """Token ids of piece i of `split` (BOS ... EOS)."""
        check_split(split, self.splits)
        starts, data = self._starts[split], self._tokens[split]
        if not 0 <= i < len(starts):
            raise ValueError(f"piece index {i} out of range for {split} ({len(starts)} pieces)")
        end = starts[i + 1] if i + 1 < len(starts) else len(data)
        return np.asarray(data[starts[i] : end], dtype=np.int64)

    def get_batch(self, split: str, index: int, batch_size: int, *, seed: int) -> Batch:
        check_split(split, self.splits)
        check_batch_args(index, batch_size, seed)
        ids = epoch_order(len(self._starts[split]), index, batch_size, _ORDER_TAG, SPLIT_CODES[split], seed)
        rows = []
        for r, i in enumerate(ids):
            rng = batch_rng(_CROP_TAG, seed, SPLIT_CODES[split], index, r)
            toks = self.piece(split, int(i))
            s = int(rng.integers(0, max(1, len(toks) - self.block_size)))
            crop = toks[s : s + self.block_size + 1]
            if split == "train" and self.max_transpose:
                crop = transpose(crop, self._tables, rng)[0]
            rows.append(crop)
        return pad_batch(rows)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        """Every piece in order, cut into non-overlapping windows (each token scored once)."""
        check_split(split, self.splits)
        check_batch_args(0, batch_size, 0)
        T, rows = self.block_size, []
        for i in range(len(self._starts[split])):
            toks = self.piece(split, i)
            for s in range(0, len(toks) - 1, T):
                rows.append(toks[s : s + T + 1])
                if len(rows) == batch_size:
                    yield pad_batch(rows)
                    rows = []
        if rows:
            yield pad_batch(rows)
