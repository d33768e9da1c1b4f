"""Real-scale corpora: OpenWebText, PG-19 and the human reference genome (EXPERIMENTS §5.3),
stored as nanoGPT-style pre-tokenised shards.

Network is used only while *preparing* shards (through Hugging Face `datasets`, imported lazily;
without it a MissingExtraError says `pip install phaselab[data]`). Training and evaluation read
the shards as numpy memmaps:

    <shards_dir>/meta.json           format, dtype, vocab, tokenizer, source, per-split sha256, digest
    <shards_dir>/<split>.bin         the split's tokens, documents each followed by EOT (uint16 for GPT-2)
    <shards_dir>/<split>.docs.npy    int64 start offset of every document (PG-19 per-book evaluation)

meta.json is written last, atomically, so a shard folder either is complete or is prepared again.
Its `digest` (sha256 of the token bytes, tokenizer and source) goes into cache keys and the
catalog. Any pre-tokenised folder in this format is served by kind "tokens" (`real.shards_dir`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from phaselab.workloads.data import (
    SPLITS,
    DataConfig,
    RealScaleConfig,
    cache_root,
    check_split,
    make_digest,
    require,
    resolve_path,
    token_dtype,
)
from phaselab.workloads.data.dna import EOS_ID, DnaTokenizer, iter_fasta
from phaselab.workloads.data.nanogpt import bare_digest, bare_meta
from phaselab.workloads.data.text import StreamDataset
from phaselab.workloads.data.tokenizers import CharTokenizer, Gpt2Tokenizer

FORMAT = "phaselab-tokens-v1"
FASTA_CHUNK = 6 * (1 << 20)  # bp per encode call; a multiple of 6 keeps 6-mer boundaries intact
Doc = tuple[str, "np.ndarray | Iterable[np.ndarray]"]  # (split, tokens or token chunks)


# --------------------------------------------------------------------------------------------
# Shard format
# --------------------------------------------------------------------------------------------
def write_shards(out_dir: Path, docs: Iterable[Doc], *, splits: tuple[str, ...], vocab_size: int,
                 eot_token_id: int | None, tokenizer: Mapping[str, Any], source: Mapping[str, Any]) -> dict:
    """Stream documents into `<split>.bin` files (EOT appended to each, as nanoGPT's prepare.py
    does), then write `<split>.docs.npy` and meta.json. Returns the meta dict."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(token_dtype(vocab_size))
    files = {s: open(out_dir / f"{s}.bin.tmp", "wb") for s in splits}  # noqa: SIM115 (closed below)
    hashes = {s: hashlib.sha256() for s in splits}
    counts = dict.fromkeys(splits, 0)
    offsets: dict[str, list[int]] = {s: [] for s in splits}
    try:
        for split, doc in docs:
            if split not in files:
                raise ValueError(f"document for split {split!r}, not in {splits}")
            offsets[split].append(counts[split])
            parts = [doc] if isinstance(doc, np.ndarray) else doc
            if eot_token_id is not None:
                parts = [*parts, np.array([eot_token_id])]
            for part in parts:
                arr = np.asarray(part)
                if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
                    raise ValueError(f"token ids outside [0, {vocab_size}) in split {split!r}")
                buf = arr.astype(dtype).tobytes()
                files[split].write(buf)
                hashes[split].update(buf)
                counts[split] += arr.size
    finally:
        for f in files.values():
            f.close()
    meta_splits = {}
    for s in splits:
        os.replace(out_dir / f"{s}.bin.tmp", out_dir / f"{s}.bin")
        np.save(out_dir / f"{s}.docs.npy", np.asarray(offsets[s], dtype=np.int64))
        meta_splits[s] = {"tokens": counts[s], "documents": len(offsets[s]), "sha256": hashes[s].hexdigest()}
    meta = {"format": FORMAT, "dtype": dtype.name, "vocab_size": vocab_size, "eot_token_id": eot_token_id,
            "tokenizer": dict(tokenizer), "source": dict(source), "splits": meta_splits}
    meta["digest"] = make_digest(json.dumps(meta_splits, sort_keys=True),
                                 {k: meta[k] for k in ("dtype", "vocab_size", "tokenizer", "source")})
    tmp = out_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp, out_dir / "meta.json")
    return meta


