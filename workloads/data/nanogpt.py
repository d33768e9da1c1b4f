"""nanoGPT-style token folders without meta.json: ``train.bin``, ``val.bin`` (and ``test.bin``),
raw little-endian token ids as written by nanoGPT's ``prepare.py`` scripts.

Such a folder says nothing about itself, so the grid does: ``real.vocab_size`` (required) and
``real.dtype`` (default uint16 when the vocabulary fits in 16 bits, else int32, as
``token_dtype``). Splits are named as everywhere in phaselab: ``val.bin`` is ``valid``. The
meta dict built here has the shape of a prepared folder's meta.json (``real_scale.read_meta``),
with each split's file named, so ``MemmapTokens`` serves both. Building it reads only file
sizes; the digest (``bare_digest``) hashes the files' bytes, once per file version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from phaselab.workloads.data import RealScaleConfig, file_sha256, make_digest, token_dtype

FILES = {"train": "train.bin", "valid": "val.bin", "test": "test.bin"}


def bare_meta(shards_dir: Path, rc: RealScaleConfig) -> dict[str, Any]:
    """meta.json's fields for a nanoGPT folder (no hashing; ValueError naming the folder and the
    key when a file is missing or the grid lacks the vocabulary size)."""
    if not (shards_dir / FILES["train"]).is_file():
        raise ValueError(f"{shards_dir} has no meta.json and no {FILES['train']}: not a token folder")
    if rc.vocab_size is None or isinstance(rc.vocab_size, bool) or rc.vocab_size < 1:
        raise ValueError(f"{shards_dir} has no meta.json: set data.real.vocab_size (and data.real.dtype, "
                         f"default uint16 up to 65536 tokens) to read its .bin files, got {rc.vocab_size!r}")
    dtype = np.dtype(rc.dtype or token_dtype(rc.vocab_size))
    if rc.vocab_size > np.iinfo(dtype).max + 1:
        raise ValueError(f"data.real.dtype={dtype.name} cannot hold data.real.vocab_size={rc.vocab_size}")
    splits = {}
    for split, fname in FILES.items():
        path = shards_dir / fname
        if not path.is_file():
            continue
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise ValueError(f"{path}: {size} bytes is not a whole number of {dtype.name} tokens "
                             "(check data.real.dtype)")
        splits[split] = {"tokens": size // dtype.itemsize, "file": fname}
    return {"format": "nanogpt-bin", "dtype": dtype.name, "vocab_size": rc.vocab_size, "eot_token_id": None,
            "tokenizer": {"name": "unknown"}, "source": {"folder": str(shards_dir)}, "splits": splits}


def bare_digest(shards_dir: Path, meta: dict[str, Any]) -> str:
    """sha256 over the split files' bytes, dtype and vocabulary size."""
    files = {s: file_sha256(shards_dir / info["file"]) for s, info in meta["splits"].items()}
    return make_digest(json.dumps(files, sort_keys=True), {"dtype": meta["dtype"], "vocab_size": meta["vocab_size"]})
