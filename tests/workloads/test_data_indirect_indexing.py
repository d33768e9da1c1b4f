"""Indirect Indexing generator (EXPERIMENTS §2.1): invariants, determinism, masks, accuracy."""

from __future__ import annotations

import re
import string
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from phaselab.workloads.data import DataConfig, IndirectIndexingConfig, build_dataset, epoch_order
from phaselab.workloads.data.indirect_indexing import (
    CHAR_TO_ID,
    IndirectIndexing,
    decode_example,
    draw_example,
    encode,
    parse_example,
    target_accuracy,
)

SMALL = IndirectIndexingConfig(n_train=2000, n_valid=300, n_test=300)
LINE = re.compile(r"^([A-Za-z]{20,40}),([A-Za-z]),([+-])(\d{1,2}),([A-Za-z])$")


def _ds(**kw) -> IndirectIndexing:
    return IndirectIndexing(IndirectIndexingConfig(**{**SMALL.__dict__, **kw}))


def test_examples_follow_the_definition():
    ds = _ds()
    lengths = Counter()
    for idx in range(1500):
        ex = ds.example("train", idx)
        text = ex.text()
        m = LINE.match(text)
        assert m, text
        src, char, sign, digits, tgt = m.groups()
        assert len(set(src)) == len(src)  # distinct letters
        assert 20 <= len(src) <= 40
        k = int(sign + digits)
        assert -15 <= k <= 15 and digits == str(abs(k))  # explicit sign, no leading zeros
        i = src.index(char)
        assert (i, k) == (ex.i, ex.k) and 0 <= i + k < len(src)
        assert tgt == src[i + k]
        lengths[len(src)] += 1
    assert set(lengths) == set(range(20, 41))  # every length occurs in 1500 draws


def test_paper_examples_parse():
    a = parse_example("TzbkWoKDyscBepYvfwxEVQtgPa, c, -8, b")
    assert (a.i, a.k, a.j) == (10, -8, 2)
    b = parse_example("NZTUIGWkXFrhCJDzscat, N, +4, I")
    assert (b.i, b.k, b.j, b.text()) == (0, 4, 4, "NZTUIGWkXFrhCJDzscat,N,+4,I")
    with pytest.raises(ValueError, match="inconsistent"):
        parse_example("NZTUIGWkXFrhCJDzscat,N,+4,Z")


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    exp = probs * counts.sum()
    return float(((counts - exp) ** 2 / exp).sum())


@pytest.mark.parametrize("mode", ["resample", "shift_first"])
def test_shift_distribution(mode):
    """resample is uniform over valid (i, k) pairs, so P(k) ∝ n-|k|; shift_first has uniform k."""
    cfg = IndirectIndexingConfig(n_min=20, n_max=20, out_of_range=mode)
    rng = np.random.default_rng(123)
    ks = np.array([draw_example(rng, cfg).k for _ in range(6000)])
    counts = np.bincount(ks + 15, minlength=31).astype(float)
    w = 20 - np.abs(np.arange(-15, 16)) if mode == "resample" else np.ones(31)
    # 30 degrees of freedom: the 99.9% quantile is 59.7; the other mode's law scores far above.
    assert _chi2(counts, w / w.sum()) < 59.7
    other = np.ones(31) if mode == "resample" else 20 - np.abs(np.arange(-15, 16))
    assert _chi2(counts, other / other.sum()) > 100


def test_resample_is_uniform_over_source_index_given_shift():
    cfg = IndirectIndexingConfig(n_min=20, n_max=20)
    rng = np.random.default_rng(7)
    exs = [draw_example(rng, cfg) for _ in range(6000)]
    i_when_k_plus_10 = np.array([e.i for e in exs if e.k == 10])  # valid i: 0..9
    counts = np.bincount(i_when_k_plus_10, minlength=10).astype(float)
    assert i_when_k_plus_10.max() == 9 and _chi2(counts, np.full(10, 0.1)) < 27.9  # df 9, 99.9%


def test_zero_shift_option():
    rng = np.random.default_rng(0)
    for mode in ("resample", "shift_first"):
        cfg = IndirectIndexingConfig(allow_zero_shift=False, out_of_range=mode)
        assert all(draw_example(rng, cfg).k != 0 for _ in range(800))
    ks = {_ds().example("train", i).text().split(",")[2] for i in range(2000)}
    assert "+0" in ks and "-0" not in ks


