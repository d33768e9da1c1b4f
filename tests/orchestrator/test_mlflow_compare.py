"""MLflow that compares: the (shrunk) quickstart tracked by a real ``mlflow server`` on 127.0.0.1,
then read back as a user would compare RoPE, PoPE and TAPA: readable run names, axis values on
every run, the config a stage uses as params, perplexity against context length as one series
per run, figures and checkpoints attached by relative path, parents ended, git and backend tags.

The second test opens the comparison views in headless Chromium (skipped without
``/usr/bin/chromium`` and playwright); with ``PHASELAB_UPDATE_SCREENSHOTS=1`` its screenshots
replace ``docs/images/mlflow_*.png``."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _quickstart import quickstart_cmd, quickstart_env
from _screenshots import keep

from phaselab.catalog.tracking import mlflow_server

pytestmark = [pytest.mark.ray, pytest.mark.slow]
CHROMIUM = Path("/usr/bin/chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(tracking URI, work folder) after the quickstart ran against a real server."""
    work = tmp_path_factory.mktemp("tracked")
    port = _free_port()
    proc = mlflow_server.serve(port=port, backend_uri=f"sqlite:///{work / 'server.db'}",
                               artifact_root=str(work / "server-artifacts"), block=False,
                               log_path=work / "server.log")
    uri = f"http://127.0.0.1:{port}"
    try:
        run = subprocess.run(quickstart_cmd(work, "--json"), cwd=work, env=quickstart_env(MLFLOW_TRACKING_URI=uri),
                             capture_output=True, text=True, timeout=240, check=False)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert json.loads(run.stdout)["counts"] == {"SUCCEEDED": 8}
        yield uri, work
    finally:
        mlflow_server.stop(proc)


def _runs(uri: str) -> tuple[object, str, list]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("quickstart")
    return client, exp.experiment_id, client.search_runs([exp.experiment_id], max_results=100)


def test_runs_compare_by_encoding(tracked: tuple[str, Path]) -> None:
    uri, work = tracked
    client, exp_id, runs = _runs(uri)
    exp = client.get_experiment(exp_id)
    assert exp.artifact_location.startswith("mlflow-artifacts:")          # no client path baked in
    assert exp.tags["mlflow.note.content"].startswith("Char-level Tiny Shakespeare")
    assert "`pe` ∈ {rope, pope, tapa}" in exp.tags["mlflow.note.content"]
    by_name = {r.info.run_name: r for r in runs}
    assert set(by_name) == {"pe=rope seed=0", "pe=pope seed=0", "pe=tapa seed=0", "yarn pe=rope seed=0",
                            "ppl_yarn pe=rope seed=0"} | {f"{s} pe={pe} seed=0" for s in ("pretrain", "ppl")
                                                          for pe in ("rope", "pope", "tapa")}
    assert {r.info.status for r in runs} == {"FINISHED"}                 # parents ended too
    for r in runs:
        pe = r.info.run_name.split("pe=")[1].split()[0]
        assert r.data.params["axis.pe"] == r.data.tags["axis.pe"] == pe   # evals included
        assert r.data.tags["phaselab.git.dirty"] in ("true", "false")
        assert len(r.data.tags["mlflow.source.git.commit"]) == 40

    pre = by_name["pretrain pe=pope seed=0"]
    assert pre.data.params["model.pe.kind"] == "pope" and "model.pe.pope.amplitude" in pre.data.params
    assert not any(k.startswith(("model.pe.rope.", "model.pe.tapa.", "data.jsb.", "data.ii."))
                   for k in pre.data.params)                              # only the sections it uses
    assert pre.data.params["attn.backend"] == pre.data.tags["phaselab.attn.backend"] == "reference"
    ckpt = pre.data.tags["phaselab.checkpoint"]
    assert not ckpt.startswith("/") and (work / "runs" / ckpt).is_file()  # relative to the runs root
    outputs = json.loads(Path(client.download_artifacts(pre.info.run_id, "outputs.json", str(work))).read_text())
    assert outputs[0]["path"] == ckpt and outputs[0]["copied"] == "checkpoint/model.pt"

    curves = {}
    for pe in ("rope", "pope", "tapa"):
        ev = by_name[f"ppl pe={pe} seed=0"]
        history = client.get_metric_history(ev.info.run_id, "ppl/text/split_valid/by_ctx")
        curves[pe] = {m.step: m.value for m in history}
        assert curves[pe][128] == pytest.approx(ev.data.metrics["ppl/text/split_valid/ctx_128"])
        figures = {a.path for a in client.list_artifacts(ev.info.run_id, "figures")}
        assert "figures/ppl_vs_ctx.png" in figures
    assert {pe: sorted(c) for pe, c in curves.items()} == {pe: [16, 32, 64, 128] for pe in curves}
    assert len({tuple(c.values()) for c in curves.values()}) == 3        # three different curves


def _hide_parents(page: object) -> None:
    """Hide the cells' parent runs (no metrics of their own) from the charts: only the evals'
    lines remain."""
    rows = page.locator(".ag-row:has([aria-colindex='2'])")
    names = [rows.nth(i).inner_text().strip().split("\n")[-1] for i in range(rows.count())]
    for name in (n for n in names if n.startswith("pe=")):
        row = rows.filter(has_text=re.compile(rf"#[0-9a-f]{{6}}{re.escape(name)}$"))   # colour, then name
        row.get_by_text("Hide run").first.locator("..").click(force=True, timeout=10_000)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_comparison_view_in_chromium(tracked: tuple[str, Path], tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    uri, _ = tracked
    _, exp_id, runs = _runs(uri)
    evals = [r.info.run_id for r in runs if r.data.tags.get("phaselab.stage") == "ppl"]
    shots = {"compare": tmp_path / "mlflow_compare.png", "charts": tmp_path / "mlflow_ppl_by_ctx.png"}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(f"{uri}/#/compare-runs?runs={json.dumps(evals)}&experiments={json.dumps([exp_id])}")
        page.get_by_text("ppl pe=tapa seed=0").first.wait_for(timeout=60_000)
        page.locator("[data-component-id='mlflow.assistant.chat_panel.close']").first.click(timeout=5_000)
        text = page.inner_text("body")
        assert all(f"ppl pe={pe} seed=0" in text for pe in ("rope", "pope", "tapa"))   # side by side
        page.screenshot(path=shots["compare"])

        page.goto(f"{uri}/#/experiments/{exp_id}/runs?compareRunsMode=CHART")
        search = page.get_by_placeholder('metrics.rmse < 1 and params.model = "tree"')
        search.wait_for(timeout=60_000)
        search.fill("tags.`phaselab.stage` = 'ppl'")
        search.press("Enter")
        page.get_by_text("6 matching runs").wait_for(timeout=30_000)   # 3 cells, their 3 evals
        page.wait_for_timeout(1000)
        expanders = page.locator("button[data-component-id*='runnamecellrenderer']")
        for i in range(expanders.count()):
            expanders.nth(i).click()
        page.get_by_text("ppl pe=tapa seed=0").first.wait_for(timeout=30_000)
        _hide_parents(page)
        page.get_by_placeholder("Search metric charts").fill("by_ctx")
        page.get_by_text(re.compile(r"^ppl/text/split_valid")).first.wait_for(timeout=30_000)
        page.wait_for_timeout(1500)   # the chart's lines are drawn after its frame
        page.screenshot(path=shots["charts"])
        browser.close()
    assert all(p.stat().st_size > 20_000 for p in shots.values())
    keep(shots)
