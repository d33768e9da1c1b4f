"""``phaselab run --dashboard`` through the real CLI: the printed URL, Ray 2.60's token check as a
browser and a script meet it, Ray Train runs named by grid, stage and cell, and a clear error
when the dashboard's packages are missing.

The Ray test runs a one-stage grid whose pretrain goes through Ray Train (one CPU worker) and
talks to the dashboard while it runs. The browser test (skipped without ``/usr/bin/chromium`` and
playwright) signs in through the page's token prompt during a quickstart run and screenshots the
jobs and tasks views; with ``PHASELAB_UPDATE_SCREENSHOTS=1`` they replace
``docs/images/ray_dashboard_*.png``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _quickstart import TINY
from _screenshots import keep

CHROMIUM = Path("/usr/bin/chromium")
URL_LINE = re.compile(r"^Ray dashboard: (http://127\.0\.0\.1:\d+)$")

GRID = """\
grid: dashgrid
seeds: [0]
axes:
  product:
    pe: [rope]
defaults:
  model: {preset: tiny, block_size: 32, pe: {kind: "${pe}"}}
  data: {kind: text, block_size: 32}
  train: {steps: 3000, batch_size: 2, lr: 1.0e-3, warmup: 1, eval_every: 0, final_eval_batches: 1,
          ckpt_every: 1000, device: cpu}
  resources: {cpus: 1, memory_gb: 2, num_workers: 1}
  launcher: ray_train
stages:
  pretrain:
    kind: pretrain
