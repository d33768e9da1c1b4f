"""The TAPA long-context grid in miniature (experiments/tapa_long_context_small.yaml): it plans the
paper's stages with the paper's numbers on CPU, the extrapolation_small recipe is an override
away, and a tiny variant (same stages, shrunk model, steps and lengths) runs end to end through
`phaselab run` and renders its table and figures (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.plan.dag import Dag, plan_grid

GRID = "tapa_long_context_small"
L = 512
LENGTHS = [L, 2 * L, 4 * L, 6 * L, 8 * L, 16 * L]
CELLS = [("rope", "quadratic"), ("tapa", "quadratic"), ("tapa", "linear"), ("pope", "quadratic")]
ROPE_CPT = {"cpt_2k_rope_b5e5": ("none", 1.0, None), "cpt_2k_rope_b2e8": ("none", 1.0, 2.0e8),
            "cpt_2k_pi": ("pi", 8.0, None), "cpt_2k_yarn": ("yarn", 8.0, None)}
PPL_AFTER_CPT = {"ppl_tapa": "cpt_2k", "ppl_pope": "cpt_2k", "ppl_rope_b5e5": "cpt_2k_rope_b5e5",
                 "ppl_rope_b2e8": "cpt_2k_rope_b2e8", "ppl_pi": "cpt_2k_pi", "ppl_yarn": "cpt_2k_yarn"}
NIAH = ["niah_tapa", "niah_pope", "niah_rope_b5e5", "niah_rope_b2e8", "niah_pi", "niah_yarn"]
ZERO_SHOT = ["ppl_zero_shot", "ppl_zero_shot_pi", "ppl_zero_shot_yarn"]


@pytest.fixture(scope="module")
def dag() -> Dag:
    return plan_grid(GRID)


def _by_cell(dag: Dag) -> dict[tuple[str, str, int, str], object]:
    """(pe, phase, seed, stage name) -> node."""
    axes = {c.key: c.axes for c in dag.cells}
    return {(axes[key]["pe"], axes[key]["phase"], axes[key]["seed"], name): dag.nodes[h]
            for key, stages in dag.cell_stages.items() for name, h in stages.items()}


def _config(dag: Dag, stage: str, pe: str, phase: str = "quadratic", seed: int = 0) -> dict:
    return _by_cell(dag)[(pe, phase, seed, stage)].config


def test_grid_plans_the_papers_stages(dag: Dag) -> None:
    assert len(dag.cells) == 8
    kinds: dict[str, int] = {}
    for node in dag.nodes.values():
        kinds[node.kind] = kinds.get(node.kind, 0) + 1
    assert kinds == {"pretrain": 8, "cpt": 14, "eval": 40}
    got = _by_cell(dag)
    per_pe = {"rope": {"pretrain", *ROPE_CPT, *ZERO_SHOT, "ppl_rope_b5e5", "ppl_rope_b2e8", "ppl_pi", "ppl_yarn",
                       "niah_rope_b5e5", "niah_rope_b2e8", "niah_pi", "niah_yarn"},
              "tapa": {"pretrain", "cpt_2k", "ppl_zero_shot", "ppl_tapa", "niah_tapa"},
              "pope": {"pretrain", "cpt_2k", "ppl_zero_shot", "ppl_pope", "niah_pope"}}
    for pe, phase in CELLS:
        for seed in (0, 1):
            assert {name for (p, ph, s, name) in got if (p, ph, s) == (pe, phase, seed)} == per_pe[pe]
    for name, upstream in PPL_AFTER_CPT.items():
        node = next(n for (_, _, _, s), n in got.items() if s == name)
        assert [dag.nodes[h].name for h in node.upstream.values()] == [upstream]


def test_pretraining_is_the_papers_recipe_scaled(dag: Dag) -> None:
    lrs = {}
    for pe, phase in CELLS:
        cfg = _config(dag, "pretrain", pe, phase)
        model, train, data = cfg["model"], cfg["train"], cfg["data"]
        assert (model["n_layer"], model["d_model"], model["n_head"], model["n_kv_head"]) == (6, 384, 6, 2)
        assert (model["mlp"], model["tie_embeddings"], model["vocab_size"], model["block_size"]) == \
            ("swiglu", False, 81, L)
        assert model["pe"]["kind"] == pe and model["pe"]["tapa"]["phase"] == phase
        assert model["pe"]["rope"]["base"] == 500_000.0 and model["attention"]["qk_norm"] is False
        assert data["text"] == {"path": "austen", "tokenizer": "char", "train_fraction": 0.9}
        assert (data["kind"], data["block_size"]) == ("text", L)
        assert (train["steps"], train["batch_size"], train["warmup"], train["schedule"]) == (2000, 16, 50, "cosine")
        assert (train["beta2"], train["weight_decay"]) == (0.95, 0.0)
        lrs[(pe, phase)] = (train["lr"], train["min_lr"])
    # EXPERIMENTS §3.1: 1e-4 for RoPE, 2e-5 for TAPA, cosine to 0.1 x; PoPE at RoPE's
    assert lrs == {("rope", "quadratic"): (1e-4, 1e-5), ("tapa", "quadratic"): (2e-5, 2e-6),
                   ("tapa", "linear"): (2e-5, 2e-6), ("pope", "quadratic"): (1e-4, 1e-5)}


def test_continued_pretraining_and_evals(dag: Dag) -> None:
    for name, (rule, factor, base) in ROPE_CPT.items():
        cfg = _config(dag, name, "rope", seed=1)
        ext = cfg["extend"]
        assert (ext["rule"], ext["factor"], ext["base"], ext["block_size"]) == (rule, factor, base, 4 * L)
        assert ext["original_max_seq_len"] == (L if rule != "none" else None)
        assert cfg["data"]["block_size"] == 4 * L and cfg["data"]["text"]["path"] == "austen"
        train = cfg["train"]   # EXPERIMENTS §3.2: 2e-5 for every method, 10 % warm-up
        assert (train["steps"], train["batch_size"], train["lr"], train["min_lr"], train["warmup"]) == \
            (200, 4, 2e-5, 2e-6, 20)
    tapa = _config(dag, "cpt_2k", "tapa", "linear")
    assert tapa["extend"]["rule"] == "none" and tapa["train"]["lr"] == 2e-5
    for name in ["ppl_zero_shot", *PPL_AFTER_CPT]:
        pe = {"ppl_tapa": "tapa", "ppl_pope": "pope"}.get(name, "rope")
        ev = _config(dag, name, pe)["eval"]
        assert ev["ppl"] == {"lengths": LENGTHS, "mode": "sliding", "stride": 256, "max_tokens": 32768,
                             "batch_size": 4}
        assert ev["split"] == "valid" and ev["data"]["text"]["path"] == "austen"
    for name, rule in (("ppl_zero_shot_pi", "pi"), ("ppl_zero_shot_yarn", "yarn")):
        ext = _config(dag, name, "rope")["extend"]
        assert (ext["rule"], ext["factor"], ext["original_max_seq_len"]) == (rule, 8.0, L)
    for name in NIAH:
        pe = {"niah_tapa": "tapa", "niah_pope": "pope"}.get(name, "rope")
        niah = _config(dag, name, pe)["eval"]["niah"]
        assert (niah["lengths"], niah["trials"], niah["answer"], len(niah["depths"])) == \
            ([2 * L, 4 * L, 8 * L, 16 * L], 10, "letters", 11)


def test_the_pretrainings_share_one_gpu(dag: Dag) -> None:
    train = [n for n in dag.nodes.values() if n.kind in ("pretrain", "cpt")]
    assert sum(n.resources.gpus for n in train if n.kind == "pretrain") <= 1.0
    assert sum(n.resources.gpus for n in train if n.kind == "cpt") <= 1.0
    assert {n.launcher for n in train} == {"ray_task"}


def test_the_small_scale_recipe_is_an_override(dag: Dag) -> None:
    """extrapolation_small's finding (qk-norm, TAPA at 3e-4) as the grid's comment writes it."""
    recipe = plan_grid(GRID, ["axes.product.qk_norm=[true]", "axes.zip.0.lr=[1.0e-3,3.0e-4,3.0e-4,1.0e-3]",
                           "axes.zip.0.min_lr=[1.0e-4,3.0e-5,3.0e-5,1.0e-4]"])
    pre = {(k[0], k[1]): n.config for k, n in _by_cell(recipe).items() if k[3] == "pretrain" and k[2] == 0}
    assert {k: (c["train"]["lr"], c["model"]["attention"]["qk_norm"]) for k, c in pre.items()} == {
        ("rope", "quadratic"): (1e-3, True), ("tapa", "quadratic"): (3e-4, True),
        ("tapa", "linear"): (3e-4, True), ("pope", "quadratic"): (1e-3, True)}
    assert len(recipe.nodes) == 62 and not set(recipe.nodes) & set(dag.nodes)


# -- the tiny variant: L = 32 (continued pretraining at 128, evals at 32 ... 512), one seed ------
TL = 32
TINY = ["seeds=[0]", "defaults.model.n_layer=1", "defaults.model.d_model=64", "defaults.model.n_head=2",
        "defaults.model.n_kv_head=1", f"defaults.model.block_size={TL}", f"defaults.data.block_size={TL}",
        "defaults.train.steps=2", "defaults.train.batch_size=2", "defaults.train.eval_every=0",
        "defaults.train.final_eval_batches=1", "defaults.train.ckpt_every=2", "defaults.train.warmup=1",
        "defaults.resources.gpus=0", "defaults.resources.memory_gb=1"]
for _s in ["cpt_2k", *ROPE_CPT]:
    TINY += [f"stages.{_s}.{k}" for k in ("train.steps=2", "train.batch_size=1", "train.warmup=1", "train.eval_every=0",
                                         "train.ckpt_every=2", f"data.block_size={4 * TL}",
                                         f"extend.block_size={4 * TL}")]
TINY += [f"stages.{s}.extend.original_max_seq_len={TL}"
         for s in ("cpt_2k_pi", "cpt_2k_yarn", "ppl_zero_shot_pi", "ppl_zero_shot_yarn")]
RUN_LENGTHS = [n * TL // L for n in LENGTHS]
for _s in [*ZERO_SHOT, *PPL_AFTER_CPT]:
    TINY += [f"stages.{_s}.{k}" for k in ("resources.gpus=0", "resources.memory_gb=1", f"eval.ppl.stride={TL // 2}",
                                         f"eval.ppl.lengths=[{','.join(map(str, RUN_LENGTHS))}]",
                                         f"eval.ppl.max_tokens={16 * TL}")]
NIAH_LENGTHS = [4 * TL, 16 * TL]   # the needle and question take ~100 characters
for _s in NIAH:
    TINY += [f"stages.{_s}.{k}" for k in ("resources.gpus=0", "resources.memory_gb=1", "eval.niah.trials=1",
                                         "eval.niah.depths=[0.0,1.0]", "eval.niah.batch_size=1",
                                         f"eval.niah.lengths=[{','.join(map(str, NIAH_LENGTHS))}]")]


def _cli(*args: str) -> dict:
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.slow
@pytest.mark.ray
def test_tiny_variant_runs_and_renders_its_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/catalog.db"
    cmd = [sys.executable, "-m", "phaselab.orchestrator.cli.main", "run", GRID, *TINY, "--catalog", url,
           "--runs-root", str(tmp_path / "runs"), "--no-mlflow", "--num-cpus", "2", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["counts"] == {"SUCCEEDED": 31}
    rows = out["results"]["rows"]
    ppl_rows = [r for r in rows if r["kind"] == "eval" and r["stage"].startswith("ppl")]
    assert sorted(r["stage"] for r in ppl_rows) == sorted(
        ["ppl_zero_shot"] * 4 + ZERO_SHOT[1:] + [*PPL_AFTER_CPT] + ["ppl_tapa"])
    # two steps from a random init: about the 81-symbol uniform perplexity at every length
    assert all(40.0 < r[f"ppl@{n}"] < 160.0 for r in ppl_rows for n in RUN_LENGTHS)

    table = _cli("tables", GRID, "--metric", "ppl", "--rows", "pe,phase,role", "--cols", "context_len",
                 "--where", "qk_norm=false", "--catalog", url)["tables"][0]["text"]
    lines = [ln for ln in table.splitlines() if ln.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")][-len(RUN_LENGTHS):] == list(map(str, RUN_LENGTHS))
    assert len(lines) == 2 + 13 and "—" not in "\n".join(lines)   # 13 rows, no holes
    assert any("ppl_zero_shot_yarn" in ln for ln in lines) and any("linear" in ln for ln in lines)
    # `phaselab tables GRID`: the grid's own table, whose columns are the full-size lengths; the tiny
    # run's 16x (512) is its 1x column, the other columns are holes
    named = _cli("tables", GRID, "--catalog", url)["tables"][0]
    assert named["name"] == GRID and "Jane Austen" in named["text"]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in named["text"].splitlines()
             if ln.startswith("| no |")]
    assert len(cells) == 13
    for row in cells:   # one seed of the table's two
        value, seeds = row[4].strip("*").split(" ", 1)
        assert 40.0 < float(value) < 160.0 and seeds == "(n=1/2)" and set(row[5:]) == {"—"}, row

    niah = _cli("tables", GRID, "--metric", "niah_acc", "--rows", "pe,phase,role,depth", "--cols", "context_len",
                "--catalog", url)["tables"][0]["text"]
    assert sum(ln.startswith("|") for ln in niah.splitlines()) == 2 + 7 * 2   # 7 models x 2 depths
    for kind in ("length", "niah"):
        paths = [Path(p) for p in _cli("figures", GRID, "--kind", kind, "--catalog", url,
                                       "--out", str(tmp_path / "fig"))["figures"]]
        assert paths and all(p.stat().st_size > 5000 for p in paths)
