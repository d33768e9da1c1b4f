"""Text datasets: offline GPT-2 BPE via tiktoken, char tokenizer, windows, path validation."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from phaselab.workloads.data import DataConfig, TextConfig, build_dataset
from phaselab.workloads.data.tokenizers import CharTokenizer


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def test_tiktoken_gpt2_offline_with_sockets_disabled(tmp_path):
    """A fresh process, with every socket connect raising, builds GPT-2 BPE from the package files."""
    code = textwrap.dedent(f"""
        import socket
        def _no_net(*a, **k): raise RuntimeError("network used")
        socket.socket.connect = _no_net
        socket.create_connection = _no_net
        from pathlib import Path
        from phaselab.workloads.data.tokenizers import Gpt2Tokenizer
        tok = Gpt2Tokenizer(Path({str(tmp_path / "tk")!r}))
        enc = tok.encoding
        print(tok.encode("Hello world"), enc.encode("<|endoftext|>", allowed_special="all"),
              tok.eot_token_id, tok.vocab_size)
    """)
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[15496, 995] [50256] 50256 50257"
    assert len(list((tmp_path / "tk").iterdir())) == 2  # the two SHA-1-named cache files


def test_char_tokenizer_round_trip():
    tok = CharTokenizer.from_text("hello, world\n")
    assert tok.chars == sorted(set("hello, world\n")) and tok.vocab_size == 10
    ids = tok.encode("world, hello")
    assert tok.decode(ids) == "world, hello"
    assert np.array_equal(tok.encode_array("world, hello"), ids)
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("z")
    with pytest.raises(ValueError, match="'é'"):
        tok.encode_array("hé")


def test_shakespeare_char_matches_nanogpt(cache):
    ds = build_dataset(DataConfig(kind="text", cache_dir=cache))
    # nanoGPT data/shakespeare_char/prepare.py: 65 chars, 1,003,854 train and 111,540 val tokens
    assert (ds.vocab_size, ds.block_size) == (65, 256)
    assert (len(ds.tokens("train")), len(ds.tokens("valid"))) == (1_003_854, 111_540)
    assert ds.tokenizer.decode(ds.tokens("train")[:14]) == "First Citizen:"
    assert ds.tokenizer.chars[:3] == ["\n", " ", "!"]


def test_shakespeare_gpt2_matches_nanogpt(cache):
    ds = build_dataset(DataConfig(kind="text", cache_dir=cache, block_size=1024, text=TextConfig(tokenizer="gpt2")))
    # nanoGPT data/shakespeare/readme.md: train.bin 301,966 tokens, val.bin 36,059 tokens
    assert (len(ds.tokens("train")), len(ds.tokens("valid"))) == (301_966, 36_059)
    assert ds.tokens("train").dtype == np.uint16 and ds.vocab_size == 50257
    assert ds.tokens("train")[:3].tolist() == [5962, 22307, 25]  # "First Citizen:"
    assert ds.digest != build_dataset(DataConfig(kind="text", cache_dir=cache, block_size=1024)).digest


def test_training_windows_pure_and_contiguous(cache):
    cfg = DataConfig(kind="text", cache_dir=cache, block_size=64)
    a, b = build_dataset(cfg), build_dataset(cfg)
    b1 = a.get_batch("train", 11, 4, seed=0)
    assert torch.equal(b1.x_BT, b.get_batch("train", 11, 4, seed=0).x_BT)
    assert not torch.equal(b1.x_BT, a.get_batch("train", 12, 4, seed=0).x_BT)
    assert torch.equal(b1.x_BT[:, 1:], b1.y_BT[:, :-1]) and bool((b1.mask_BT == 1).all())
    toks = a.tokens("train").astype(np.int64)
    for row in b1.x_BT.numpy():  # each row is a real window of the corpus
        hits = np.flatnonzero(toks[: len(toks) - 64] == row[0])
        assert any(np.array_equal(toks[h : h + 64], row) for h in hits)


def test_eval_windows_score_every_token_once(cache):
    ds = build_dataset(DataConfig(kind="text", cache_dir=cache, block_size=1000))
    batches = list(ds.eval_batches("valid", 16))
    n = len(ds.tokens("valid"))
    assert sum(bb.x_BT.shape[0] for bb in batches) == -(-(n - 1) // 1000) == 112
    scored = torch.cat([bb.y_BT[bb.mask_BT > 0] for bb in batches]).numpy()
    assert np.array_equal(scored, ds.tokens("valid")[1:])
    assert batches[-1].mask_BT[-1].sum() == (n - 1) % 1000  # the padded partial tail


def test_paths_are_validated(cache, tmp_path):
    with pytest.raises(ValueError, match="escapes its allowed root"):
        build_dataset(DataConfig(kind="text", cache_dir=cache, text=TextConfig(path="../../../etc/passwd")))
    own = tmp_path / "own.txt"
    own.write_text("abcabcabc" * 50)
    ds = build_dataset(DataConfig(kind="text", cache_dir=cache, block_size=8, text=TextConfig(path=str(own))))
    assert ds.vocab_size == 3 and ds.tokenizer.decode(ds.tokens("valid")[:3]) == "abc"
    with pytest.raises(ValueError, match="split"):
        ds.get_batch("test", 0, 1, seed=0)
    with pytest.raises(ValueError, match="tokenizer"):
        build_dataset(DataConfig(kind="text", text=TextConfig(tokenizer="bytes")))
