"""``eval.select`` through the orchestrator: strict YAML errors naming the key, the selection in
the eval stage's cache key (and an eval without it keeping its key), the training stage's
``best`` artifact loaded by a best_valid eval, a clear error when no best weights were kept,
and the paper table marking the selected cells (EXPERIMENTS §2.2 "Reporting")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from _orchestrator_grids import BASE, locate

from phaselab.catalog.reports.tables import get_spec
from phaselab.catalog.reports.tables.spec import build, render_latex, render_markdown
from phaselab.catalog.tracking import RecordingTracker
from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import build_dag, load_grid, plan_grid
from phaselab.orchestrator.plan.hashing import CodeVersion
from phaselab.orchestrator.stages import STAGES, StageContext

CODE = CodeVersion(digest="0" * 64, modules={})
PPL = "    eval: {suite: ppl-by-length, ppl: {lengths: [32]}, device: cpu"


def _extra(name: str, select: str) -> str:
    return f"  {name}:\n    kind: eval\n    needs: [pretrain]\n{PPL}, select: {select}}}\n"


def _dag(path: Path):
    spec, marks, _, _ = load_grid(path)
    return build_dag(spec, marks, code=CODE)


def _hashes(path: Path) -> dict[tuple[str, str], str]:
    dag = _dag(path)
    return {(cell, name): h for cell, stages in dag.cell_stages.items() for name, h in stages.items()}


def test_select_enters_the_key_and_last_keeps_the_old_one(tmp_path: Path) -> None:
    (tmp_path / "before.yaml").write_text(BASE)
    before = _hashes(tmp_path / "before.yaml")
    text = BASE + _extra("ppl_last", "last") + _extra("ppl_last_map", "{rule: last}") \
        + _extra("ppl_best", "best_valid") + _extra("ppl_best_full", "{rule: best_valid, metric: valid/loss, mode: min}") \
        + _extra("ppl_acc", "{rule: best_valid, metric: valid/acc}")
    (tmp_path / "after.yaml").write_text(text)
    after = _hashes(tmp_path / "after.yaml")
    assert {k: after[k] for k in before} == before                 # existing stages: same keys
    cell = next(c for c, _ in before)
    key = {n: after[(cell, n)] for n in ("ppl", "ppl_last", "ppl_last_map", "ppl_best", "ppl_best_full", "ppl_acc")}
    assert key["ppl"] == key["ppl_last"] == key["ppl_last_map"]    # last is the default: one entry
    assert key["ppl_best"] == key["ppl_best_full"]                 # the same selection, spelled out
    assert len({key["ppl"], key["ppl_best"], key["ppl_acc"]}) == 3
    dag = _dag(tmp_path / "after.yaml")
    configs = {n: dag.nodes[h].config["eval"] for n, h in key.items()}
    assert "select" not in configs["ppl"] and "select" not in configs["ppl_last"]
    assert configs["ppl_best"]["select"] == {"rule": "best_valid", "metric": "valid/loss", "mode": "min"}
    assert configs["ppl_acc"]["select"] == {"rule": "best_valid", "metric": "valid/acc", "mode": "max"}


@pytest.mark.parametrize("select, key, needle, suggestion", [
    ("{rul: best_valid}", "stages.ppl_best.eval.select.rul", "rul", "rule"),
    ("best", "stages.ppl_best.eval.select", "select: best", None),
    ("{rule: best_valid, metric: valid/ppl}", "stages.ppl_best.eval.select", "select: {rule", None),
])
def test_bad_select_names_file_line_and_key(tmp_path: Path, select, key, needle, suggestion) -> None:
    text = BASE + _extra("ppl_best", select)
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(GridError) as info:
        plan_grid(path)
    [issue] = info.value.issues
    assert issue.key == key and issue.suggestion == suggestion
    assert issue.mark.file == str(path) and issue.mark.line == locate(text, needle)[0]


# -- running the stages ---------------------------------------------------------------------------
STEPS = 32
TRAIN = {"steps": STEPS, "batch_size": 8, "lr": 1.0, "min_lr": 0.1, "warmup": STEPS, "decay_steps": STEPS,
         "eval_every": 4, "eval_batches": 2, "eval_batch_size": 16, "final_eval_batches": 2,
         "ckpt_every": 8, "log_every": 4, "device": "cpu"}   # the lr ramp makes the end worse
DATA = {"kind": "text", "block_size": 32}
EVAL = {"suite": "task", "split": "valid", "metric": "nll", "batch_size": 16, "max_batches": 2,
        "device": "cpu"}


def _ctx(tmp_path: Path, name: str, config: dict, upstream: dict | None = None) -> StageContext:
    return StageContext(stage_hash=name.ljust(64, "0"), name=name, config=config, out_dir=tmp_path / name,
                        runs_root=tmp_path, tracker=RecordingTracker(), upstream=upstream or {},
                        launcher="ray_task")


def _train(tmp_path: Path, name: str, **train) -> tuple[StageContext, object]:
    stage = STAGES["pretrain"]
    config = stage.normalize({"model": {"preset": "tiny", "n_layer": 1, "d_model": 32, "n_head": 2,
                                        "block_size": 32, "pe": {"kind": "rope"}},
                              "data": DATA, "train": {**TRAIN, **train}})
    ctx = _ctx(tmp_path, name, config)
    return ctx, stage.run(ctx)


def _eval(tmp_path: Path, name: str, trained, select=None):
    stage = STAGES["eval"]
    config = stage.normalize({"data": DATA, "eval": {**EVAL, **({"select": select} if select else {})}})
    up = {"checkpoint": {"hash": "1" * 64, "kind": "pretrain",
                         "artifacts": {k: str(v) for k, v in trained.artifacts.items()}}}
    return stage.run(_ctx(tmp_path, name, config, up))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    ctx, result = _train(root, "train")
    valid = {}
    for step, metrics in ctx.tracker.metrics:
        if "valid/loss" in metrics:
            valid.setdefault(step, metrics["valid/loss"])
    return root, result, valid


def test_training_stage_exposes_best_and_best_valid_eval_loads_it(trained) -> None:
    root, result, valid = trained
    best = min(valid, key=valid.get)
    assert best < STEPS and valid[STEPS] > valid[best] + 0.1
    assert result.artifacts["best"] == root / "train" / "best"
    assert result.artifacts["checkpoint"].parent.name == f"step_{STEPS:07d}"
    chosen = _eval(root, "test_nll_best", result, "best_valid")
    last = _eval(root, "test_nll_last", result)
    nll = "text/nll/split=valid"
    assert chosen.metrics[nll] == pytest.approx(valid[best], rel=1e-5)
    assert last.metrics[nll] == pytest.approx(valid[STEPS], rel=1e-5)
    assert chosen.metrics["text/select/step"] == best
    assert chosen.metrics["text/select/best_valid/valid/loss/split=valid"] == pytest.approx(valid[best], rel=1e-12)
    assert set(last.metrics) == {nll}
    step_row = next(r for r in chosen.records if r.name == "select/step")
    assert (step_row.step, step_row.unit) == (best, "step")


def test_best_valid_without_periodic_validation_fails_clearly(tmp_path: Path) -> None:
    _, result = _train(tmp_path, "train", steps=2, eval_every=0, warmup=0)
    assert "best" not in result.artifacts
    with pytest.raises(ValueError, match=r"stage 'test_nll': select: best_valid valid/loss \(min\) "
                                         r"needs the best-validation weights.*eval_every > 0"):
        _eval(tmp_path, "test_nll", result, "best_valid")


def _frame_rows(result, stage_hash: str, pe: str, seed: int) -> list[dict]:
    return [{**r.to_dict(), "axes": {"pe": pe, "seed": seed}, "stage_hash": stage_hash, "attempts": 1,
             "finished_at": datetime(2026, 1, 1, tzinfo=UTC), "state": "SUCCEEDED"} for r in result.records]


def test_music_table_marks_the_selected_cells(trained) -> None:
    """The stage records of a real best_valid eval, as catalog rows of the JSB column (task and
    split renamed to the grid's), next to a RoPE cell evaluated at the last checkpoint."""
    root, result, valid = trained
    best = min(valid, key=valid.get)
    chosen = _eval(root, "sel_table", result, "best_valid")
    last = _eval(root, "last_table", result)
    rows = []
    for seed in (0, 1, 2):
        rows += _frame_rows(chosen, f"p{seed}".ljust(64, "0"), "pope", seed)
        rows += _frame_rows(last, f"r{seed}".ljust(64, "0"), "rope", seed)
    for r in rows:
        r.update(task="jsb", split="test" if r["name"] == "nll" else r["split"])
    spec = get_spec("pope_music_nll")
    table = build(spec, rows)
    assert table.selection == {(("pope",), "jsb"): ("valid/loss", (best, best, best))}
    md = render_markdown(table, datetime(2026, 1, 1, tzinfo=UTC))
    pope_line = next(line for line in md.splitlines() if line.startswith("| PoPE |"))
    rope_line = next(line for line in md.splitlines() if line.startswith("| RoPE |"))
    assert pope_line.split("|")[2].strip().endswith("†") and "†" not in rope_line
    assert (f"† = at the best-validation checkpoint (select: best_valid on valid/loss), selected "
            f"steps by seed: PoPE/JSB {best}, {best}, {best}; unmarked = final checkpoint") in md
    tex = render_latex(table, datetime(2026, 1, 1, tzinfo=UTC))
    assert "$^\\dagger$ &" in tex and "$^\\dagger$ = at the best-validation checkpoint" in tex


def test_train_eval_splits_default_keeps_keys_and_test_enters_them(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    train = "  train: {steps: 2, batch_size: 2, eval_every: 0, device: cpu"
    assert train in BASE
    (tmp_path / "valid.yaml").write_text(BASE.replace(train, train + ", eval_splits: [valid]"))
    (tmp_path / "test.yaml").write_text(BASE.replace(train, train + ", eval_splits: [valid, test]"))
    base, valid, test = (_hashes(tmp_path / f"{n}.yaml") for n in ("base", "valid", "test"))
    assert valid == base and set(test.values()).isdisjoint(base.values())
    node = next(n for n in _dag(tmp_path / "test.yaml").nodes.values() if n.kind == "pretrain")
    assert node.config["train"]["eval_splits"] == ["valid", "test"]
    bad = BASE.replace(train, train + ", eval_splits: [test]")
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(GridError) as info:
        plan_grid(tmp_path / "bad.yaml")
    [issue] = info.value.issues
    assert issue.key == "defaults.train.eval_splits" and "must name 'valid'" in issue.message


def test_music_table_shows_the_minimum_over_evaluations_labelled(trained) -> None:
    root, result, _ = trained
    chosen = _eval(root, "min_table", result, "best_valid")
    rows = []
    for seed, value in ((0, 0.5), (1, 0.7)):
        rows += _frame_rows(chosen, f"e{seed}".ljust(64, "0"), "pope", seed)
        rows.append({"name": "loss_min_over_evals", "value": value, "split": "test", "task": "jsb", "step": 300,
                     "axes": {"pe": "pope", "seed": seed}, "stage_hash": f"t{seed}".ljust(64, "0"),
                     "attempts": 1, "finished_at": datetime(2026, 1, 1, tzinfo=UTC), "state": "SUCCEEDED"})
    for r in rows:
        r.update(task="jsb", split="test" if r["name"] in ("nll", "loss_min_over_evals") else r["split"])
    spec = get_spec("pope_music_nll")
    md = render_markdown(build(spec, rows), datetime(2026, 1, 1, tzinfo=UTC))
    line = next(x for x in md.splitlines() if x.startswith("| PoPE (min over evaluations) |"))
    assert line.split("|")[2].strip() == "0.6000 ± 0.1414 (n=2/3)"
    assert not any(x.startswith("| RoPE (min over evaluations)") and "0." in x for x in md.splitlines())
    plain = render_markdown(build(spec, [r for r in rows if r["name"] != "loss_min_over_evals"]),
                            datetime(2026, 1, 1, tzinfo=UTC))
    assert "min over evaluations" not in plain                    # no such values: no such rows
