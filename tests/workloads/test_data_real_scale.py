"""Real-scale loaders offline: the memmap shard format, text/genome preparation from local
inputs, and the clear error when the `data` extra (Hugging Face datasets) is missing."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from phaselab.workloads.data import (
    ASSETS_DIR,
    DataConfig,
    MissingExtraError,
    RealScaleConfig,
    build_dataset,
)
from phaselab.workloads.data.dna import DnaTokenizer
from phaselab.workloads.data.real_scale import (
    prepare_text_shards,
    read_meta,
    verify_shards,
    write_shards,
)
from phaselab.workloads.data.tokenizers import Gpt2Tokenizer

HAS_DATASETS = importlib.util.find_spec("datasets") is not None


def _write_toy(d):
    docs = [("train", np.arange(0, 50) % 97), ("train", np.arange(5, 9)), ("valid", np.array([7, 8, 9]))]
    return write_shards(d, docs, splits=("train", "valid"), vocab_size=100, eot_token_id=99,
                        tokenizer={"name": "toy"}, source={"made_by": "test"})


def test_shard_round_trip(tmp_path):
    d = tmp_path / "toy"
    meta = _write_toy(d)
    assert meta["splits"]["train"]["tokens"] == 56 and meta["splits"]["valid"]["documents"] == 1
    assert json.loads((d / "meta.json").read_text())["digest"] == meta["digest"]
    ds = build_dataset(DataConfig(kind="tokens", block_size=8, real=RealScaleConfig(shards_dir=str(d))))
    train = ds.tokens("train")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16
    assert train.tolist() == [*(np.arange(50) % 97), 99, 5, 6, 7, 8, 99]  # EOT after each document
    assert [doc.tolist() for doc in ds.documents("train")] == [list(np.arange(50) % 97), [5, 6, 7, 8]]
    assert ds.tokens("valid").tolist() == [7, 8, 9, 99] and ds.tokenizer is None
    b = ds.get_batch("train", 4, 3, seed=0)
    assert torch.equal(b.x_BT[:, 1:], b.y_BT[:, :-1])
    same = build_dataset(DataConfig(kind="tokens", block_size=8, real=RealScaleConfig(shards_dir=str(d))))
    assert torch.equal(b.x_BT, same.get_batch("train", 4, 3, seed=0).x_BT) and same.digest == ds.digest
    scored = torch.cat([bb.y_BT[bb.mask_BT > 0] for bb in ds.eval_batches("train", 2)])
    assert scored.tolist() == train[1:].tolist()
    verify_shards(d)


def test_shard_integrity_checks(tmp_path):
    d = tmp_path / "toy"
    _write_toy(d)
    raw = bytearray((d / "train.bin").read_bytes())
    raw[0] ^= 1
    (d / "train.bin").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="sha256"):
        verify_shards(d)
    (d / "valid.bin").write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match="size does not match"):
        read_meta(d)
    with pytest.raises(ValueError, match="outside"):
        write_shards(tmp_path / "x", [("train", np.array([100]))], splits=("train",), vocab_size=100,
                     eot_token_id=None, tokenizer={}, source={})
    with pytest.raises(ValueError, match="no meta.json"):
        build_dataset(DataConfig(kind="tokens", real=RealScaleConfig(shards_dir=str(tmp_path / "x"))))


def test_text_shards_from_local_documents(tmp_path):
    """The post-download half of the PG-19/OWT path on local books (Tiny Shakespeare halves)."""
    tok = Gpt2Tokenizer(tmp_path / "tk")
    text = (ASSETS_DIR / "tinyshakespeare.txt").read_text()
    books = [("test", text[:20_000]), ("test", text[20_000:30_000])]
    meta = prepare_text_shards(tmp_path / "pg", books, splits=("test",), tokenizer=tok,
                               source={"local": "tinyshakespeare"})
    ds = build_dataset(DataConfig(kind="tokens", cache_dir=str(tmp_path),
                                  real=RealScaleConfig(shards_dir=str(tmp_path / "pg"))))
    docs = list(ds.documents("test"))
    assert [tok.decode(d) for d in docs] == [t for _, t in books]
    assert ds.tokens("test")[len(docs[0])] == 50256 and ds.vocab_size == 50257
    assert meta["tokenizer"]["name"] == "gpt2" and ds.tokenizer.encode("Hello world") == [15496, 995]


def test_genome_from_an_explicit_fasta(tmp_path):
    fa = tmp_path / "mini_hg.fa.gz"
    with gzip.open(ASSETS_DIR / "lambda_virus.fa.gz", "rt") as f:
        lam = f.read().split("\n", 1)[1].replace("\n", "")
    with gzip.open(fa, "wt") as f:
        f.write(f">chr1 toy\n{lam[:30000]}\n>chr21\n{lam[30000:40000]}\n>chr22\n{lam[40000:]}NNNN\n")
    cfg = DataConfig(kind="human_genome", cache_dir=str(tmp_path / "cache"), real=RealScaleConfig(fasta=str(fa)))
    ds = build_dataset(cfg)
    assert (ds.vocab_size, ds.block_size, ds.splits) == (4107, 1000, ("train", "valid", "test"))
    tok = DnaTokenizer("6mer")
    assert ds.tokens("train").tolist() == [*tok.encode(lam[:30000]), 4]  # one record + <eos>
    assert tok.decode(next(ds.documents("test"))) == lam[40000:] + "NNNN"
    assert len(ds.tokens("valid")) == 10000 // 6 + 4 // 1 + 1  # 1666 six-mers, 4 singles, <eos>
    assert build_dataset(cfg).digest == ds.digest  # prepared once, reused


@pytest.mark.parametrize("kind", ["openwebtext", "pg19", "human_genome"])
def test_missing_datasets_extra_is_named(kind, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # what an install without the extra sees
    with pytest.raises(MissingExtraError, match=r"pip install phaselab\[data\]"):
        build_dataset(DataConfig(kind=kind, cache_dir=str(tmp_path)))
    assert not any(tmp_path.glob("*/meta.json"))


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.skipif(not HAS_DATASETS, reason="needs the `data` extra (Hugging Face datasets)")
def test_hf_paths_on_a_local_dataset_folder(tmp_path):
    """The OpenWebText and PG-19 preparation code run end to end, `real.hf_name` pointing at a
    local folder instead of the hub (datasets loads local jsonl folders offline)."""
    text = (ASSETS_DIR / "tinyshakespeare.txt").read_text()
    paras = [p for p in text.split("\n\n") if p.strip()][:40]
    _jsonl(tmp_path / "owt" / "train.jsonl", [{"text": p} for p in paras])
    cfg = DataConfig(kind="openwebtext", cache_dir=str(tmp_path / "c"), block_size=16,
                     real=RealScaleConfig(hf_name=str(tmp_path / "owt"), val_fraction=0.1, num_proc=1))
    ds = build_dataset(cfg)
    assert ds.meta["splits"]["valid"]["documents"] == 4 and ds.meta["splits"]["train"]["documents"] == 36
    tok = ds.tokenizer
    got = sorted(tok.decode(d) for s in ("train", "valid") for d in ds.documents(s))
    assert got == sorted(paras)  # every document once, split 36/4, EOT-separated
    assert ds.meta["source"]["split_seed"] == 2357
    _jsonl(tmp_path / "pg" / "test.jsonl", [{"text": paras[0]}, {"text": paras[1]}])
    pg = build_dataset(DataConfig(kind="pg19", cache_dir=str(tmp_path / "c"),
                                  real=RealScaleConfig(hf_name=str(tmp_path / "pg"))))
    assert [tok.decode(d) for d in pg.documents("test")] == paras[:2] and pg.splits == ("test",)
