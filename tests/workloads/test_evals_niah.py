"""NIAH: exact needle placement, on-disk cache, scoring with a copying predictor and real models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_evals_fixtures import text_dataset, tiny_model, trained_checkpoint

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.evals import niah
from phaselab.workloads.evals.api import run_eval
from phaselab.workloads.evals.options import NiahConfig


@pytest.fixture(scope="module")
def ds():
    return text_dataset()


def induction_copy_step(max_match: int = 24):
    """A deterministic predictor built from tensors: find the latest earlier occurrence of the
    longest suffix (up to ``max_match`` tokens) of the sequence and predict the token that followed
    it — what an ideal induction head does. Returns one-hot logits_BV."""

    def step(ids_BT: torch.Tensor) -> torch.Tensor:
        B, T = ids_BT.shape
        V = int(ids_BT.max()) + 1
        out = torch.zeros(B, V)
        for b in range(B):
            row = ids_BT[b]
            for m in range(min(max_match, T - 1), 0, -1):
                win = row.unfold(0, m, 1)[:-1]  # windows ending before the last position
                hits = (win == row[T - m:]).all(dim=1).nonzero().flatten()
                if len(hits):
                    out[b, row[int(hits[-1]) + m]] = 1.0
                    break
        return out

    return step


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.77, 1.0])
def test_needle_at_exact_token_index(ds, depth):
    L = 300
    s = niah.make_samples(ds.tokenizer, ds.tokens("valid"), length=L, depth=depth, trials=3, seed=5,
                          answer="letters")
    q = ds.tokenizer.encode(niah.QUESTION.format(noun="word"))
    for t in range(3):
        needle = ds.tokenizer.encode(niah.NEEDLE.format(noun="word", answer=s.answers[t]))
        at = round(depth * (L - len(q) - len(needle)))
        assert s.ids.shape == (3, L) and s.needle_start[t] == at
        assert s.ids[t, at:at + len(needle)].tolist() == needle
        assert s.ids[t, -len(q):].tolist() == q
        assert len(s.answers[t]) == 7 and s.answers[t].isalpha() and s.answers[t].isupper()
    if depth == 0.0:
        assert (s.needle_start == 0).all()
    if depth == 1.0:  # the needle ends right before the question
        assert s.needle_start[0] + len(needle) == L - len(q)


def test_samples_cached_once_by_key(ds, tmp_path):
    kw = {"digest": ds.digest, "length": 200, "depth": 0.5, "trials": 2, "seed": 1, "cache_dir": tmp_path,
          "answer": "letters"}
    a = niah.cached_samples(ds.tokenizer, ds.tokens("valid"), **kw)
    files = sorted(tmp_path.glob("niah-*.npz"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    # a cached read returns the stored arrays, even when the haystack argument differs
    b = niah.cached_samples(ds.tokenizer, np.zeros(10, dtype=np.int64), **kw)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.answers, b.answers)
    niah.cached_samples(ds.tokenizer, ds.tokens("valid"), **{**kw, "seed": 2})
    assert len(list(tmp_path.glob("niah-*.npz"))) == 2


def test_copying_predictor_scores_100_percent_random_model_near_0(ds, tmp_path):
    cfg = NiahConfig(lengths=(160, 400), depths=(0.0, 0.5, 1.0), trials=3, batch_size=3, answer="letters")
    hay = ds.tokens("valid")
    grid = niah.run_grid(induction_copy_step(), ds.tokenizer, hay, cfg, digest=ds.digest, cache_dir=tmp_path)
    assert grid == {(L, d): 1.0 for L in cfg.lengths for d in cfg.depths}
    model = tiny_model("rope", seed=3)
    step = niah.model_step(model, max_length=400, precision="fp32")
    small = NiahConfig(lengths=(160,), depths=(0.0, 1.0), trials=4, batch_size=4, answer="letters")
    grid = niah.run_grid(step, ds.tokenizer, hay, small, digest=ds.digest, cache_dir=tmp_path)
    assert len(grid) == 2 and max(grid.values()) <= 1 / 4  # 7 random letters in a row: essentially never


def test_scoring_rule_and_digit_needles():
    assert niah.is_correct(" 1234567.", "1234567") and niah.is_correct("1234567", "1234567")
    assert not niah.is_correct(" 12345678", "1234567") and not niah.is_correct(" x1234567", "1234567")
    assert niah.is_correct(" QWERTYU. The", "QWERTYU") and not niah.is_correct(" QWERTYUI", "QWERTYU")
    with pytest.raises(ValueError, match="depth"):
        niah.needle_index(100, 10, 1.5)
    digits = niah.draw_answers(np.random.default_rng(0), 50, "digits")
    assert all(len(a) == 7 and a.isdigit() and a[0] != "0" for a in digits)
    # the char vocabulary of Tiny Shakespeare has no digits: say so instead of mis-encoding
    with pytest.raises(ValueError, match="not in the char vocabulary"):
        niah.make_samples(text_dataset().tokenizer, text_dataset().tokens("valid"), length=200, depth=0.5,
                          trials=1, seed=0)


def test_run_eval_niah_stop_below_and_heatmap(tmp_path):
    spec = {"suite": "niah", "data": {"kind": "text"}, "device": "cpu", "precision": "fp32",
            "niah": {"lengths": [256, 128], "depths": [0.0, 1.0], "trials": 2, "stop_below": 0.5,
                     "batch_size": 2, "cache_dir": str(tmp_path / "cache"), "answer": "letters"}}
    tracker = RecordingTracker()
    records = run_eval(spec, checkpoint=trained_checkpoint(), out_dir=tmp_path / "out", tracker=tracker)
    acc = [r for r in records if r.name == "niah_acc"]
    # the tiny model cannot retrieve: 128 is attempted (0 %), 256 is then not attempted
    assert {(r.context_len, r.depth) for r in acc} == {(128, 0.0), (128, 1.0)}
    assert all(r.value == 0.0 and r.n == 2 and r.unit == "fraction" for r in acc)
    skipped = [r for r in records if r.name == "niah_not_attempted"]
    assert [(r.context_len, r.value) for r in skipped] == [(256, 1.0)]
    png = tmp_path / "out" / "niah_heatmap.png"
    assert png.stat().st_size > 1000 and tracker.artifacts["niah_heatmap.png"] == png


def test_kv_cached_decoding_matches_full_recompute(ds):
    from test_evals_fixtures import load_model

    model = load_model(trained_checkpoint()).eval()
    s = niah.make_samples(ds.tokenizer, ds.tokens("valid"), length=120, depth=0.3, trials=2, seed=0,
                          answer="letters")
    prompts = s.ids.tolist()
    cached = niah.model_step(model, max_length=200, precision="fp32")
    full = niah.model_step(model, max_length=200, precision="fp32", kv_cache=False)
    ids = torch.tensor(prompts)
    for _ in range(6):  # the same next-token logits step by step
        a, b = cached(ids), full(ids)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        ids = torch.cat([ids, a.argmax(-1, keepdim=True)], dim=1)
    assert niah.greedy_decode(cached, prompts, 8) == niah.greedy_decode(full, prompts, 8)
