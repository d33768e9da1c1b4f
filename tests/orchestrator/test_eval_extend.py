"""The eval stage's optional ``extend`` section (inference-time RoPE scaling; TAPA Table 2's PI /
YaRN rows, EXPERIMENTS §6 #22): YAML errors name FILE:LINE:COLUMN and the key, the section is in
the stage's cache key (and absent sections leave keys untouched), non-RoPE models are refused at
plan time and at run time with the stage's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from _orchestrator_grids import BASE, locate

from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import build_dag, load_grid, plan_grid
from phaselab.orchestrator.plan.hashing import CodeVersion
from phaselab.orchestrator.stages import STAGES, StageContext

CODE = CodeVersion(digest="0" * 64, modules={})   # one code version: only configs differ
ROPE_ONLY = "    when: {pe: rope}\n"
PPL = "    eval: {suite: ppl-by-length, ppl: {lengths: [32]}, device: cpu}\n"
EXTRA_PI = ("  ppl_pi:\n    kind: eval\n    needs: [pretrain]\n" + ROPE_ONLY + PPL +
            "    extend: {rule: pi, factor: 2.0, original_max_seq_len: 32}\n")


def _write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _hashes(path: Path) -> dict[tuple[str, str], str]:
    spec, marks, _, _ = load_grid(path)
    dag = build_dag(spec, marks, code=CODE)
    return {(cell, name): h for cell, stages in dag.cell_stages.items() for name, h in stages.items()}


def test_wrong_key_inside_extend_names_file_line_column_and_key(tmp_path: Path) -> None:
    text = BASE + EXTRA_PI.replace("factor: 2.0", "factr: 2.0")
    path = _write(tmp_path, text)
    with pytest.raises(GridError) as info:
        plan_grid(path)
    [issue] = info.value.issues
    assert issue.mark.file == str(path)
    assert (issue.mark.line, issue.mark.column) == locate(text, "factr")
    assert issue.key == "stages.ppl_pi.extend.factr" and issue.suggestion == "factor"
    assert f"{path}:{issue.mark.line}:{issue.mark.column}: stages.ppl_pi.extend.factr" in str(info.value)


def test_invalid_extend_value_names_the_stage_and_section(tmp_path: Path) -> None:
    text = BASE + EXTRA_PI.replace(", original_max_seq_len: 32", "")   # PI needs the pretraining length
    with pytest.raises(GridError, match="needs original_max_seq_len") as info:
        plan_grid(_write(tmp_path, text))
    [issue] = info.value.issues
    # a cross-field rule has no single key: the existing machinery points at the stage
    assert issue.key == "stages.ppl_pi.extend" and issue.mark.line == locate(text, "  ppl_pi:")[0]


def test_extend_enters_the_stage_hash_and_leaves_other_keys_alone(tmp_path: Path) -> None:
    before = _hashes(_write(tmp_path, BASE, "before.yaml"))
    text = BASE + EXTRA_PI + EXTRA_PI.replace("ppl_pi", "ppl_plain").replace(
        "    extend: {rule: pi, factor: 2.0, original_max_seq_len: 32}\n", "")
    text += EXTRA_PI.replace("ppl_pi", "ppl_yarn").replace("rule: pi", "rule: yarn")
    after = _hashes(_write(tmp_path, text, "after.yaml"))
    assert {k: after[k] for k in before} == before                # existing stages: same keys
    cell = next(c for c, n in after if n == "ppl_pi")
    pi, yarn, plain = (after[(cell, n)] for n in ("ppl_pi", "ppl_yarn", "ppl_plain"))
    assert plain == after[(cell, "ppl")]       # same eval without extend: one cache entry
    assert len({pi, yarn, plain}) == 3         # differing only in extend: distinct entries
    dag = plan_grid(_write(tmp_path, text, "after.yaml"))
    cfg = dag.nodes[next(h for h in dag.nodes if dag.nodes[h].name == "ppl_pi")].config
    assert cfg["extend"] == {"rule": "pi", "factor": 2.0, "original_max_seq_len": 32, "block_size": None,
                             "base": None, "attention_factor": None}   # defaults included (DESIGN §5.4)
    assert "extend" not in dag.nodes[next(h for h in dag.nodes if dag.nodes[h].name == "ppl")].config


def test_extend_on_a_non_rope_cell_is_refused_at_plan_time(tmp_path: Path) -> None:
    text = BASE + EXTRA_PI.replace(ROPE_ONLY, "")                   # also runs in the pope cell
    path = _write(tmp_path, text)
    with pytest.raises(GridError) as info:
        plan_grid(path)
    [issue] = info.value.issues
    assert "stage 'ppl_pi'" in issue.message and "pe.kind='pope'" in issue.message
    assert issue.mark.line == locate(text, "extend: {rule: pi")[0] and issue.key == "stages.ppl_pi.extend"


def test_extension_in_defaults_is_refused_when_evals_exist(tmp_path: Path) -> None:
    text = BASE.replace("  launcher: ray_task\n", "  launcher: ray_task\n  extend: {rule: none}\n")
    with pytest.raises(GridError, match="eval stage") as info:
        plan_grid(_write(tmp_path, text))
    assert info.value.issues[0].mark.line == locate(text, "  extend: {rule: none}")[0]


def _tiny_checkpoint(tmp_path: Path, pe: str) -> Path:
    import torch

    from phaselab.workloads.models.checkpoint_io import save_model
    from phaselab.workloads.models.presets import preset
    from phaselab.workloads.models.transformer import Transformer

    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=65, block_size=16, n_layer=1, d_model=32, n_head=2, pe={"kind": pe})
    model = Transformer(cfg)
    with torch.no_grad():   # sharp attention (init std 0.02 is nearly uniform), so positions matter
        for name, p in model.named_parameters():
            if name.endswith(("c_q.weight", "c_k.weight")):
                p.mul_(30.0)
    return save_model(model, tmp_path / f"{pe}.pt")


def _run(tmp_path: Path, ckpt: Path, name: str, extend: dict | None):
    from phaselab.catalog.tracking import RecordingTracker

    stage = STAGES["eval"]
    sections = {"eval": {"suite": "ppl-by-length", "data": {"kind": "text"}, "device": "cpu",
                         "ppl": {"lengths": [32], "max_tokens": 64}}}
    config = stage.normalize({**sections, **({"extend": extend} if extend else {})})
    ctx = StageContext(stage_hash="0" * 64, name=name, config=config, out_dir=tmp_path / name,
                       runs_root=tmp_path, tracker=RecordingTracker(),
                       upstream={"checkpoint": {"hash": "1" * 64, "kind": "pretrain",
                                                "artifacts": {"checkpoint": str(ckpt)}}})
    return stage.run(ctx)


@pytest.mark.parametrize("pe", ["pope", "tapa"])
def test_eval_stage_refuses_extend_on_a_non_rope_checkpoint(tmp_path: Path, pe: str) -> None:
    ckpt = _tiny_checkpoint(tmp_path, pe)
    with pytest.raises(ValueError, match=f"stage 'ppl_zero_shot_pi'.*pe.kind='{pe}'"):
        _run(tmp_path, ckpt, "ppl_zero_shot_pi", {"rule": "pi", "factor": 8.0, "original_max_seq_len": 16})


def test_eval_stage_applies_extend(tmp_path: Path) -> None:
    ckpt = _tiny_checkpoint(tmp_path, "rope")
    plain = _run(tmp_path, ckpt, "ppl", None)
    pi = _run(tmp_path, ckpt, "ppl_pi", {"rule": "pi", "factor": 2.0, "original_max_seq_len": 16})
    again = _run(tmp_path, ckpt, "ppl_pi_again", {"rule": "pi", "factor": 2.0, "original_max_seq_len": 16})
    key = "text/nll/split=valid/ctx=32"
    assert set(plain.metrics) == set(pi.metrics) and key in pi.metrics, sorted(pi.metrics)
    assert pi.metrics[key] == again.metrics[key]                 # deterministic
    assert abs(pi.metrics[key] - plain.metrics[key]) > 1e-3      # the extension changed the model


def test_tapa_grid_zero_shot_pi_and_yarn_stages() -> None:
    """TAPA Table 2's PI / YaRN rows: the RoPE cell's 8k checkpoint, factor 8 with L = the
    pretraining length, exactly the zero-shot eval of the plain row."""
    dag = plan_grid("tapa_long_context")
    stages = {name: dag.nodes[h] for cell, m in dag.cell_stages.items() if "pe=rope" in cell for name, h in m.items()}
    tapa = {name for cell, m in dag.cell_stages.items() if "pe=tapa" in cell for name in m}
    assert not tapa & {"ppl_zero_shot_pi", "ppl_zero_shot_yarn"} and "ppl_zero_shot" in tapa
    plain, pretrain = stages["ppl_zero_shot"], stages["pretrain_8k"]
    for name, rule in (("ppl_zero_shot_pi", "pi"), ("ppl_zero_shot_yarn", "yarn")):
        node = stages[name]
        assert node.config["eval"] == plain.config["eval"] and node.upstream == plain.upstream
        assert node.upstream["checkpoint"] == pretrain.hash
        ext = node.config["extend"]
        assert (ext["rule"], ext["factor"], ext["original_max_seq_len"]) == (rule, 8.0, 8192)
        assert ext["original_max_seq_len"] == pretrain.config["data"]["block_size"]
        assert ext["base"] is None and ext["attention_factor"] is None and ext["block_size"] is None
        assert node.hash != plain.hash
    assert "extend" not in plain.config
