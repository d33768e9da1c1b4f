"""A Hugging Face text dataset prepared once into token shards (``phaselab data prepare``).

The source is a local ``save_to_disk`` folder (an existing path) or a hub name; either needs the
``data`` extra (`datasets`), and a missing one is a MissingExtraError naming it. Splits: the
dataset's ``train`` / ``validation`` (or ``valid``, ``val``) / ``test`` splits keep their role;
a dataset with a train split only (or a single ``Dataset``) holds out its **last**
``valid_fraction`` of rows (at least one) as ``valid``, in row order, so the split is a pure
function of the rows. Each row's ``text_field`` is one document, tokenised with ``gpt2`` or
``tiktoken:<encoding>`` and followed by the end-of-text token (nanoGPT's prepare.py).

The output is a shard folder (``real_scale.write_shards``: ``<split>.bin``, ``<split>.docs.npy``,
``meta.json`` written last) read by ``data.kind: tokens`` with ``real.shards_dir``. A folder whose
meta.json records the same source and tokenizer is reused, not prepared again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from phaselab.workloads.data import cache_root, require
from phaselab.workloads.data.real_scale import write_shards
from phaselab.workloads.data.tokenizers import build_tokenizer, check_tokenizer_name

HF_SPLITS = {"train": "train", "validation": "valid", "valid": "valid", "val": "valid", "test": "test"}
Progress = Callable[[str, int, int], None]   # (split, rows done, rows in the split)


def load_source(source: str, *, hf_config: str | None = None, cache_dir: str | None = None) -> Any:
    """A DatasetDict or Dataset from a ``save_to_disk`` folder or a hub name."""
    datasets = require("datasets", extra="data", purpose="preparing a Hugging Face dataset")
    if Path(source).expanduser().exists():
        return datasets.load_from_disk(str(Path(source).expanduser()))
    return datasets.load_dataset(source, hf_config, cache_dir=str(cache_root(cache_dir) / "hf"))


def split_rows(ds: Any, valid_fraction: float) -> dict[str, tuple[Any, range]]:
    """phaselab split -> (HF dataset, its row range) following the module docstring's rule."""
    parts = dict(ds) if hasattr(ds, "keys") else {"train": ds}
    unknown = sorted(set(parts) - set(HF_SPLITS))
    if unknown or "train" not in parts:
        raise ValueError(f"dataset splits {sorted(parts)}: expected 'train' and optionally "
                         f"'validation'/'valid'/'val' and 'test' (unknown: {unknown})")
    out = {HF_SPLITS[k]: (v, range(len(v))) for k, v in parts.items()}
    if "valid" not in out:
        if not 0.0 < valid_fraction < 1.0:
            raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
        n = len(parts["train"])
        n_valid = max(1, math.ceil(n * valid_fraction))
        if n_valid >= n:
            raise ValueError(f"a train split of {n} rows cannot hold out {n_valid} for valid")
        out["train"] = (parts["train"], range(n - n_valid))
        out["valid"] = (parts["train"], range(n - n_valid, n))
    return {s: out[s] for s in ("train", "valid", "test") if s in out}


def _docs(rows: dict[str, tuple[Any, range]], text_field: str, tok: Any,
          progress: Progress | None) -> Iterator[tuple[str, np.ndarray]]:
    for split, (ds, rng) in rows.items():
        if text_field not in ds.column_names:
            raise ValueError(f"text field {text_field!r} is not a column of the dataset ({ds.column_names})")
        done = 0
        for batch in ds.select_columns([text_field]).select(rng).iter(batch_size=256):
            for text in batch[text_field]:
                if not isinstance(text, str):
                    raise TypeError(f"row {rng[done]} of split {split!r}: {text_field!r} is "
                                     f"{type(text).__name__}, not text")
                yield split, np.asarray(tok.encode(text), dtype=np.int64)
                done += 1
            if progress is not None:
                progress(split, done, len(rng))


def prepare_hf(source: str, out_dir: Path, *, text_field: str = "text", tokenizer: str = "gpt2",
               hf_config: str | None = None, valid_fraction: float = 0.0005, cache_dir: str | None = None,
               progress: Progress | None = None, force: bool = False) -> dict:
    """Prepare ``source`` into ``out_dir`` (module docstring) and return its meta dict.

    source: a ``save_to_disk`` folder or a hub name; text_field: the column holding each document
    (default "text"); tokenizer: "gpt2" (default) or "tiktoken:<encoding>"; hf_config: the hub
    configuration (default None); valid_fraction: rows held out when there is no validation split
    (default 0.0005, nanoGPT's OpenWebText); progress(split, done, total) is called as rows are
    tokenised; force: prepare again even when out_dir holds the same preparation."""
    import json

    check_tokenizer_name(tokenizer)
    if tokenizer == "char":
        raise ValueError("prepare a Hugging Face dataset with 'gpt2' or 'tiktoken:<encoding>' (a char "
                         "alphabet would need a pass over the whole corpus first)")
    local = Path(source).expanduser()
    ds = load_source(source, hf_config=hf_config, cache_dir=cache_dir)
    parts = dict(ds) if hasattr(ds, "keys") else {"train": ds}
    src = {"hf": str(local.resolve()) if local.exists() else source, "hf_config": hf_config,
           "fingerprints": {k: getattr(v, "_fingerprint", None) for k, v in sorted(parts.items())},
           "text_field": text_field, "valid_fraction": valid_fraction}
    tok = build_tokenizer(tokenizer, cache_dir=cache_root(cache_dir) / "tiktoken")
    meta_path = out_dir / "meta.json"
    if not force and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("source") == json.loads(json.dumps(src)) and meta.get("tokenizer") == tok.config():
            return meta
    rows = split_rows(ds, valid_fraction)
    return write_shards(out_dir, _docs(rows, text_field, tok, progress), splits=tuple(rows),
                        vocab_size=tok.vocab_size, eot_token_id=tok.eot_token_id, tokenizer=tok.config(),
                        source=src)
