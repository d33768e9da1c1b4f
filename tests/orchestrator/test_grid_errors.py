"""A corpus of bad grids: each error names FILE:LINE:COLUMN, the key, and the nearest valid key,
and nothing reaches the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from _orchestrator_grids import BASE, locate
from typer.testing import CliRunner

from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import plan_grid

# (id, old -> new replacements on BASE, needle locating the error, message fragment, suggestion)
CASES = [
    ("unknown-top-key", [("stages:", "stagess:")], "stagess:", "unknown key 'stagess'", "stages"),
    ("unknown-stage-key", [("    needs: [pretrain]", "    neds: [pretrain]")], "neds:", "unknown key 'neds'", "needs"),
    ("seeds-wrong-type", [("seeds: [0]", "seeds: zero")], "seeds:", "valid list", None),
    ("unknown-kind", [("kind: pretrain", "kind: pretrian")], "kind: pretrian", "pretrian", "pretrain"),
    ("needs-unknown-stage", [("needs: [pretrain]", "needs: [pretrian]")], "pretrian]", "unknown stage 'pretrian'", "pretrain"),
    ("negative-cpus", [("  launcher: ray_task", "  launcher: ray_task\n  resources: {cpus: -1}")], "cpus", "greater than or equal to 0", None),
    ("zero-memory", [("  launcher: ray_task", "  launcher: ray_task\n  resources: {memory_gb: 0}")], "memory_gb", "greater than 0", None),
    ("unknown-encoding", [("pe: [rope, pope]", "pe: [rope, popee]")], "pe: {kind: \"${pe}\"", "unknown pe.kind 'popee'; did you mean 'pope'?", None),
    ("unknown-train-key", [("steps: 2,", "steps: 2, lrr: 0.1,")], "lrr", "unknown key", "lr"),
    ("unknown-model-key", [("    kind: pretrain\n", "    kind: pretrain\n    model: {n_layers: 3}\n")], "n_layers", "unknown key", "n_layer"),
    ("unknown-preset", [("preset: tiny", "preset: tinyy")], "preset", "unknown model preset 'tinyy'", "tiny"),
    ("unknown-when-axis", [("    needs: [pretrain]", "    needs: [pretrain]\n    when: {pee: rope}")], "pee:", "unknown axis 'pee'", "pe"),
    ("unknown-interpolation", [("kind: \"${pe}\"", "kind: \"${pee}\"")], "kind: \"${pee}\"", "unknown axis '${pee}'", "pe"),
    ("zip-unequal", [("  product:\n    pe: [rope, pope]", "  zip:\n    - {pe: [rope, pope], lr: [0.1]}")], "{pe: [rope", "equal lengths", None),
    ("exclude-unknown-axis", [("    pe: [rope, pope]", "    pe: [rope, pope]\n  exclude: [{pee: rope}]")], "pee:", "unknown axis 'pee'", "pe"),
    ("empty-axis", [("pe: [rope, pope]", "pe: []")], "pe: []", "at least one value", None),
    ("eval-without-eval", [("    eval: {suite: ppl-by-length, ppl: {lengths: [32]}, device: cpu}\n", "")], "ppl:", "needs an 'eval' section", None),
    ("pretrain-needs-pretrain", [("  pretrain:\n    kind: pretrain\n", "  base:\n    kind: pretrain\n  pretrain:\n    kind: pretrain\n    needs: [base]\n")], "    needs: [base]", "starts from scratch", None),
    ("eval-with-train", [("    needs: [pretrain]", "    needs: [pretrain]\n    train: {steps: 3}")], "train: {steps: 3}", "takes no 'train' section", None),
    ("bad-stage-name", [("  ppl:", "  \"bad name!\":")], "\"bad name!\"", "must match", None),
    ("unknown-data-kind", [("data: {kind: text", "data: {kind: textt")], "kind: textt", "unknown data kind 'textt'", "text"),
    ("train-wrong-type", [("steps: 2,", "steps: many,")], "steps: many", "expected an int", None),
    ("yaml-syntax", [("pe: [rope, pope]", "pe: [rope, pope")], ("defaults:", 1, False), "YAML syntax error", None),
    ("duplicate-stage", [("  ppl:\n", "  pretrain:\n    kind: pretrain\n  ppl:\n")], ("  pretrain:", 2), "duplicate key", None),
    ("cycle", [("  pretrain:\n    kind: pretrain\n", "  pretrain:\n    kind: pretrain\n  a:\n    kind: cpt\n    needs: [b, pretrain]\n  b:\n    kind: cpt\n    needs: [a, pretrain]\n")], "    needs: [b, pretrain]", "dependency cycle", None),
    ("needs-excluded-by-when", [("  pretrain:\n    kind: pretrain\n", "  pretrain:\n    kind: pretrain\n    when: {pe: rope}\n")], "    needs: [pretrain]", "which its 'when' excludes", None),
    ("unknown-eval-suite", [("suite: ppl-by-length", "suite: ppl-by-lenght")], "suite: ppl-by-lenght", "unknown eval suite", "ppl-by-length"),
    ("bad-grid-name", [("grid: t", "grid: ../etc")], "grid:", "should match pattern", None),
    ("unknown-resource-key", [("  launcher: ray_task", "  launcher: ray_task\n  resources: {gpu: 1}")], "gpu:", "unknown key 'gpu'", "gpus"),
    ("unknown-launcher", [("launcher: ray_task", "launcher: ray_tsk")], "launcher:", "ray_train", None),
    ("tune-unknown-field", [("    kind: pretrain\n", "    kind: tune\n    tune: {space: {train.lrr: {grid: [0.1]}}}\n")], "train.lrr", "is not a field", "train.lr"),
    ("tune-bad-distribution", [("    kind: pretrain\n", "    kind: tune\n    tune: {space: {train.lr: {gird: [0.1]}}}\n")], "train.lr: {gird", "give exactly one of", None),
    ("tune-without-tune", [("    kind: pretrain\n", "    kind: tune\n")], "  pretrain:", "needs a 'tune' section", None),
    ("finetune-with-model", [("  ppl:\n", "  ft:\n    kind: finetune\n    needs: [pretrain]\n    model: {n_layer: 3}\n  ppl:\n")], "    model: {n_layer: 3}", "takes no 'model' section", None),
]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_grid_names_file_line_column_key_and_suggestion(tmp_path: Path, case) -> None:
    _, edits, needle, fragment, suggestion = case
    text = BASE
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = _write(tmp_path, text)
    with pytest.raises(GridError) as info:
        plan_grid(path)
    issues = [i for i in info.value.issues if fragment in i.message]
    assert issues, f"no issue mentions {fragment!r}: {info.value}"
    issue = issues[0]
    needle, nth, check_col = (*needle, True)[:3] if isinstance(needle, tuple) else (needle, 1, True)
    line, col = locate(text, needle, nth)
    assert issue.mark.file == str(path)
    assert issue.mark.line == line, str(issue)
    if check_col and not needle.startswith(" "):   # the needle starts at the reported key / item
        assert issue.mark.column == col, str(issue)
    assert issue.suggestion == suggestion, str(issue)
    rendered = str(info.value)
    assert f"{path}:{issue.mark.line}:{issue.mark.column}" in rendered


def test_error_points_at_the_exact_key_column(tmp_path: Path) -> None:
    text = BASE.replace("steps: 2,", "steps: 2, lrr: 0.1,")
    with pytest.raises(GridError) as info:
        plan_grid(_write(tmp_path, text))
    issue = info.value.issues[0]
    assert (issue.mark.line, issue.mark.column) == locate(text, "lrr")
    assert issue.key == "defaults.train.lrr"
    assert issue.suggestion == "lr"


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 20


def test_bad_grid_writes_nothing_to_the_catalog(tmp_path: Path) -> None:
    from phaselab.orchestrator.cli.main import app

    db = tmp_path / "catalog.db"
    bad = _write(tmp_path, BASE.replace("stages:", "stagess:"))
    for verb in ("run", "submit", "plan"):
        res = CliRunner().invoke(app, [verb, str(bad), "--catalog", f"sqlite:///{db}", "--json"])
        assert res.exit_code == 1, res.output
        assert "unknown key 'stagess'" in res.output
    assert not db.exists()


def test_override_errors_name_the_override(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE)
    with pytest.raises(GridError) as info:
        plan_grid(path, ["defaults.train.stepz=3"])
    issue = info.value.issues[0]
    assert "override 'defaults.train.stepz=3'" in str(issue.mark)
    assert issue.suggestion == "steps"
    with pytest.raises(GridError) as info:   # outside config sections a key must exist
        plan_grid(path, ["defaults.trian.steps=3"])
    assert info.value.issues[0].suggestion == "defaults.train"
    with pytest.raises(GridError) as info:   # an override's bad value is reported against the override
        plan_grid(path, ["defaults.train.steps=many"])
    assert "<override 'defaults.train.steps=many'>" in str(info.value)
