"""MLflow that compares: the (shrunk) quickstart tracked by a real ``mlflow server`` on 127.0.0.1,
then read back as a user would compare RoPE, PoPE and TAPA: readable run names, axis values on
every run, the config a stage uses as params, perplexity against context length as one series
per run, figures and checkpoints attached by relative path, no run left open, git and backend tags,
and the grid's summary run with the comparison that `phaselab run` links to.

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
        (work / "run.json").write_text(run.stdout)
        yield uri, work
    finally:
        mlflow_server.stop(proc)


def _runs(uri: str) -> tuple[object, str, list]:
    """(client, experiment id, the cell and stage runs), the grid's summary run left out."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    return client, exp.experiment_id, [r for r in runs if r.data.tags.get("phaselab.run_level") != "grid"]


def test_runs_compare_by_encoding(tracked: tuple[str, Path]) -> None:
    uri, work = tracked
    client, exp_id, runs = _runs(uri)
    exp = client.get_experiment(exp_id)
    assert exp.artifact_location.startswith("mlflow-artifacts:")          # no client path baked in
    assert exp.tags["mlflow.note.content"].startswith("Char-level Tiny Shakespeare")
    assert "`pe` ∈ {rope, pope, tapa}" in exp.tags["mlflow.note.content"]
    by_name = {r.info.run_name: r for r in runs}
    assert set(by_name) == {"yarn pe=rope seed=0", "ppl_yarn pe=rope seed=0"} | {
        f"{s} pe={pe} seed=0" for s in ("pretrain", "ppl") for pe in ("rope", "pope", "tapa")}   # stage runs, flat
    assert {r.info.status for r in runs} == {"FINISHED"}                 # none left RUNNING
    assert not any("mlflow.parentRunId" in r.data.tags for r in runs)
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


def test_summary_run_and_deep_links(tracked: tuple[str, Path]) -> None:
    """The comparison is visible without knowing MLflow: ``run`` prints a link straight to the
    grid's comparison figure (drawn by phaselab's figure code) on a summary run that also holds
    the table; every perplexity eval carries the same figure; the links resolve on the server."""
    import urllib.request

    from mlflow import MlflowClient

    uri, work = tracked
    out = json.loads((work / "run.json").read_text())["mlflow"]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("quickstart")
    base = f"{uri}/#/experiments/{exp.experiment_id}"
    assert out["experiment"] == f"{base}/runs" and out["serve"] is False
    (summary,) = client.search_runs([exp.experiment_id], filter_string="tags.`phaselab.run_level` = 'grid'")
    figure = "comparison/quickstart_ppl_by_length.png"
    assert out["comparison"] == f"{base}/runs/{summary.info.run_id}/artifacts/{figure}"
    assert summary.info.run_name == "quickstart summary" and summary.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(summary.info.run_id, "comparison")} == {
        figure, "comparison/table.md"}
    assert [a.path for a in client.list_artifacts(summary.info.run_id, "tables")] == ["tables/quickstart_ppl.md"]
    note = summary.data.tags["mlflow.note.content"]
    assert all(name in note for name in ("RoPE", "PoPE", "TAPA")) and "ppl by context length" in note
    with urllib.request.urlopen(f"{uri}/get-artifact?path={figure}&run_uuid={summary.info.run_id}",
                                timeout=30) as resp:
        assert resp.read(8) == b"\x89PNG\r\n\x1a\n"
    _, _, runs = _runs(uri)
    evals = [r for r in runs if r.data.tags.get("phaselab.stage") in ("ppl", "ppl_yarn")]
    assert len(evals) == 4
    for r in evals:
        assert "figures/comparison.png" in {a.path for a in client.list_artifacts(r.info.run_id, "figures")}


def _close_assistant(page: object) -> None:
    """Close MLflow's assistant side panel where it opened (it covers the right of the page)."""
    close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
    page.wait_for_timeout(1000)
    if close.count():
        close.first.click(timeout=5_000)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_comparison_view_in_chromium(tracked: tuple[str, Path], tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    uri, work = tracked
    _, exp_id, runs = _runs(uri)
    evals = [r.info.run_id for r in runs if r.data.tags.get("phaselab.stage") == "ppl"]
    shots = {"comparison": tmp_path / "mlflow_comparison.png", "compare": tmp_path / "mlflow_compare.png",
             "charts": tmp_path / "mlflow_ppl_by_ctx.png"}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        # 0 clicks: the link `phaselab run` printed opens the comparison figure itself
        page.goto(json.loads((work / "run.json").read_text())["mlflow"]["comparison"])
        page.get_by_text("comparison/quickstart_ppl_by_length.png").first.wait_for(timeout=60_000)
        _close_assistant(page)
        page.wait_for_function("Array.from(document.images).some(i => i.src.startsWith('blob:') && i.complete"
                               " && i.naturalWidth > 400)", timeout=30_000)   # the figure itself, drawn
        assert page.get_by_text("Model training").count() > 0 and "quickstart summary" in page.inner_text("body")
        page.screenshot(path=shots["comparison"])
        page.goto(f"{uri}/#/compare-runs?runs={json.dumps(evals)}&experiments={json.dumps([exp_id])}")
        page.get_by_text("ppl pe=tapa seed=0").first.wait_for(timeout=60_000)
        _close_assistant(page)
        text = page.inner_text("body")
        assert all(f"ppl pe={pe} seed=0" in text for pe in ("rope", "pope", "tapa"))   # side by side
        page.screenshot(path=shots["compare"])

        page.goto(f"{uri}/#/experiments/{exp_id}/runs?compareRunsMode=CHART")
        search = page.get_by_placeholder('metrics.rmse < 1 and params.model = "tree"')
        search.wait_for(timeout=60_000)
        search.fill("tags.`phaselab.stage` = 'ppl'")
        search.press("Enter")
        page.get_by_text("3 matching runs").wait_for(timeout=30_000)   # the three evals, nothing nested
        page.get_by_text("ppl pe=tapa seed=0").first.wait_for(timeout=30_000)
        assert page.locator("button[data-component-id*='runnamecellrenderer']").count() == 0   # no expander
        page.get_by_placeholder("Search metric charts").fill("by_ctx")
        page.get_by_text(re.compile(r"^ppl/text/split_valid")).first.wait_for(timeout=30_000)
        page.wait_for_timeout(1500)   # the chart's lines are drawn after its frame
        page.screenshot(path=shots["charts"])
        browser.close()
    assert all(p.stat().st_size > 20_000 for p in shots.values())
    keep(shots)
