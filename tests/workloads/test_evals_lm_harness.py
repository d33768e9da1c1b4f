"""lm-eval adapter: log-likelihoods against direct computations; BLiMP offline end to end."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from test_evals_fixtures import text_dataset, trained_checkpoint, trained_model  # noqa: F401

from phaselab.catalog.tracking import RecordingTracker
from phaselab.workloads.evals.api import run_eval
from phaselab.workloads.evals.bundle import (
    blimp_bundle_digest,
    blimp_zip_path,
    build_blimp_bundle,
    read_blimp_members,
)
from phaselab.workloads.evals.lm_harness import PhaseLabLM, continuation_logprobs


@pytest.fixture(scope="module")
def tok():
    return text_dataset().tokenizer


def _lm(model, tok, **kw):
    return PhaseLabLM(model, tok, max_length=kw.pop("max_length", 48), batch_size=kw.pop("batch_size", 3),
                      prefix_token_id=tok.encode("\n")[0], precision="fp32", **kw)


def _direct(model, ids, first_scored):
    """sum_{i >= first_scored} log p(ids[i] | ids[:i]) and whether each is the argmax."""
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]]))[0][0].double()
    lp = F.log_softmax(logits, -1)
    rows = torch.arange(first_scored - 1, len(ids) - 1)
    tgt = torch.tensor(ids[first_scored:])
    return float(lp[rows, tgt].sum()), bool((logits[rows].argmax(-1) == tgt).all())


def _req(kind, args, i=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def test_loglikelihood_equals_direct_sum_and_no_off_by_one(trained_model, tok):  # noqa: F811
    lm = _lm(trained_model, tok, max_length=128)  # no truncation here (see the next test)
    pairs = [("First Citizen:\nBefore we proceed", " any further, hear me speak."),
             ("ROMEO:\nBut soft", ", what light"), ("KING", " RICHARD"), ("a", "b")]
    got = lm.loglikelihood([_req("loglikelihood", p, i) for i, p in enumerate(pairs)])
    for (ctx, cont), (lp, greedy) in zip(pairs, got):
        ids = tok.encode(ctx + cont)
        want, want_greedy = _direct(trained_model, ids, len(tok.encode(ctx)))
        assert lp == pytest.approx(want, rel=1e-5) and greedy == want_greedy
        # the off-by-one the harness guide warns about (reading the row of the token itself)
        # gives a different number: the test would catch that indexing
        with torch.no_grad():
            logits = trained_model(torch.tensor([ids]))[0][0].double()
        n = len(tok.encode(cont))
        shifted = float(F.log_softmax(logits, -1)[torch.arange(len(ids) - n, len(ids)),
                                                  torch.tensor(ids[-n:])].sum())
        assert abs(shifted - lp) > 1e-3


def test_left_truncation_and_batching(trained_model, tok):  # noqa: F811
    ctx, cont = "MENENIUS:\nEither you must confess yourselves wondrous malicious,", " or be accused"
    ctx_ids, cont_ids = tok.encode(ctx), tok.encode(cont)
    (lp, _), = continuation_logprobs(trained_model, [(ctx_ids, cont_ids)], max_length=32, precision="fp32")
    kept = (ctx_ids + cont_ids)[-33:]  # max_length + 1 tokens: 32 inputs
    want, _ = _direct(trained_model, kept, len(kept) - len(cont_ids))
    assert lp == pytest.approx(want, rel=1e-5)
    # batching with right padding does not change any answer
    pairs = [(tok.encode(c), tok.encode(x)) for c, x in [("ab", "c"), ("Hello the", "re world"), (ctx, cont)]]
    one = [continuation_logprobs(trained_model, [p], max_length=32, precision="fp32")[0] for p in pairs]
    many = continuation_logprobs(trained_model, pairs, max_length=32, precision="fp32")
    for a, b in zip(one, many):
        assert a[0] == pytest.approx(b[0], rel=1e-5) and a[1] == b[1]
    with pytest.raises(ValueError, match="max_length"):
        continuation_logprobs(trained_model, [([1], [2] * 40)], max_length=32)


def test_loglikelihood_rolling_matches_explicit_windows(trained_model, tok):  # noqa: F811
    text = "CORIOLANUS:\nWhat's the matter, you dissentious rogues,\nThat, rubbing the poor itch"
    m = 24
    lm = _lm(trained_model, tok, max_length=m)
    got, = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (text,))])
    ids = tok.encode(text)
    prefix = tok.encode("\n")
    total, _ = _direct(trained_model, prefix + ids[:m], 1)  # first window: prefix + m tokens
    for start in range(m, len(ids), m):  # later windows predict ids[start:start+m] from m tokens
        end = min(start + m, len(ids))
        window = ids[end - m - 1:end]
        lp, _ = _direct(trained_model, window, len(window) - (end - start))
        total += lp
    assert got == pytest.approx(total, rel=1e-5)


def test_generate_until_is_greedy(trained_model, tok):  # noqa: F811
    lm = _lm(trained_model, tok, max_length=64)
    ctx = "First Citizen:\nWe are accounted poor"
    full, = lm.generate_until([_req("generate_until", (ctx, {"until": ["@"], "max_gen_toks": 12}))])
    ids = tok.encode(ctx)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(trained_model(torch.tensor([ids]))[0][0, -1].argmax()))
    assert full == tok.decode(ids[len(tok.encode(ctx)):])
    stop = full[6:8]  # a stop string inside the greedy text cuts it there
    cut, = lm.generate_until([_req("generate_until", (ctx, {"until": [stop], "max_gen_toks": 12}))])
    assert cut == full.split(stop)[0] and len(cut) <= 6
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until([_req("generate_until", (ctx, {"do_sample": True, "temperature": 1.0}))])


def test_char_tokenizer_needs_an_explicit_prefix(trained_model, tok):  # noqa: F811
    with pytest.raises(ValueError, match="prefix_token_id"):
        PhaseLabLM(trained_model, tok, max_length=32)


def test_bundle_layout_and_digest(tmp_path):
    root, digest = build_blimp_bundle(tmp_path, uids=["causative", "adjunct_island"])
    assert digest == blimp_bundle_digest(["causative", "adjunct_island"])
    assert (root / "phaselab_blimp.yaml").exists() and (root / "data" / "causative.jsonl").exists()
    assert build_blimp_bundle(tmp_path / "elsewhere", uids=["causative", "adjunct_island"])[1] == digest
    assert blimp_bundle_digest(["causative"]) != digest
    assert len(read_blimp_members(blimp_zip_path())) == 67
    with pytest.raises(ValueError, match="unknown BLiMP"):
        build_blimp_bundle(tmp_path, uids=["no_such_task"])


def test_blimp_offline_end_to_end(tmp_path, trained_model, tok):  # noqa: F811
    uids = ["determiner_noun_agreement_1", "regular_plural_subject_verb_agreement_1"]
    spec = {"suite": "lm-eval", "data": {"kind": "text"}, "device": "cpu", "precision": "fp32",
            "lm_eval": {"tasks": ["phaselab_blimp"], "blimp_uids": uids, "limit": 12, "max_length": 128,
                        "batch_size": 8, "prefix": "\n", "bundle_dir": str(tmp_path / "bundles")}}
    tracker = RecordingTracker()
    records = run_eval(spec, checkpoint=trained_checkpoint(), out_dir=tmp_path / "out", tracker=tracker)
    acc = {r.task: r for r in records if r.name == "acc"}
    assert set(acc) == {"phaselab_blimp"} | {f"phaselab_blimp_{u}" for u in uids}
    # the group is the unweighted mean of its sub-tasks; each sub-task is a real accuracy
    assert acc["phaselab_blimp"].value == pytest.approx(sum(acc[f"phaselab_blimp_{u}"].value for u in uids) / 2)
    # recompute one sub-task's accuracy directly: log p(good) > log p(bad), each after the prefix
    rows = [json.loads(x) for x in (tmp_path / "out" / "lm_eval_samples" /
                                    f"phaselab_blimp_{uids[0]}.jsonl").read_text().splitlines()]
    assert len(rows) == 12 == acc[f"phaselab_blimp_{uids[0]}"].n
    nl = tok.encode("\n")
    wins = 0
    for r in rows:
        good, _ = _direct(trained_model, nl + tok.encode(" " + r["doc"]["sentence_good"]), 1)
        bad, _ = _direct(trained_model, nl + tok.encode(" " + r["doc"]["sentence_bad"]), 1)
        wins += good > bad
    assert acc[f"phaselab_blimp_{uids[0]}"].value == pytest.approx(wins / 12)
    meta = json.loads((tmp_path / "out" / "lm_eval_results.json").read_text())
    assert meta["versions"]["phaselab_blimp"] is not None and "configs" in meta
    assert "lm_eval_results.json" in tracker.artifacts


def test_cbt_task_yaml_prompts():
    """The bundled CBT YAMLs (online data) load with lm-eval's own loader and build the GPT-2-style
    prompt: sentences + question up to the blank; each option followed by the rest of the question."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from phaselab.workloads.evals.bundle import TASKS_DIR

    cfg = load_yaml(TASKS_DIR / "phaselab_cbt_ne.yaml")
    assert (cfg["task"], cfg["dataset_path"], cfg["dataset_name"]) == ("phaselab_cbt_ne", "cam-cst/cbt", "NE")
    doc = {"sentences": ["Tom met Ann .", "She smiled ."], "question": "Then XXXXX waved at Tom .",
           "answer": "Ann", "options": ["Tom", "Ann", "Bob"]}
    assert cfg["doc_to_text"](doc) == "Tom met Ann . She smiled . Then"
    assert cfg["doc_to_choice"](doc) == [" Tom waved at Tom .", " Ann waved at Tom .", " Bob waved at Tom ."]
    assert cfg["doc_to_target"](doc) == 1 and cfg["target_delimiter"] == ""
    first = {**doc, "question": "XXXXX waved ."}  # blank first: no doubled or missing space
    assert cfg["doc_to_text"](first) == "Tom met Ann . She smiled ."
    assert cfg["doc_to_choice"](first)[1] == " Ann waved ."
    group = load_yaml(TASKS_DIR / "phaselab_cbt.yaml")
    assert group["task"] == ["phaselab_cbt_cn", "phaselab_cbt_ne"]


def test_paper_tasks_selectable_by_name(tmp_path):
    """The paper's online tasks and phaselab's bundled ones resolve in one TaskManager (no data
    is loaded: indexing only)."""
    from lm_eval.tasks import TaskManager

    from phaselab.workloads.evals.bundle import TASKS_DIR

    root, _ = build_blimp_bundle(tmp_path, uids=["causative"])
    names = set(TaskManager(include_path=[str(root), str(TASKS_DIR)]).all_tasks)
    assert {"lambada_openai", "hellaswag", "piqa", "arc_easy", "phaselab_cbt", "phaselab_cbt_cn",
            "phaselab_cbt_ne", "phaselab_blimp", "phaselab_blimp_causative"} <= names