"""


class Cli:
    """``phaselab run ... --dashboard`` in a subprocess, its stdout collected by a thread."""

    def __init__(self, args: list[str], work: Path, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "phaselab.orchestrator.cli.main", "run", *args],
                                     cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def url(self, timeout_s: float = 90.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if m := URL_LINE.match(line.strip()):
                    return m.group(1)
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n" + "\n".join(self.lines)
            time.sleep(0.2)
        raise AssertionError("no dashboard URL printed:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
    # a token of this test's own, created by phaselab (0600), so the run never reads or
    # writes the user's ~/.ray/auth_token
    return env | {"RAY_AUTH_TOKEN_PATH": str(tmp / "ray_token"), "COLUMNS": "200"}


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, str, object]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), err.headers


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Cli, str, str]]:
    (tmp_path / "dash.yaml").write_text(GRID)
    cli = Cli(["dash.yaml", "--dashboard", "--no-mlflow", "--num-cpus", "2",
               "--catalog", f"sqlite:///{tmp_path / 'catalog.db'}", "--runs-root", str(tmp_path / "runs")],
              tmp_path, _env(tmp_path))
    try:
        url = cli.url()
        yield cli, url, (tmp_path / "ray_token").read_text().strip()
    finally:
        cli.stop()


@pytest.mark.ray
def test_printed_url_signs_in_with_the_token_and_names_train_runs(running: tuple[Cli, str, str],
                                                                   tmp_path: Path) -> None:
    cli, url, token = running
    out = "\n".join(cli.lines)
    assert token not in out   # the token never reaches stdout (CI logs)
    assert f"paste the contents of RAY_AUTH_TOKEN_PATH={tmp_path / 'ray_token'}" in out
    assert (tmp_path / "ray_token").stat().st_mode & 0o077 == 0
    assert _get(f"{url}/")[0] == 200                                       # the page, which asks
    assert _get(f"{url}/api/version")[0] == 401                            # nothing without a token
    assert _get(f"{url}/api/version", {"Authorization": "Bearer " + "0" * 64})[0] == 403
    status, body, _ = _get(f"{url}/api/version", {"Authorization": f"Bearer {token}"})
    assert status == 200 and json.loads(body)["ray_version"] == "2.60.0"
    # the browser's way: the prompt POSTs the token once and keeps the cookie it gets back
    status, _, headers = _get(f"{url}/api/authenticate", {"Authorization": f"Bearer {token}"}, "POST")
    cookie = headers.get("Set-Cookie", "")
    assert status == 200 and cookie.startswith(f"ray-authentication-token={token};") and "HttpOnly" in cookie
    assert _get(f"{url}/api/version", {"Cookie": f"ray-authentication-token={token}"})[0] == 200

    auth = {"Authorization": f"Bearer {token}"}
    runs: list = []
    status, body = None, ""
    deadline = time.monotonic() + 90
    while not runs and time.monotonic() < deadline:
        try:
            status, body, _ = _get(f"{url}/api/train/v2/runs/v1", auth)
        except TimeoutError:   # a dashboard busy with the run's start on 2 cores answers late: ask again
            continue
        runs = json.loads(body).get("train_runs", []) if status == 200 else []
        time.sleep(0.5)
    assert len(runs) == 1, (status, body, "\n".join(cli.lines))
    name = runs[0]["name"]
    assert re.fullmatch(r"dashgrid:pretrain\[pe=rope,seed=0\]:[0-9a-f]{12}", name), name
    # the run's folder (resume, gc) is still the content hash the name ends with
    folders = [p.name for p in (tmp_path / "runs" / "ray_train").iterdir()]
    assert len(folders) == 1 and len(folders[0]) == 64 and folders[0].startswith(name[-12:]), folders
    status, body, _ = _get(f"{url}/api/v0/tasks?detail=1&limit=100", auth)
    tasks = {t["name"] for t in json.loads(body)["data"]["result"]["result"]}
    assert f"{name}" in tasks, tasks   # the stage's task and its Train run read the same


def test_dashboard_without_its_packages_fails_clearly(tmp_path: Path) -> None:
    # ``aiohttp`` made unimportable in the CLI's own process, as in a plain `pip install ray`
    code = ("import runpy, sys; sys.modules['aiohttp'] = None; "
            "sys.argv = ['phaselab', 'run', 'quickstart', '--dashboard', '--no-mlflow', "
            f"'--catalog', 'sqlite:///{tmp_path / 'c.db'}']; "
            "runpy.run_module('phaselab.orchestrator.cli.main', run_name='__main__')")
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=_env(tmp_path) | {"COLUMNS": "400"})
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 1, text
    assert "--dashboard needs the Ray dashboard's packages (ray[default])" in text, text
    assert "aiohttp" in text and "pip install -c constraints.txt 'ray[default]'" in text, text
    assert not (tmp_path / "c.db").exists()   # refused before planning or any cluster
    assert time.monotonic() - start < 60


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_dashboard_jobs_and_tasks_views_in_chromium(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    cli = Cli(["quickstart", *TINY, "defaults.train.steps=400", "--dashboard", "--no-mlflow", "--num-cpus", "2",
               "--catalog", f"sqlite:///{tmp_path / 'catalog.db'}", "--runs-root", str(tmp_path / "runs")],
              tmp_path, _env(tmp_path))
    shots = {"jobs": tmp_path / "ray_dashboard_jobs.png", "tasks": tmp_path / "ray_dashboard_tasks.png"}
    try:
        url = cli.url()
        token = (tmp_path / "ray_token").read_text().strip()
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{url}/#/jobs")
            # the page's sign-in prompt, as a user meets it; its cookie then serves every view
            page.get_by_placeholder("Enter your authentication token").fill(token, timeout=60_000)
            page.get_by_role("button", name="Submit").click()
            job = _driver_job(url, token)
            page.get_by_text(job).first.wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=shots["jobs"])
            page.goto(f"{url}/#/jobs/{job}")
            page.get_by_text("Task Table").click(timeout=60_000)
            named = page.get_by_text(re.compile(r"quickstart:pretrain\[pe=\w+,seed=0\]:[0-9a-f]{12}")).first
            named.wait_for(timeout=90_000)
            page.wait_for_timeout(1500)
            page.mouse.wheel(0, 5000)   # down to the task table's rows
            page.wait_for_timeout(500)
            page.screenshot(path=shots["tasks"])
            # 2 CPUs: two of the three pretrains run at once, each named by its cell
            cells = set(re.findall(r"quickstart:pretrain\[pe=(\w+),seed=0\]:[0-9a-f]{12}", page.inner_text("body")))
            assert len(cells) >= 2 and cells <= {"rope", "pope", "tapa"}, cells
            browser.close()
    finally:
        cli.stop()
    assert all(p.stat().st_size > 20_000 for p in shots.values())
    keep(shots)


def _driver_job(url: str, token: str) -> str:
    """The id of the CLI's driver job (the tasks view of a job lists its tasks by name)."""
    status, body, _ = _get(f"{url}/api/jobs/", {"Authorization": f"Bearer {token}"})
    jobs = [j for j in json.loads(body) if j.get("type") == "DRIVER"]
    assert status == 200 and len(jobs) == 1, body
    return jobs[0]["job_id"]
