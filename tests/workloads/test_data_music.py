"""MAESTRO loader pieces that run offline: transposition, piece split, the missing-extra error,
and (when miditok is installed) the whole dataset on a folder of hand-written MIDI files."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest
import torch

from phaselab.workloads.data import DataConfig, MaestroConfig, MissingExtraError, build_dataset
from phaselab.workloads.data.music import split_pieces, transpose, transpose_tables

VOCAB = {"PAD_None": 0, "Bar_None": 1, **{f"Pitch_{p}": p - 19 for p in range(21, 25)}, "Velocity_80": 6}


def test_transpose_tables_and_valid_shifts():
    table, is_pitch = transpose_tables(VOCAB, 3)
    assert is_pitch.tolist() == [False, False, True, True, True, True, False]
    assert table[3 + 2].tolist() == [0, 1, 4, 5, -1, -1, 6]  # k=+2: Pitch_21 -> Pitch_23, ...
    rng = np.random.default_rng(0)
    crop = np.array([1, 2, 6, 3, 1])  # Bar, Pitch_21, Velocity, Pitch_22, Bar
    ks = Counter()
    for _ in range(2000):
        out, k = transpose(crop, table, rng)
        ks[k] += 1
        assert out.tolist() == [1, 2 + k, 6, 3 + k, 1]
    assert sorted(ks) == [0, 1, 2]  # Pitch_22 + 3 = Pitch_25 is out of range; nothing below 21
    assert all(600 < c < 730 for c in ks.values())  # uniform over the 3 valid shifts


def test_split_pieces_90_5_5():
    names = [f"2004/piece_{i:03d}.midi" for i in range(200)]
    s = split_pieces(names, seed=0, valid_fraction=0.05, test_fraction=0.05)
    assert [len(s[k]) for k in ("train", "valid", "test")] == [180, 10, 10]
    assert sorted(s["train"] + s["valid"] + s["test"]) == names
    assert s == split_pieces(list(reversed(names)), seed=0, valid_fraction=0.05, test_fraction=0.05)
    assert s["valid"] != split_pieces(names, seed=1, valid_fraction=0.05, test_fraction=0.05)["valid"]
    with pytest.raises(ValueError, match="fractions"):
        split_pieces(names, seed=0, valid_fraction=0.6, test_fraction=0.5)


def test_missing_miditok_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "miditok", None)
    with pytest.raises(MissingExtraError, match=r"pip install phaselab\[data\]"):
        build_dataset(DataConfig(kind="maestro", cache_dir=str(tmp_path), maestro=MaestroConfig(root=str(tmp_path))))


def _varlen(n: int) -> bytes:
    out = [n & 0x7F]
    while n > 0x7F:
        n >>= 7
        out.insert(0, (n & 0x7F) | 0x80)
    return bytes(out)


def _midi(notes: list[tuple[int, int, int]]) -> bytes:
    """A format-0 MIDI file (480 ticks per quarter) from (pitch, start, duration) in ticks."""
    events = sorted([(s, 0x90, p, 80) for p, s, _ in notes] + [(s + d, 0x80, p, 0) for p, s, d in notes])
    body, t = b"", 0
    for tick, status, p, v in events:
        body, t = body + _varlen(tick - t) + bytes([status, p, v]), tick
    body += b"\x00\xff\x2f\x00"
    return (b"MThd" + (6).to_bytes(4, "big") + (0).to_bytes(2, "big") + (1).to_bytes(2, "big")
            + (480).to_bytes(2, "big") + b"MTrk" + len(body).to_bytes(4, "big") + body)


def test_maestro_on_local_midi(tmp_path):
    pytest.importorskip("miditok")
    root = tmp_path / "maestro-v3.0.0"
    rng = np.random.default_rng(0)
    for i in range(20):
        (root / "2018").mkdir(parents=True, exist_ok=True)
        notes = [(int(rng.integers(48, 80)), 240 * j, 240) for j in range(30 + i)]
        (root / "2018" / f"p{i:02d}.midi").write_bytes(_midi(notes))
    cfg = DataConfig(kind="maestro", block_size=32, cache_dir=str(tmp_path / "c"), maestro=MaestroConfig(root=str(root)))
    ds = build_dataset(cfg)
    tok = ds.tokenizer
    assert ds.vocab_size == len(tok)
    assert [ds.num_pieces(s) for s in ("train", "valid", "test")] == [18, 1, 1]
    piece = ds.piece("valid", 0)
    assert piece[0] == tok.vocab["BOS_None"] and piece[-1] == tok.vocab["EOS_None"]
    names = [tok[int(t)] for t in piece[1:-1]]
    assert sum(n.startswith("Pitch_") for n in names) >= 30  # one Pitch token per note
    scored = sum(b.n_scored for b in ds.eval_batches("valid", 4))
    assert scored == sum(len(ds.piece("valid", i)) - 1 for i in range(1))
    b = ds.get_batch("train", 0, 4, seed=0)
    assert torch.equal(b.x_BT, build_dataset(cfg).get_batch("train", 0, 4, seed=0).x_BT)
    assert b.x_BT.shape == (4, 32)
    table, _ = transpose_tables(tok.vocab, 3)  # the real REMI vocabulary
    assert table[3 + 3, tok.vocab["Pitch_60"]] == tok.vocab["Pitch_63"] and table[0, tok.vocab["Pitch_21"]] == -1
    with pytest.raises(ValueError, match="piece index 1"):
        ds.piece("valid", 1)