def test_vocab_block_and_spaces():
    ds = build_dataset(DataConfig())
    assert (ds.vocab_size, ds.block_size) == (66, 48)
    assert sorted(CHAR_TO_ID.values())[:65] == list(range(1, 66))
    assert set(CHAR_TO_ID) - {" "} == set(string.ascii_letters + string.digits + ",+-")
    longest = IndirectIndexingConfig(n_min=40, n_max=40)
    with pytest.raises(ValueError, match="block_size=47"):
        IndirectIndexing(longest, block_size=47)
    sp = IndirectIndexing(IndirectIndexingConfig(include_spaces=True, n_train=10), block_size=51)
    assert sp.vocab_size == 67
    assert ", " in decode_example(sp.get_batch("train", 0, 1, seed=0).x_BT[0])
    with pytest.raises(ValueError, match="out_of_range"):
        IndirectIndexing(IndirectIndexingConfig(out_of_range="clip"))


def test_batch_layout_mask_only_on_target():
    ds = _ds()
    b = ds.get_batch("train", 5, 32, seed=3)
    assert b.x_BT.shape == (32, 48) and b.x_BT.dtype == torch.int64 and b.mask_BT.dtype == torch.float32
    assert (b.mask_BT.sum(1) == 1).all()
    for r in range(32):
        t = int(b.mask_BT[r].nonzero())
        full = decode_example(b.x_BT[r]) + decode_example(b.y_BT[r, t : t + 1])
        ex = parse_example(full)  # model input + scored target = one consistent example
        assert decode_example(b.y_BT[r, t : t + 1]) == ex.source[ex.j]
        assert decode_example(b.x_BT[r, t : t + 1]) == ","  # the target follows the last comma
        assert (b.x_BT[r, t + 1 :] == 0).all() and (b.y_BT[r, t + 1 :] == 0).all()  # right PAD
        assert torch.equal(b.x_BT[r, 1 : t + 1], b.y_BT[r, :t])  # y is x shifted by one


def test_batches_are_pure_functions_of_index():
    a, b = _ds(), _ds()
    b1, b2 = a.get_batch("train", 17, 8, seed=1), b.get_batch("train", 17, 8, seed=1)
    assert torch.equal(b1.x_BT, b2.x_BT) and torch.equal(b1.mask_BT, b2.mask_BT)
    assert not torch.equal(b1.x_BT, a.get_batch("train", 18, 8, seed=1).x_BT)
    assert not torch.equal(b1.x_BT, a.get_batch("train", 17, 8, seed=2).x_BT)
    # a different data seed gives a different dataset (and digest)
    c = IndirectIndexing(SMALL, seed=1)
    assert c.example("train", 0) != a.example("train", 0) and c.digest != a.digest


def test_epoch_order_is_a_permutation_per_epoch():
    ids = np.concatenate([epoch_order(10, i, 5, 9) for i in range(4)])
    assert sorted(ids[:10]) == list(range(10)) and sorted(ids[10:]) == list(range(10))
    assert not np.array_equal(ids[:10], ids[10:])  # a fresh permutation each epoch
    assert np.array_equal(epoch_order(10, 1, 7, 9), ids[7:14])  # batch size just slices the stream


def test_splits_are_disjoint_and_eval_is_ordered():
    ds = _ds()
    texts = {s: {ds.example(s, i).text() for i in range(300)} for s in ("train", "valid", "test")}
    assert all(len(v) == 300 for v in texts.values())
    assert not (texts["train"] & texts["valid"] or texts["train"] & texts["test"] or texts["valid"] & texts["test"])
    batches = list(ds.eval_batches("valid", 128))
    assert [bb.x_BT.shape[0] for bb in batches] == [128, 128, 44]
    first = decode_example(batches[0].x_BT[0]) + decode_example(batches[0].y_BT[0][batches[0].mask_BT[0] > 0])
    assert first == ds.example("valid", 0).text()
    with pytest.raises(ValueError, match="split"):
        ds.get_batch("val", 0, 1, seed=0)


def test_encode_decode_round_trip():
    ds = _ds()
    for i in range(50):
        text = ds.example("test", i).text()
        assert decode_example(encode(text)) == text
    with pytest.raises(ValueError, match="'!'"):
        encode("abc!")


def test_target_accuracy_counts_only_the_target():
    ds = _ds()
    b = ds.get_batch("valid", 0, 10, seed=0)
    logits = torch.zeros(10, 48, 66)
    logits.scatter_(2, b.y_BT.unsqueeze(-1), 1.0)  # argmax = y everywhere
    assert target_accuracy(logits, b) == (10, 10)
    t = b.mask_BT.argmax(1)
    wrong = (b.y_BT[torch.arange(10), t] % 65) + 1  # a different letter id
    logits[torch.arange(4), t[:4], wrong[:4]] = 5.0  # 4 wrong answers
    logits[4:, 0, 0] = 9.0  # errors off the target position do not count
    assert target_accuracy(logits, b) == (6, 10)


def test_package_import_is_torch_free():
    code = "import sys, phaselab.workloads.data as d; d.DataConfig(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    with pytest.raises(ValueError, match="unknown data kind 'nope'"):
        build_dataset(DataConfig(kind="nope"))