def read_meta(shards_dir: Path) -> dict:
    """meta.json of a complete shard folder; checks format and file sizes (cheap, no hashing)."""
    path = shards_dir / "meta.json"
    if not path.is_file():
        raise ValueError(f"{shards_dir} has no meta.json: not a prepared shard folder")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    itemsize = np.dtype(meta["dtype"]).itemsize
    for s, info in meta["splits"].items():
        f = shards_dir / f"{s}.bin"
        if not f.is_file() or f.stat().st_size != info["tokens"] * itemsize:
            raise ValueError(f"{f} is missing or its size does not match meta.json ({info['tokens']} tokens)")
    return meta


def verify_shards(shards_dir: Path) -> None:
    """Re-hash every split file against meta.json (reads all bytes; raises ValueError on mismatch)."""
    meta = read_meta(shards_dir)
    for s, info in meta["splits"].items():
        h = hashlib.sha256()
        with open(shards_dir / f"{s}.bin", "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        if h.hexdigest() != info["sha256"]:
            raise ValueError(f"{shards_dir / (s + '.bin')}: sha256 {h.hexdigest()} != meta {info['sha256']}")


def _tokenizer_from_meta(tok: Mapping[str, Any], cache_dir: str | None) -> Any:
    """Rebuild the recorded tokenizer; None for a tokenizer phaselab does not implement."""
    name = tok.get("name")
    if name == "gpt2":
        return Gpt2Tokenizer(cache_root(cache_dir) / "tiktoken")
    if name in ("dna-6mer", "dna-char"):
        return DnaTokenizer(name.removeprefix("dna-"))
    if name == "char":
        return CharTokenizer(list(tok["chars"]))
    return None


class MemmapTokens(StreamDataset):
    """A prepared shard folder served as a token stream (memmaps; nothing loaded eagerly).
    `tokenizer` is rebuilt from meta.json (None for tokenizers phaselab does not implement)."""

    meta: dict
    shards_dir: Path

    @classmethod
    def from_dir(cls, shards_dir: Path, *, block_size: int, name: str, cache_dir: str | None = None,
                 real: RealScaleConfig | None = None) -> MemmapTokens:
        """A prepared folder (meta.json), or with `real` a nanoGPT folder without one (nanogpt.py)."""
        bare = real is not None and not (shards_dir / "meta.json").is_file()
        meta = bare_meta(shards_dir, real) if bare else read_meta(shards_dir)
        if bare:
            meta["digest"] = bare_digest(shards_dir, meta)
        order = sorted(meta["splits"], key=lambda s: (SPLITS.index(s) if s in SPLITS else len(SPLITS), s))
        arrays = {s: np.memmap(shards_dir / meta["splits"][s].get("file", f"{s}.bin"), dtype=meta["dtype"], mode="r")
                  for s in order}
        ds = cls(name=name, tokens_by_split=arrays, vocab_size=meta["vocab_size"], block_size=block_size,
                 digest=make_digest(meta["digest"], {"block_size": block_size}),
                 tokenizer=_tokenizer_from_meta(meta["tokenizer"], cache_dir))
        ds.meta, ds.shards_dir = meta, shards_dir
        return ds

    @classmethod
    def from_config(cls, cfg: DataConfig) -> MemmapTokens:
        if not cfg.real.shards_dir:
            raise ValueError("data kind 'tokens' needs real.shards_dir (a prepared shard folder)")
        return cls.from_dir(_shards_dir(cfg, ""), block_size=cfg.block_size or 1024,
                            name=f"tokens:{Path(cfg.real.shards_dir).name}", cache_dir=cfg.cache_dir,
                            real=cfg.real)

    def documents(self, split: str) -> Iterator[np.ndarray]:
        """Each document's tokens in order, without its trailing EOT (e.g. one PG-19 book each)."""
        check_split(split, self.splits)
        offsets = self.shards_dir / f"{split}.docs.npy"   # absent in a nanoGPT folder: one document
        starts = np.load(offsets) if offsets.is_file() else np.zeros(1, dtype=np.int64)
        data = self.tokens(split)
        ends = np.append(starts[1:], len(data))
        trim = 1 if self.meta["eot_token_id"] is not None else 0
        for a, b in zip(starts, ends, strict=True):
            yield data[a : b - trim]


def _shards_dir(cfg: DataConfig, default_name: str) -> Path:
    root = cache_root(cfg.cache_dir)
    if cfg.real.shards_dir:
        return resolve_path(cfg.real.shards_dir, root=root, what="real.shards_dir")
    return root / default_name


def _load_or_prepare(cfg: DataConfig, default_name: str, prepare: Any, *, name: str) -> MemmapTokens:
    shards = _shards_dir(cfg, default_name)
    if not (shards / "meta.json").is_file():
        prepare(shards)
    return MemmapTokens.from_dir(shards, block_size=cfg.block_size or 1024, name=name, cache_dir=cfg.cache_dir)


# --------------------------------------------------------------------------------------------
# Text corpora (GPT-2 BPE)
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def _gpt2(cache_dir: str) -> Gpt2Tokenizer:
    return Gpt2Tokenizer(Path(cache_dir))


def _encode_rows(batch: Mapping[str, list], *, cache_dir: str) -> dict[str, list]:
    """datasets.map function (module-level so worker processes can pickle it)."""
    return {"ids": _gpt2(cache_dir).encode_batch(list(batch["text"]))}


def prepare_text_shards(out_dir: Path, rows: Iterable[tuple[str, str]], *, splits: tuple[str, ...],
                        tokenizer: Gpt2Tokenizer, source: Mapping[str, Any]) -> dict:
    """(split, document text) pairs -> GPT-2 shards; the step after any text download."""
    docs = ((s, np.asarray(tokenizer.encode(t), dtype=np.int64)) for s, t in rows)
    return write_shards(out_dir, docs, splits=splits, vocab_size=tokenizer.vocab_size,
                        eot_token_id=tokenizer.eot_token_id, tokenizer=tokenizer.config(), source=source)


def prepare_openwebtext(out_dir: Path, rc: RealScaleConfig, cache: Path) -> dict:
    """nanoGPT's data/openwebtext/prepare.py: 0.05 % held out (seed 2357), GPT-2 BPE + EOT."""
    datasets = require("datasets", extra="data", purpose="preparing OpenWebText")
    name = rc.hf_name or "Skylion007/openwebtext"
    full = datasets.load_dataset(name, rc.hf_config, split="train", num_proc=rc.num_proc,
                                 cache_dir=str(cache / "hf"))
    parts = full.train_test_split(test_size=rc.val_fraction, seed=2357, shuffle=True)
    tok = _gpt2(str(cache / "tiktoken"))
    mapped = {s: parts[k].map(_encode_rows, batched=True, remove_columns=parts[k].column_names,
                              fn_kwargs={"cache_dir": str(cache / "tiktoken")}, num_proc=rc.num_proc,
                              desc=f"tokenising openwebtext/{s}")
              for s, k in (("train", "train"), ("valid", "test"))}
    docs = ((s, np.asarray(r["ids"], dtype=np.int64)) for s in ("train", "valid") for r in mapped[s])
    source = {"hf_name": name, "hf_config": rc.hf_config, "fingerprint": full._fingerprint,
              "rows": len(full), "val_fraction": rc.val_fraction, "split_seed": 2357}
    return write_shards(out_dir, docs, splits=("train", "valid"), vocab_size=tok.vocab_size,
                        eot_token_id=tok.eot_token_id, tokenizer=tok.config(), source=source)


# PG-19 split -> (Hugging Face dataset, split): the test split is emozilla's 100-book copy.
PG19_SOURCES = {"test": ("emozilla/pg19-test", "test"), "train": ("deepmind/pg19", "train"),
                "valid": ("deepmind/pg19", "validation")}


def prepare_pg19(out_dir: Path, rc: RealScaleConfig, cache: Path) -> dict:
    """PG-19 books (streamed), one document per book, GPT-2 BPE + EOT."""
    datasets = require("datasets", extra="data", purpose="preparing PG-19")
    splits = rc.splits or ("test",)
    bad = [s for s in splits if s not in PG19_SOURCES]
    if bad:
        raise ValueError(f"real.splits {bad} not among PG-19's {tuple(PG19_SOURCES)}")
    srcs = {s: ((rc.hf_name or PG19_SOURCES[s][0]), PG19_SOURCES[s][1]) for s in splits}

    def rows() -> Iterator[tuple[str, str]]:
        for s, (name, hf_split) in srcs.items():
            for r in datasets.load_dataset(name, rc.hf_config, split=hf_split, streaming=True,
                                           cache_dir=str(cache / "hf")):
                yield s, r["text"]

    source = {s: {"hf_name": n, "hf_split": h, "hf_config": rc.hf_config} for s, (n, h) in srcs.items()}
    return prepare_text_shards(out_dir, rows(), splits=tuple(splits), tokenizer=_gpt2(str(cache / "tiktoken")),
                               source=source)


class OpenWebText:
    """OpenWebText (GPT-2 BPE, ~9 B train tokens) from prepared shards (prepared on first use)."""

    @classmethod
    def from_config(cls, cfg: DataConfig) -> MemmapTokens:
        cache = cache_root(cfg.cache_dir)
        return _load_or_prepare(cfg, "openwebtext-gpt2", lambda d: prepare_openwebtext(d, cfg.real, cache),
                                name="openwebtext")


class PG19:
    """PG-19 (GPT-2 BPE; `real.splits` default ("test",)), one document per book."""

    @classmethod
    def from_config(cls, cfg: DataConfig) -> MemmapTokens:
        cache = cache_root(cfg.cache_dir)
        ds = _load_or_prepare(cfg, "pg19-gpt2", lambda d: prepare_pg19(d, cfg.real, cache), name="pg19")
        missing = [s for s in (cfg.real.splits or ("test",)) if s not in ds.splits]
        if missing:
            raise ValueError(f"{ds.shards_dir} was prepared without split(s) {missing}; "
                             "choose another real.shards_dir to prepare them")
        return ds


# --------------------------------------------------------------------------------------------
# Human reference genome (6-mer tokens, EXPERIMENTS §2.2)
# --------------------------------------------------------------------------------------------
def _fasta_docs(path: Path, tok: DnaTokenizer, rc: RealScaleConfig) -> Iterator[Doc]:
    """One document per FASTA record, encoded chunk by chunk; records named in
    real.valid_records / real.test_records form those splits, all others train."""
    for header, seq in iter_fasta(path):
        rec = header.split()[0] if header.split() else header
        split = "valid" if rec in rc.valid_records else "test" if rec in rc.test_records else "train"
        yield split, (tok.encode_array(seq[i : i + FASTA_CHUNK]) for i in range(0, len(seq), FASTA_CHUNK))


def prepare_genome(out_dir: Path, cfg: DataConfig, cache: Path) -> dict:
    """Shards from an explicit FASTA (`real.fasta`) or from Hugging Face
    `InstaDeepAI/human_reference_genome` (Nucleotide Transformer's preprocessing, config 6kbp,
    its train/validation/test splits; one document per row)."""
    rc, tok = cfg.real, DnaTokenizer(cfg.dna.tokenizer)
    if rc.fasta:
        path = resolve_path(rc.fasta, root=cache, what="real.fasta")
        if not path.is_file():
            raise ValueError(f"real.fasta {path} does not exist")
        docs: Iterable[Doc] = _fasta_docs(path, tok, rc)
        source: dict[str, Any] = {"fasta": str(path), "size": path.stat().st_size,
                                  "valid_records": list(rc.valid_records), "test_records": list(rc.test_records)}
    else:
        datasets = require("datasets", extra="data", purpose="loading the human reference genome")
        name, conf = rc.hf_name or "InstaDeepAI/human_reference_genome", rc.hf_config or "6kbp"

        # The hub repo is a loading script: datasets < 4 runs it with trust_remote_code; datasets
        # >= 4 no longer runs scripts, so point real.hf_name at a parquet mirror there.
        script = {"trust_remote_code": True} if int(datasets.__version__.split(".")[0]) < 4 else {}

        def hf_docs() -> Iterator[Doc]:
            for s, hf_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
                for r in datasets.load_dataset(name, conf, split=hf_split, streaming=True,
                                               cache_dir=str(cache / "hf"), **script):
                    yield s, tok.encode_array(r["sequence"])

        docs, source = hf_docs(), {"hf_name": name, "hf_config": conf}
    return write_shards(out_dir, docs, splits=("train", "valid", "test"), vocab_size=tok.vocab_size,
                        eot_token_id=EOS_ID, tokenizer=tok.config(), source=source)


class HumanGenome:
    """GRCh38 as 6-mer tokens (vocabulary 4107, block 1000 by default)."""

    @classmethod
    def from_config(cls, cfg: DataConfig) -> MemmapTokens:
        cache = cache_root(cfg.cache_dir)
        src = "fasta-" + hashlib.sha256(cfg.real.fasta.encode()).hexdigest()[:12] if cfg.real.fasta else "hf"
        default = f"human_genome-{src}-{cfg.dna.tokenizer}"
        if cfg.block_size is None:
            cfg = dataclasses.replace(cfg, block_size=1000)
        return _load_or_prepare(cfg, default, lambda d: prepare_genome(d, cfg, cache), name="human_genome")
