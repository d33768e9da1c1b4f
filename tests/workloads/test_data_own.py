"""Bring your own data: a text folder, a glob, a nanoGPT .bin folder without meta.json and a
Hugging Face dataset saved to disk, prepared into shards (no network)."""

from __future__ import annotations

import numpy as np
import pytest

from phaselab.workloads.data import DataConfig, RealScaleConfig, TextConfig, build_dataset
from phaselab.workloads.data.text_sources import text_files


def _corpus(root):
    (root / "b").mkdir(parents=True)
    (root / "a.txt").write_text("hello world\n" * 30)           # 360 chars
    (root / "b" / "c.txt").write_text("zebra\n" * 40)           # 240 chars
    (root / "b" / "notes.md").write_text("markdown " * 10)
    (root / ".hidden.txt").write_text("secret")
    return root


def test_text_folder_reads_txt_files_in_sorted_order(tmp_path):
    root = _corpus(tmp_path / "corpus")
    ds = build_dataset(DataConfig(kind="text", block_size=8, cache_dir=str(tmp_path / "c"),
                                  text=TextConfig(path=str(root))))
    text = "hello world\n" * 30 + "zebra\n" * 40
    assert ds.name == "text:corpus:char" and ds.vocab_size == len(set(text[:540]))
    assert (len(ds.tokens("train")), len(ds.tokens("valid"))) == (540, 60)   # 90/10 of 600 characters
    assert ds.tokenizer.decode(ds.tokens("train")) + ds.tokenizer.decode(ds.tokens("valid")) == text
    (root / "b" / "c.txt").write_text("zebra\n" * 41)
    again = build_dataset(DataConfig(kind="text", block_size=8, cache_dir=str(tmp_path / "c"),
                                     text=TextConfig(path=str(root))))
    assert again.digest != ds.digest and len(again.tokens("valid")) == 61


def test_text_glob_and_its_errors(tmp_path):
    root = _corpus(tmp_path / "corpus")
    base, files = text_files(str(root / "**" / "*.md"), root=tmp_path)
    assert base == root and [p.name for p in files] == ["notes.md"]
    ds = build_dataset(DataConfig(kind="text", block_size=4, text=TextConfig(path=str(root / "*" / "*.txt"))))
    assert ds.tokenizer.decode(ds.tokens("valid")) == ("zebra\n" * 40)[-24:]   # only b/c.txt: 240 chars
    with pytest.raises(ValueError, match="matches no text file"):
        build_dataset(DataConfig(kind="text", text=TextConfig(path=str(root / "*.csv"))))
    with pytest.raises(ValueError, match="does not exist"):
        build_dataset(DataConfig(kind="text", text=TextConfig(path=str(root / "nope"))))
    with pytest.raises(ValueError, match="tiktoken:<encoding>"):
        build_dataset(DataConfig(kind="text", text=TextConfig(path=str(root), tokenizer="bpe")))


def test_nanogpt_bin_folder_without_meta(tmp_path):
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 300, 1000, dtype=np.uint16), rng.integers(0, 300, 100, dtype=np.uint16)
    train.tofile(tmp_path / "train.bin")
    val.tofile(tmp_path / "val.bin")
    real = RealScaleConfig(shards_dir=str(tmp_path), vocab_size=300)
    ds = build_dataset(DataConfig(kind="tokens", block_size=16, real=real))
    assert ds.splits == ("train", "valid") and ds.vocab_size == 300 and ds.tokenizer is None
    assert np.array_equal(ds.tokens("valid"), val) and np.array_equal(ds.tokens("train"), train)
    b = ds.get_batch("train", 0, 2, seed=0)
    assert b.x_BT.shape == (2, 16) and int(b.x_BT.max()) < 300
    assert [len(d) for d in ds.documents("valid")] == [100]
    with pytest.raises(ValueError, match="real.vocab_size"):
        build_dataset(DataConfig(kind="tokens", real=RealScaleConfig(shards_dir=str(tmp_path))))
    with pytest.raises(ValueError, match="int64"):   # 2000 bytes are not whole int64 tokens
        (tmp_path / "train.bin").write_bytes(b"\0" * 2004)
        build_dataset(DataConfig(kind="tokens", real=RealScaleConfig(shards_dir=str(tmp_path), vocab_size=300,
                                                                     dtype="int64")))


def test_hugging_face_dataset_saved_to_disk_prepared_once(tmp_path):
    datasets = pytest.importorskip("datasets")
    from phaselab.workloads.data.hf import prepare_hf

    rows = [f"document {i}: the quick brown fox" for i in range(20)]
    datasets.Dataset.from_dict({"text": rows, "n": list(range(20))}).save_to_disk(str(tmp_path / "hf"))
    seen = []
    meta = prepare_hf(str(tmp_path / "hf"), tmp_path / "shards", valid_fraction=0.1,
                      cache_dir=str(tmp_path / "c"), progress=lambda *a: seen.append(a))
    assert {s: v["documents"] for s, v in meta["splits"].items()} == {"train": 18, "valid": 2}
    assert seen[-2:] == [("train", 18, 18), ("valid", 2, 2)]
    ds = build_dataset(DataConfig(kind="tokens", block_size=4, cache_dir=str(tmp_path / "c"),
                                  real=RealScaleConfig(shards_dir=str(tmp_path / "shards"))))
    assert ds.vocab_size == 50257 and ds.tokenizer.decode(ds.tokens("valid")) == \
        "".join(r + "<|endoftext|>" for r in rows[18:])
    assert [ds.tokenizer.decode(d) for d in ds.documents("train")][:2] == rows[:2]
    stamp = (tmp_path / "shards" / "meta.json").stat().st_mtime_ns
    assert prepare_hf(str(tmp_path / "hf"), tmp_path / "shards", valid_fraction=0.1,
                      cache_dir=str(tmp_path / "c")) == meta
    assert (tmp_path / "shards" / "meta.json").stat().st_mtime_ns == stamp   # reused, not prepared again
    with pytest.raises(ValueError, match="'body' is not a column"):
        prepare_hf(str(tmp_path / "hf"), tmp_path / "other", text_field="body", cache_dir=str(tmp_path / "c"))
