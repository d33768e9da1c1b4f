"""The small length-extrapolation grid (experiments/extrapolation_small.yaml): it plans the
stages its table reads, and it runs end to end on CPU with a tiny model (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phaselab.catalog.reports.figures import CURVE_TABLES, plot_curves
from phaselab.catalog.reports.tables import get_spec
from phaselab.catalog.reports.tables.spec import build
from phaselab.orchestrator.plan.dag import plan_grid

EVALS = ("ppl", "ppl_yarn_inference", "ppl_yarn_ft", "ppl_pi_ft")
LENGTHS = [256, 512, 1024, 2048, 4096]


def _stages(dag) -> dict[tuple[str, str], object]:
    return {(n.members[0][0].split(",")[0], n.name): n for n in dag.nodes.values()}


def test_grid_plans_the_expected_stages() -> None:
    dag = plan_grid("extrapolation_small")
    got = _stages(dag)
    want = {(f"pe={pe}", "pretrain") for pe in ("rope", "pope", "tapa")} | \
           {(f"pe={pe}", "ppl") for pe in ("rope", "pope", "tapa")} | \
           {("pe=rope", s) for s in ("ppl_yarn_inference", "yarn_ft", "pi_ft", "ppl_yarn_ft", "ppl_pi_ft")}
    assert set(got) == want
    pre = got[("pe=rope", "pretrain")].config
    assert (pre["model"]["n_layer"], pre["model"]["d_model"], pre["model"]["n_head"]) == (6, 384, 6)
    assert pre["data"]["block_size"] == 256 and pre["train"]["steps"] == 4000
    yarn = got[("pe=rope", "yarn_ft")].config
    assert (yarn["extend"]["rule"], yarn["extend"]["factor"], yarn["extend"]["block_size"]) == ("yarn", 4.0, 1024)
    assert yarn["data"]["block_size"] == 1024
    assert got[("pe=rope", "pi_ft")].config["extend"]["rule"] == "pi"
    inference = got[("pe=rope", "ppl_yarn_inference")].config
    assert inference["extend"]["rule"] == "yarn" and inference["extend"]["original_max_seq_len"] == 256
    for key, node in got.items():
        if node.kind == "eval":
            assert list(node.config["eval"]["ppl"]["lengths"]) == LENGTHS, key
    # the three pretrains fit side by side on one GPU
    assert sum(got[(f"pe={pe}", "pretrain")].config.get("resources", {}).get("gpus", 0.3)
               for pe in ("rope", "pope", "tapa")) <= 1.0


def _fake_rows() -> list[dict]:
    """metrics_frame-shaped rows: ppl grows with length for RoPE, stays flat for PoPE."""
    rows = []
    for (pe, role), growth in {("rope", "ppl"): 2.0, ("rope", "ppl_yarn_ft"): 1.1, ("pope", "ppl"): 1.0}.items():
        for i, length in enumerate(LENGTHS):
            rows.append({"name": "ppl", "context_len": length, "role": role, "axes": {"pe": pe, "seed": 0},
                         "stage_hash": f"{pe}-{role}" + "0" * 52, "value": 4.0 * growth ** i,
                         "attempts": 1, "finished_at": None, "state": "SUCCEEDED"})
    return rows


def test_table_and_figure_from_rows(tmp_path: Path) -> None:
    spec = get_spec("extrapolation_small_ppl")
    t = build(spec, _fake_rows())
    assert t.cells[(("rope", "ppl"), 4096)].mean == pytest.approx(64.0)
    assert t.cells[(("pope", "ppl"), 4096)].mean == pytest.approx(4.0)
    assert (("rope", "ppl_pi_ft"), 256) not in t.cells            # a hole, not a zero
    assert "extrapolation_small_ppl" in CURVE_TABLES
    paths = plot_curves(t, tmp_path / "fig", train_len=256, logx=True, styled=True)
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 5000 for p in paths)


TINY = ["defaults.model.n_layer=2", "defaults.model.d_model=128", "defaults.model.n_head=4",
        "defaults.train.steps=3", "defaults.train.batch_size=4",
        "defaults.train.eval_every=0", "defaults.train.final_eval_batches=2", "defaults.train.ckpt_every=3",
        "defaults.train.warmup=1", "defaults.resources.gpus=0", "defaults.resources.cpus=1",
        "defaults.resources.memory_gb=1", "stages.yarn_ft.train.steps=2", "stages.pi_ft.train.steps=2",
        "stages.yarn_ft.train.batch_size=2", "stages.pi_ft.train.batch_size=2"]
# The grid's lengths scaled by 1/4 (train at 64, fine-tune at 256, evaluate at 1x ... 16x): the
# same extensions and the same ratios, while a 4096-token window of reference attention on CPU
# would cost most of the test's time.
RUN_LENGTHS = [n // 4 for n in LENGTHS]
TINY += ["defaults.model.block_size=64", "defaults.data.block_size=64",
         "stages.ppl_yarn_inference.extend.original_max_seq_len=64"]
TINY += [f"stages.{s}.{k}" for s in ("yarn_ft", "pi_ft") for k in ("extend.original_max_seq_len=64",
                                                                   "extend.block_size=256", "data.block_size=256")]
TINY += [f"stages.{s}.{k}" for s in EVALS for k in ("resources.gpus=0", f"eval.ppl.max_tokens={RUN_LENGTHS[-1]}",
                                                    "eval.ppl.batch_size=1",
                                                    f"eval.ppl.lengths=[{','.join(map(str, RUN_LENGTHS))}]")]


@pytest.mark.slow
@pytest.mark.ray
def test_grid_runs_on_cpu_with_a_tiny_model(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "phaselab.orchestrator.cli.main", "run", "extrapolation_small", *TINY,
           "--catalog", f"sqlite:///{tmp_path}/catalog.db", "--runs-root", str(tmp_path / "runs"),
           "--no-mlflow", "--num-cpus", "2", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["counts"] == {"SUCCEEDED": 11}
    cols = out["results"]["columns"]
    assert [c for c in cols if c.startswith("ppl@")] == [f"ppl@{n}" for n in RUN_LENGTHS]
    evals = [r for r in out["results"]["rows"] if r["kind"] == "eval"]
    assert sorted(r["stage"] for r in evals) == sorted(["ppl"] * 3 + list(EVALS[1:]))
    assert all(1.0 < r[f"ppl@{n}"] < 200.0 for r in evals for n in RUN_LENGTHS)   # char vocab of 66
