"""Inference-time RoPE context extension for evaluations (``run_eval(..., extend=...)``; TAPA
Table 2's PI / YaRN rows, EXPERIMENTS §6 #22): the extended checkpoint computes exactly what a
model built with that ``rope.scaling`` computes on the same weights, differs from the plain
model, and non-RoPE checkpoints are refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_evals_fixtures import RECIPE, text_dataset, trained_checkpoint

from phaselab.catalog.tracking import RecordingTracker
from phaselab.kernels.testing import assert_close
from phaselab.workloads.evals.api import (
    ExtensionNotApplicable,
    documents_of,
    eval_extension,
    load_checkpoint_model,
    run_eval,
)
from phaselab.workloads.evals.options import PplConfig
from phaselab.workloads.evals.perplexity import perplexity_by_length
from phaselab.workloads.models.checkpoint_io import load_model, save_model
from phaselab.workloads.models.config import ContextExtension
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer

L = RECIPE["block_size"]   # the trained model's pretraining length (128)


def _direct(cfg, rule: str, factor: float) -> Transformer:
    """The trained weights in a model BUILT with rope.scaling = rule (no extension code path)."""
    rope = dataclasses.replace(cfg.pe.rope, scaling=rule, factor=factor, original_max_seq_len=L)
    model = Transformer(dataclasses.replace(cfg, pe=dataclasses.replace(cfg.pe, rope=rope)))
    model.load_state_dict(load_model(trained_checkpoint()).state_dict(), strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def ckpt() -> Path:
    return trained_checkpoint()     # trains on first use: outside no_grad


@torch.no_grad()
@pytest.mark.parametrize(("rule", "factor"), [("pi", 2.0), ("yarn", 4.0)])
def test_extended_checkpoint_equals_model_built_with_that_scaling(ckpt: Path, rule: str, factor: float) -> None:
    ext = eval_extension({"rule": rule, "factor": factor, "original_max_seq_len": L})
    extended = load_checkpoint_model(ckpt, "cpu", ext)
    direct = _direct(load_model(ckpt).cfg, rule, factor)
    plain = load_checkpoint_model(ckpt, "cpu")
    assert extended.cfg == direct.cfg and extended.cfg.pe.rope.scaling == rule
    assert plain.cfg.pe.rope.scaling == "none"
    idx_BT = torch.from_numpy(text_dataset().tokens("valid")[: 2 * L].astype("int64"))[None]  # 2L > L
    got, _ = extended(idx_BT)
    want, _ = direct(idx_BT)
    base, _ = plain(idx_BT)
    assert torch.equal(got, want)                       # same weights, same frequencies: bitwise
    assert (got - base).abs().max().item() > 1e-2       # the extension changes the predictions
    if rule == "yarn":                                  # MATH §2.4: temperature 0.1 ln s + 1
        mscale = extended.h[0].attn.pe.mscale
        assert mscale == pytest.approx(0.1 * torch.log(torch.tensor(factor)).item() + 1.0, rel=1e-6)


@torch.no_grad()
def test_pi_at_position_2p_equals_plain_rope_at_p(ckpt: Path) -> None:
    """MATH §2.5: PI with s = 2 applied at position 2p is plain RoPE at position p."""
    extended = load_checkpoint_model(ckpt, "cpu", ContextExtension(rule="pi", factor=2.0, original_max_seq_len=L))
    plain = load_checkpoint_model(ckpt, "cpu")
    idx_BT = torch.from_numpy(text_dataset().tokens("valid")[:64].astype("int64"))[None]
    pos_BT = torch.arange(64)[None]
    got, _ = extended(idx_BT, pos_BT=2 * pos_BT)
    want, _ = plain(idx_BT, pos_BT=pos_BT)
    assert_close("pi-2p-vs-plain-p", want.double(), got, 1e-5)


def test_run_eval_ppl_with_extend_matches_the_directly_built_model(ckpt: Path, tmp_path: Path) -> None:
    ppl = {"lengths": [2 * L], "max_tokens": 1024}
    spec = {"suite": "ppl-by-length", "data": {"kind": "text"}, "ppl": ppl, "device": "cpu"}
    extend = {"rule": "pi", "factor": 2.0, "original_max_seq_len": L}
    recs = run_eval(spec, checkpoint=ckpt, out_dir=tmp_path / "ext", tracker=RecordingTracker(), extend=extend)
    plain = run_eval(spec, checkpoint=ckpt, out_dir=tmp_path / "plain", tracker=RecordingTracker())
    direct = _direct(load_model(ckpt).cfg, "pi", 2.0)
    [want] = perplexity_by_length(direct, documents_of(text_dataset(), "valid"), PplConfig(lengths=(2 * L,),
                                                                                          max_tokens=1024))
    got = {r.name: r for r in recs}
    assert got["nll"].value == pytest.approx(want.nll, rel=1e-6) and got["nll"].n == want.n_tokens >= 1024
    assert got["nll"].context_len == 2 * L
    assert abs({r.name: r.value for r in plain}["nll"] - got["nll"].value) > 1e-3


@pytest.mark.parametrize("pe", ["pope", "tapa"])
def test_extend_on_a_non_rope_checkpoint_is_refused(tmp_path: Path, pe: str) -> None:
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=65, block_size=16, n_layer=1, d_model=32, n_head=2, pe={"kind": pe})
    ckpt = save_model(Transformer(cfg), tmp_path / f"{pe}.pt")
    spec = {"suite": "ppl-by-length", "data": {"kind": "text"}, "ppl": {"lengths": [16], "max_tokens": 64},
            "device": "cpu"}
    for extend in ({"rule": "pi", "factor": 2.0, "original_max_seq_len": 16}, {"rule": "none"}):
        with pytest.raises(ExtensionNotApplicable, match=f"pe.kind='{pe}'") as info:
            run_eval(spec, checkpoint=ckpt, out_dir=tmp_path / "out", tracker=RecordingTracker(), extend=extend)
        assert isinstance(info.value, ValueError) and f"rule={extend['rule']!r}" in str(info.value)
    recs = run_eval(spec, checkpoint=ckpt, out_dir=tmp_path / "out", tracker=RecordingTracker())   # without: fine
    assert {r.name for r in recs} == {"nll", "ppl"}


def test_extend_mapping_is_parsed_strictly() -> None:
    from phaselab.workloads.config import ConfigError

    with pytest.raises(ConfigError, match=r"extend\.factr.*factor"):
        eval_extension({"rule": "pi", "factr": 2.0, "original_max_seq_len": 16})
    with pytest.raises(ValueError, match="original_max_seq_len"):
        eval_extension({"rule": "yarn", "factor": 8.0})
    assert eval_extension(None) is None
