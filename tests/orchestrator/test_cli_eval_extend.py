"""`phaselab eval CKPT --suite ... extend.rule=R extend.factor=S extend.original_max_seq_len=L`: the
eval stage's inference-time RoPE extension (TAPA Table 2's PI / YaRN rows, EXPERIMENTS §6 #22) from
the command line, as overrides of the stage's own ``extend`` section. The CLI must report exactly
what ``run_eval(..., extend=...)`` computes, refuse non-RoPE checkpoints with
ExtensionNotApplicable's message, and reject bad values naming the key (click usage error, exit
code 2) before anything runs."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from phaselab.catalog.tracking import RecordingTracker
from phaselab.orchestrator.cli.main import app
from phaselab.workloads.evals.api import run_eval
from phaselab.workloads.models.checkpoint_io import save_model
from phaselab.workloads.models.config import ContextExtension
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer

L = 16                                     # the checkpoint's block_size (its "pretraining" length)
SUITE = ["--suite", "ppl-by-length", f"ppl.lengths=[{4 * L}]", "ppl.max_tokens=128", "device=cpu"]
SPEC = {"suite": "ppl-by-length", "ppl": {"lengths": [4 * L], "max_tokens": 128}, "device": "cpu"}
YARN = {"rule": "yarn", "factor": 4.0, "original_max_seq_len": L}
YARN_FLAGS = ["extend.rule=yarn", "extend.factor=4", f"extend.original_max_seq_len={L}"]


def _checkpoint(tmp_path: Path, pe: str) -> Path:
    """A tiny char-level model (Tiny Shakespeare's 65 symbols) saved by checkpoint_io.save_model."""
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=65, block_size=L, n_layer=1, d_model=32, n_head=2, pe={"kind": pe})
    model = Transformer(cfg)
    with torch.no_grad():   # sharper attention than the init's near-uniform one, so positions matter
        for block in model.h:
            block.attn.c_q.weight.mul_(8.0)
            block.attn.c_k.weight.mul_(8.0)
    return save_model(model, tmp_path / f"{pe}.pt")


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["eval", *args])
    return res.exit_code, res.output


def _flat(text: str) -> str:
    """Rich's error panel without its box and line wraps."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def test_extended_ppl_is_run_evals_with_that_extension(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, "rope")
    code, out = _cli(str(ckpt), *SUITE, *YARN_FLAGS, "--out", str(tmp_path / "cli"), "--json")
    assert code == 0, out
    got = json.loads(out)
    assert got["extend"]["rule"] == "yarn" and got["extend"]["factor"] == 4.0
    assert got["extend"]["original_max_seq_len"] == L
    direct = run_eval(SPEC, checkpoint=ckpt, out_dir=tmp_path / "direct", tracker=RecordingTracker(), extend=YARN)
    assert [r.to_dict() for r in direct] == got["records"]   # same numbers, bitwise (CPU, fp32)
    assert {r["name"] for r in got["records"]} == {"nll", "ppl"} and got["records"][0]["n"] == 128

    code, out = _cli(str(ckpt), *SUITE, "--out", str(tmp_path / "plain"), "--json")
    assert code == 0, out
    plain = {r["name"]: r["value"] for r in json.loads(out)["records"]}
    extended = {r["name"]: r["value"] for r in got["records"]}
    assert abs(plain["nll"] - extended["nll"]) > 1e-4      # the flags did change the model
    assert "extend" in json.loads(out) and json.loads(out)["extend"] is None

    code, out = _cli(str(ckpt), *SUITE, *YARN_FLAGS, "--out", str(tmp_path / "text"))   # human output
    assert code == 0, out
    assert f"extend rule=yarn factor=4.0 original_max_seq_len={L}" in out
    assert f"{extended['ppl']:.6g} ppl" in out


def test_extend_on_a_pope_checkpoint_fails_with_the_clear_message(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, "pope")
    code, out = _cli(str(ckpt), *SUITE, *YARN_FLAGS, "--out", str(tmp_path / "out"), "--json")
    assert code == 1
    err = json.loads(out)
    assert err["ok"] is False
    assert "rescales RoPE frequencies" in err["error"] and "pe.kind='pope'" in err["error"]
    assert "rule='yarn'" in err["error"] and "extend.*" in err["error"]
    assert not (tmp_path / "out" / "records.json").exists()
    code, out = _cli(str(ckpt), *SUITE, "--out", str(tmp_path / "out"), "--json")   # without: fine
    assert code == 0 and {r["name"] for r in json.loads(out)["records"]} == {"nll", "ppl"}


@pytest.mark.parametrize(("overrides", "named", "says"), [
    (["extend.rule=yarn", "extend.factor=0.5", "extend.original_max_seq_len=16"], "'extend'", "factor=0.5 must be >= 1"),
    (["extend.rule=pi", "extend.factor=inf", "extend.original_max_seq_len=16"], "'extend.factor'",
     "expected a number, got str 'inf'"),
    (["extend.rule=pi", "extend.factor=two", "extend.original_max_seq_len=16"], "'extend.factor'", "expected a number"),
    (["extend.rule=yarm", "extend.factor=4", "extend.original_max_seq_len=16"], "'extend.rule'", "'yarm'"),
    (["extend.rule=yarn", "extend.factor=4"], "'extend'", "needs original_max_seq_len"),
    (["extend.factor=4"], "'extend'", "has no effect with scaling='none'"),
    (["extend.rule=pi", "extend.factor=4", "extend.original_max_seq_len=0"], "'extend'",
     "original_max_seq_len=0 must be a positive int"),
    (["extend.rule=pi", "extend.factor=2", "extend.original_max_seq_len=16", "extend.attention_factor=1.2"],
     "'extend'", "only defined for scaling='yarn'"),
    (["extend.rul=pi"], "'extend.rul'", "did you mean 'rule'?"),
    (["extend=yarn"], "'extend'", "set field by field"),
])
def test_bad_extend_values_are_usage_errors_naming_the_key(tmp_path: Path, overrides: list[str], named: str,
                                                           says: str) -> None:
    out_dir = tmp_path / "out"
    code, out = _cli(str(_checkpoint(tmp_path, "rope")), *SUITE, *overrides, "--out", str(out_dir), "--json")
    assert code == 2, out
    text = _flat(out)
    assert f"Invalid value for {named}:" in text and says in text
    assert not out_dir.exists()   # rejected before anything ran


def test_help_documents_every_extend_field_and_rule() -> None:
    code, out = _cli("--help")
    assert code == 0
    text = _flat(out)
    for name in (f.name for f in dataclasses.fields(ContextExtension)):
        assert f"extend.{name}" in text, name
    for rule in ("pi", "ntk", "dynamic_ntk", "yarn"):
        assert rule in text, rule
