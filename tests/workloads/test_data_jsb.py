"""JSB Chorales (EXPERIMENTS §2.2/§5.1): split sizes, token map, masking, long-chorale policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from phaselab.workloads.data import ASSETS_DIR, DataConfig, JsbConfig, build_dataset
from phaselab.workloads.data.jsb import JsbChorales, detokenize, pad_batch, tokenize_chorale

RAW = json.loads((ASSETS_DIR / "Jsb16thSeparated.json").read_text())


@pytest.fixture(scope="module")
def ds() -> JsbChorales:
    return build_dataset(DataConfig(kind="jsb"))


def test_split_sizes_and_vocab(ds):
    assert ds.num_chorales == {"train": 229, "valid": 76, "test": 77}
    assert (ds.vocab_size, ds.block_size) == (90, 2048)
    # 55,228 training steps -> 220,912 tokens (EXPERIMENTS §5.1); split adds 1/3/2 windows
    assert sum(len(s) for s in ds.sequences["train"]) == 220_912
    assert {k: len(v) for k, v in ds.sequences.items()} == {"train": 230, "valid": 79, "test": 79}


def test_token_map_on_a_fixture():
    chorale = [[72, 67, 64, 48], [-1, 67, 64, 48], [21, 108, -1, -1]]
    assert tokenize_chorale(chorale).tolist() == [53, 48, 45, 29, 1, 48, 45, 29, 2, 89, 1, 1]
    assert detokenize(tokenize_chorale(chorale)).tolist() == chorale
    with pytest.raises(ValueError, match="pitch 20"):
        tokenize_chorale([[20, 60, 60, 60]])
    with pytest.raises(ValueError, match="shape"):
        tokenize_chorale([[60, 60, 60]])


def test_raster_order_of_the_first_training_chorale(ds):
    first = np.asarray(RAW["train"][0])
    toks = ds.sequences["train"][0]
    assert toks[:4].tolist() == [p - 19 if p >= 0 else 1 for p in first[0]]  # S, A, T, B of step 0
    assert np.array_equal(detokenize(toks), first)


def test_long_chorales(ds):
    lengths = {s: [len(c) * 4 for c in RAW[s]] for s in RAW}
    assert {s: sum(n > 2048 for n in v) for s, v in lengths.items()} == {"train": 1, "valid": 3, "test": 2}
    assert max(max(v) for v in lengths.values()) == 2560
    longest = max(range(77), key=lambda i: len(RAW["test"][i]))
    # split: the 640-step chorale becomes its 512-step and 128-step windows, in order
    idx = sum(1 + (len(RAW["test"][i]) * 4 > 2048) for i in range(longest))
    a, b = ds.sequences["test"][idx], ds.sequences["test"][idx + 1]
    assert (len(a), len(b)) == (2048, 512)
    assert np.array_equal(np.concatenate([a, b]), tokenize_chorale(RAW["test"][longest]))
    tr = build_dataset(DataConfig(kind="jsb", jsb=JsbConfig(long_sequence_policy="truncate")))
    assert [len(v) for v in tr.sequences.values()] == [229, 76, 77]
    assert max(len(s) for v in tr.sequences.values() for s in v) == 2048
    assert tr.digest != ds.digest
    with pytest.raises(ValueError, match="long_sequence_policy"):
        build_dataset(DataConfig(kind="jsb", jsb=JsbConfig(long_sequence_policy="drop")))


def test_padding_and_first_token_unscored():
    b = pad_batch([np.array([5, 6, 7, 8, 9]), np.array([10, 11, 12])])
    assert b.x_BT.tolist() == [[5, 6, 7, 8], [10, 11, 0, 0]]
    assert b.y_BT.tolist() == [[6, 7, 8, 9], [11, 12, 0, 0]]  # token 5 and 10 are never targets
    assert b.mask_BT.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_batches_pure_and_eval_covers_split(ds):
    b1 = ds.get_batch("train", 3, 4, seed=0)
    assert torch.equal(b1.x_BT, build_dataset(DataConfig(kind="jsb")).get_batch("train", 3, 4, seed=0).x_BT)
    assert not torch.equal(b1.x_BT, ds.get_batch("train", 3, 4, seed=1).x_BT)
    assert b1.x_BT.shape[1] == int(b1.mask_BT.sum(1).max())  # padded to the longest, no more
    total = sum(bb.n_scored for bb in ds.eval_batches("valid", 8))
    assert total == ds.num_scored("valid") == 73_632 - 79  # every token but each sequence's first
    # one epoch of training batches visits every sequence exactly once
    seen = [tuple(row[m > 0].tolist()) for i in range(23) for bb in [ds.get_batch("train", i, 10, seed=5)]
            for row, m in zip(bb.x_BT, bb.mask_BT, strict=True)]
    assert sorted(seen) == sorted(tuple(s[:-1].tolist()) for s in ds.sequences["train"])


def test_packed_training_batches_are_step_aligned_windows_of_the_stream(ds):
    packed = build_dataset(DataConfig(kind="jsb", block_size=64, jsb=JsbConfig(train_batches="packed")))
    stream = np.concatenate(packed.sequences["train"])
    b = packed.get_batch("train", 5, 3, seed=2)
    assert b.x_BT.shape == (3, 64) and b.mask_BT.min().item() == 1.0   # every position scored
    for x, y in zip(b.x_BT.numpy(), b.y_BT.numpy()):
        hits = [s for s in range(0, len(stream) - 64, 4) if np.array_equal(stream[s : s + 64], x)]
        assert hits, "a row is not a step-aligned window of the training stream"
        assert np.array_equal(stream[hits[0] + 1 : hits[0] + 65], y)
    again = packed.get_batch("train", 5, 3, seed=2)
    assert torch.equal(again.x_BT, b.x_BT)
    assert not torch.equal(packed.get_batch("train", 6, 3, seed=2).x_BT, b.x_BT)
    # evaluation stays per chorale, and the digest tells the two training streams apart
    rows = [e.x_BT.shape[0] for e in packed.eval_batches("valid", 100)]
    assert sum(rows) == len(packed.sequences["valid"]) > 79
    assert packed.digest != build_dataset(DataConfig(kind="jsb", block_size=64)).digest
    assert ds.digest == build_dataset(DataConfig(kind="jsb")).digest
