"""Perplexity by context length: window plans, values against direct computations, run_eval."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_evals_fixtures import trained_checkpoint, trained_model  # noqa: F401  (fixture)

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.evals.api import run_eval
from phaselab.workloads.evals.options import PplConfig
from phaselab.workloads.evals.perplexity import perplexity_by_length, plan_windows


class BigramLM(torch.nn.Module):
    """A hand-built predictor: logits of the next token are a fixed table row of the current one."""

    def __init__(self, table_VV: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table_VV)

    def forward(self, idx_BT, **_):
        return self.table[idx_BT], None


def _coverage(doc_lengths, length, mode, stride):
    """How many times each target of each document is scored by the plan."""
    cover = [np.zeros(n - 1, dtype=int) for n in doc_lengths]
    for w in plan_windows(doc_lengths, length, mode=mode, stride=stride):
        cover[w.doc][w.start + w.score_from: w.start + length] += 1
    return cover


@pytest.mark.parametrize("doc_lengths,length,stride", [([11], 4, 2), ([500, 37, 130], 32, 7), ([257], 64, 64)])
def test_sliding_scores_each_target_once(doc_lengths, length, stride):
    cover = _coverage(doc_lengths, length, "sliding", stride)
    for n, c in zip(doc_lengths, cover):
        if n - 1 < length:
            assert c.sum() == 0  # too short for one full window
            continue
        covered = length + (n - 1 - length) // stride * stride
        assert (c[:covered] == 1).all() and (c[covered:] == 0).all()
        assert len(c) - covered < stride  # only a tail shorter than one stride is dropped


def test_sliding_plan_worked_example_and_stride_equals_window():
    w = plan_windows([11], 4, mode="sliding", stride=2)
    assert [(x.start, x.score_from) for x in w] == [(0, 0), (2, 2), (4, 2), (6, 2)]
    assert plan_windows([300, 90], 32, mode="sliding", stride=32) == plan_windows([300, 90], 32, mode="nonoverlap",
                                                                                  stride=999)
    with pytest.raises(ValueError, match="stride"):
        plan_windows([100], 16, mode="sliding", stride=17)
    with pytest.raises(ValueError, match="mode"):
        PplConfig(lengths=(8,), mode="chunked")


def test_uniform_predictor_has_perplexity_vocab_size():
    V = 7
    doc = np.random.default_rng(1).integers(0, V, 101)
    r = perplexity_by_length(BigramLM(torch.zeros(V, V)), [doc], PplConfig(lengths=(10, 25), batch_size=3))
    assert [x.n_tokens for x in r] == [100, 100]
    for x in r:
        assert x.ppl == pytest.approx(V, rel=1e-6) and x.nll == pytest.approx(math.log(V), rel=1e-6)


@pytest.mark.parametrize("mode,stride", [("nonoverlap", 0), ("sliding", 3)])
def test_bigram_perplexity_equals_hand_computation(mode, stride):
    V = 5
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
    docs = [np.random.default_rng(s).integers(0, V, n) for s, n in ((2, 40), (3, 23))]
    L = 8
    cfg = PplConfig(lengths=(L,), mode=mode, stride=stride or 256, batch_size=4)
    got = perplexity_by_length(BigramLM(table), docs, cfg)[0]
    logp = torch.log_softmax(table.double(), -1).numpy()
    nll, n = 0.0, 0
    for d in docs:
        targets = np.arange(len(d) - 1)
        if mode == "nonoverlap":
            scored = targets[: (len(d) - 1) // L * L]
        else:  # first window L targets, then blocks of `stride` while a full window fits
            k = (len(d) - 1 - L) // stride
            scored = targets[: L + k * stride]
        nll -= sum(logp[d[t], d[t + 1]] for t in scored)
        n += len(scored)
    assert got.n_tokens == n
    # fp32 log-softmax (MATH §7) against a float64 reference
    assert got.nll == pytest.approx(nll / n, rel=1e-6)
    assert got.ppl == pytest.approx(math.exp(nll / n), rel=1e-6)


def test_trained_model_sliding_matches_explicit_loop(trained_model):  # noqa: F811
    doc = np.asarray(trained_checkpoint_tokens()[:150], dtype=np.int64)
    L, s = 32, 8
    got = perplexity_by_length(trained_model, [doc], PplConfig(lengths=(L,), mode="sliding", stride=s,
                                                                 batch_size=3))[0]
    nll, n, start = 0.0, 0, 0
    with torch.no_grad():
        while start + L <= len(doc) - 1:
            x = torch.as_tensor(doc[start:start + L])[None]
            y = torch.as_tensor(doc[start + 1:start + L + 1])
            lp = F.log_softmax(trained_model(x)[0][0].double(), -1)[torch.arange(L), y]
            keep = lp if start == 0 else lp[L - s:]
            nll -= float(keep.sum())
            n += keep.numel()
            start += s
    assert got.n_tokens == n == L + (len(doc) - 1 - L) // s * s
    assert got.nll == pytest.approx(nll / n, rel=1e-5)
    # stride == window reproduces the non-overlapping protocol exactly
    a = perplexity_by_length(trained_model, [doc], PplConfig(lengths=(L,), mode="sliding", stride=L))[0]
    b = perplexity_by_length(trained_model, [doc], PplConfig(lengths=(L,), mode="nonoverlap", batch_size=2))[0]
    assert (a.n_tokens, a.nll) == (b.n_tokens, pytest.approx(b.nll, rel=1e-6))
    # more context per scored token helps a trained model on average
    assert got.nll < b.nll


def trained_checkpoint_tokens():
    from test_evals_fixtures import text_dataset

    return text_dataset().tokens("valid")


def test_run_eval_ppl_by_length(tmp_path):
    spec = {"suite": "ppl-by-length", "data": {"kind": "text"}, "split": "valid", "device": "cpu",
            "ppl": {"lengths": [16, 64], "mode": "nonoverlap", "batch_size": 8, "max_tokens": 1024}}
    tracker = RecordingTracker()
    records = run_eval(spec, checkpoint=trained_checkpoint(), out_dir=tmp_path, tracker=tracker)
    assert tracker.records == records and len(records) == 4
    by = {(r.name, r.context_len): r for r in records}
    for L in (16, 64):
        nll, ppl = by[("nll", L)], by[("ppl", L)]
        assert nll.unit == "nats/token" and nll.task == "text" and nll.split == "valid"
        assert nll.n == ppl.n == 1024
        assert ppl.value == pytest.approx(math.exp(nll.value), rel=1e-12)
        assert 1.0 < nll.value < math.log(65)
    saved = json.loads((tmp_path / "records.json").read_text())
    assert [d["value"] for d in saved] == [r.value for r in records]
    with pytest.raises(ValueError, match="suite"):
        run_eval({"suite": "nope"}, checkpoint=trained_checkpoint(), out_dir=tmp_path, tracker=tracker)
    with pytest.raises(ValueError, match="lenghts|lengths"):
        run_eval({**spec, "ppl": {"lenghts": [8]}}, checkpoint=trained_checkpoint(), out_dir=tmp_path,
                 tracker=tracker)
