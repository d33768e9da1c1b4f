"""Every command of README.md and docs/TUTORIAL.md, run in a fresh project folder, in the order
the documents give them, so the documents cannot rot.

The documents' ```bash blocks are the commands (one per line, ``\\`` continues a line, a
``# comment`` after the command is dropped); a ```yaml block whose first line is
``# file: NAME`` is written to NAME; a ```python block runs with this interpreter. The quickstart
runs for real, with ``phaselab status quickstart --watch`` following it from a second process
(the tutorial's "second terminal"). A command that would run for hours, or that only makes sense
outside a test, has an entry in QUICK saying what runs instead and why; an entry whose command
left the documents fails the test, so the table stays honest.

A command of READ_ONLY writes nothing a later command reads: it runs in a second terminal beside
the commands after it, and every other command waits for the ones in flight, so each command
still sees the project as the documents' order leaves it. The MLflow server, which the documents
leave running, is checked beside the rest of the walk.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/TUTORIAL.md")
BIN = Path(sys.executable).parent
SKIP = None

# The quickstart runs as written (about a minute on 2 cores), and its results table must be the
# README's example output: the numbers there are checked, not only the command.
QUICKSTART = "phaselab run quickstart"
MY_GRID = "phaselab run my_grid.yaml"
# PHASELAB_UPDATE_GOLDEN=1 rewrites the README's example output and docs/results/quickstart_ppl.*
# from this run instead of comparing them
UPDATE = os.environ.get("PHASELAB_UPDATE_GOLDEN") == "1"
README_OUTPUT = re.compile(r"(What `make demo` prints at the end.*?\n```\n)(.*?)(```\n)", re.DOTALL)
# Prefixes of the commands that only read the project (or write a folder of their own that no
# later command reads: the `train` example's, the demo's, and .phaselab/eval, where each `eval`
# of a checkpoint writes its records.json whole).
READ_ONLY = ("phaselab grids", "phaselab plan ", "phaselab --version", "phaselab why ", "phaselab status ",
             "phaselab eval ", "phaselab train docs/examples/", "python -m phaselab.orchestrator.cli.demo")

# command as written -> (what runs instead, why). SKIP: nothing runs.
QUICK: dict[str, tuple[str | None, str]] = {
    "make install": (SKIP, "the environment this test runs in is that install"),
    "make test": (SKIP, "the CPU suite, which runs this test"),
    "make demo": (QUICKSTART, "the Makefile's demo target after the install (checked below)"),
    "phaselab run experiments/pope_jsb.yaml seeds=[0,1,2] train.steps=3000": (
        "phaselab plan experiments/pope_jsb.yaml seeds=[0,1,2] train.steps=3000",
        "six JSB trainings of 3000 steps take hours on a CPU; plan checks the grid and its overrides"),
    "python -m phaselab.orchestrator.cli.demo": ("python -m phaselab.orchestrator.cli.demo --steps 5",
                                          "1200 steps per encoding take ~5 min on 2 cores"),
    "phaselab eval CHECKPOINT --suite ppl-by-length": (
        "phaselab eval CHECKPOINT --suite ppl-by-length ppl.max_tokens=4096",
        "the default lengths on part of the validation split instead of all of it"),
    "phaselab eval CHECKPOINT --suite ppl-by-length ppl.lengths=[1024,4096]": (
        "phaselab eval CHECKPOINT --suite ppl-by-length ppl.lengths=[1024,4096] ppl.max_tokens=4096",
        "one window per length instead of the whole validation split"),
    "phaselab eval CHECKPOINT --suite ppl-by-length ppl.lengths=[8192,65536] extend.rule=yarn "
    "extend.factor=8 extend.original_max_seq_len=8192": (
        ("phaselab eval CHECKPOINT --suite ppl-by-length ppl.lengths=[32,128] extend.rule=yarn "
         "extend.factor=8 extend.original_max_seq_len=16 ppl.max_tokens=1024"),
        "a 65536-token window does not fit a CPU test; the same extension of the quickstart's 16-token model"),
}


def _blocks(doc: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of ``doc``, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", (ROOT / doc).read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)


def _commands(body: str) -> list[str]:
    out, cur = [], ""
    for line in body.splitlines():
        line = re.sub(r"\s{2,}#.*$", "", line).strip() if not line.lstrip().startswith("#") else ""
        cur = f"{cur} {line}".strip() if cur else line
        if cur.endswith("\\"):
            cur = cur[:-1].strip()
            continue
        if cur:
            out.append(" ".join(cur.split()))
        cur = ""
    return out


def steps() -> list[tuple[str, str, str]]:
    """(document, kind, text): kind is ``bash`` (one command), ``file`` (NAME\\nbody) or ``python``."""
    out = []
    for doc in DOCS:
        for lang, body in _blocks(doc):
            if lang == "bash":
                out += [(doc, "bash", c) for c in _commands(body)]
            elif lang == "yaml" and body.startswith("# file: "):
                name, _, rest = body.partition("\n")
                out.append((doc, "file", name.removeprefix("# file: ").strip() + "\n" + rest))
            elif lang == "python":
                out.append((doc, "python", body))
    return out


def test_every_quick_entry_is_still_in_the_documents() -> None:
    written = {text for _, kind, text in steps() if kind == "bash"}
    assert set(QUICK) <= written, sorted(set(QUICK) - written)
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: install\n\t\$\(VENV\)/bin/phaselab run quickstart\n", make, re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Project:
    """A fresh project folder with the repository's grids and examples, and phaselab on PATH."""

    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "experiments").symlink_to(ROOT / "experiments")
        (path / "docs").mkdir()
        (path / "docs" / "examples").symlink_to(ROOT / "docs" / "examples")
        drop = ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PHASELAB_CATALOG_URL", "PHASELAB_RUNS_ROOT",
                "PHASELAB_NOTIFY_CMD", "PHASELAB_NOTIFY_URL")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["COLUMNS"] = "200"   # tables at full width, as in the README
        self.log: list[str] = []
        self._rope_pretrain = ""
        # two side commands at a time: the CI machine has 2 cores
        self._side = ThreadPoolExecutor(max_workers=2)
        self._server = ThreadPoolExecutor(max_workers=1)
        self._in_flight: list[Future] = []

    def serve(self, command: str) -> Future:
        """Start the MLflow check (:func:`_mlflow`) beside the walk."""
        return self._server.submit(_mlflow, self, command)

    def close(self) -> None:
        self._side.shutdown()
        self._server.shutdown()

    def side(self, command: str) -> None:
        """Run a READ_ONLY command in the second terminal; :meth:`join` collects its outcome."""
        self._in_flight.append(self._side.submit(self.sh, command))

    def join(self) -> None:
        """Wait for the commands in flight; a failed one fails the test here."""
        in_flight, self._in_flight = self._in_flight, []
        for future in in_flight:
            future.result()

    def sh(self, command: str, timeout: float = 240.0) -> str:
        t0 = time.monotonic()
        res = subprocess.run(["bash", "-c", command], cwd=self.path, env=self.env, capture_output=True,
                             text=True, timeout=timeout, check=False)
        self.log.append(f"{time.monotonic() - t0:6.1f} s  {command}")
        assert res.returncode == 0, f"`{command}` exited {res.returncode}:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
        return res.stdout

    def rope_pretrain(self) -> str:
        """The RoPE pretrain's hash, from the first ``status --json`` after the quickstart ran."""
        import json

        if not self._rope_pretrain:
            out = json.loads(self.sh("phaselab status quickstart --json"))
            self._rope_pretrain = next(s["hash"] for s in out["stages"]
                                       if s["name"] == "pretrain" and s["axes"]["pe"] == "rope")
        return self._rope_pretrain


def _quickstart_watched(project: Project, command: str) -> str:
    """``command`` (the quickstart run) with ``status --watch`` following it from another process:
    the watcher must see stages running, and end when the grid is done."""
    t0 = time.monotonic()
    run = subprocess.Popen(["bash", "-c", command], cwd=project.path, env=project.env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        watch = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None:
            if not _registered(project.path / ".phaselab" / "catalog.db"):
                time.sleep(0.2)
                continue
            res = subprocess.run(["bash", "-c", "phaselab status quickstart --watch"], cwd=project.path,
                                 env=project.env, capture_output=True, text=True, timeout=300, check=False)
            if res.returncode == 0:
                watch = res.stdout
                break
            time.sleep(1.0)   # not registered in the catalog yet
        out, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    project.log.append(f"{time.monotonic() - t0:6.1f} s  {command}  (watched)")
    assert run.returncode == 0, out[-6000:]
    assert "RUNNING" in watch, watch[-3000:]          # it saw the grid while it ran
    bar = [line for line in watch.rstrip().splitlines() if line.startswith("━")]
    assert bar and "8 succeeded" in bar[-1], watch[-3000:]        # the last frame's grid bar
    assert watch.rstrip().splitlines()[-1].startswith("training steps ")   # then the time breakdown
    return out


def _registered(catalog: Path) -> bool:
    """Whether the run has put its grid and stages in the catalog yet. Read here, not by starting
    the watcher once a second: each start costs a second of the CPU the run needs."""
    try:
        with closing(sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=1)) as conn:
            return bool(conn.execute("SELECT COUNT(*) FROM grid").fetchone()[0]
                        and conn.execute("SELECT COUNT(*) FROM stage").fetchone()[0])
    except sqlite3.Error:   # not created yet, or mid-migration
        return False


def _mlflow(project: Project, command: str) -> None:
    """``phaselab mlflow`` serves until stopped: it must answer HTTP, then stop on Ctrl-C."""
    port = _free_port()
    proc = subprocess.Popen(["bash", "-c", f"exec {command} --port {port}"], cwd=project.path, env=project.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"`{command}` exited {proc.returncode}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, f"`{command}` did not answer on port {port}"
                time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGINT)   # the group this test started: the CLI and its server
        try:   # the CLI's own stop of its server takes up to 20 s (SIGTERM), then SIGKILL: let it
            proc.wait(timeout=50)   # finish, or the server (its own session) would outlive a kill here
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    project.log.append(f"{time.monotonic() - t0:6.1f} s  {command}  (served, then stopped)")


def _pretrains(grid: str | Path, pe: set[str] | None = None) -> dict[str, str]:
    """cell -> pretrain stage hash of ``grid`` as planned (no catalog, no Ray)."""
    from phaselab.orchestrator.plan.dag import plan_grid

    nodes = plan_grid(grid).nodes.items()
    return {n.members[0][0]: h for h, n in nodes
            if n.kind == "pretrain" and (pe is None or n.config["model"]["pe"]["kind"] in pe)}


def _run(project: Project, command: str, state: dict) -> None:
    """One command of the walk, in the documents' order (see the module docstring)."""
    if command == "phaselab mlflow":
        if "mlflow" not in state:   # the README's and the tutorial's are the same server
            state["mlflow"] = project.serve(command)
        return
    if command.startswith(READ_ONLY):
        project.side(command)
        return
    project.join()
    if command == QUICKSTART and not state["ran_quickstart"]:
        out = _quickstart_watched(project, command)
        assert "{'SUCCEEDED': 8}" in out and "launched 8 stage(s)" in out
        _check_readme_output(out)
        state["ran_quickstart"] = True
        return
    out = project.sh(command)
    if command == QUICKSTART:   # the second time: all cache hits
        assert "launched 0 stage(s)" in out, out[-3000:]
    if command == MY_GRID:   # the tutorial: its pretrains are the quickstart's
        assert "launched 2 stage(s)" in out, out[-3000:]


def table_rows(text: str) -> dict[tuple[str, str], list[float]]:
    """(cell, stage) -> the numbers of that row, for every row of a results table in ``text``."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\s*│\s*(pe=\w+,seed=\d+)\s*│\s*(\w+)\s*│(.*)$", line)
        if m:
            rows[(m[1], m[2])] = [float(x) for x in re.findall(r"\d+\.\d+|\d+", m[3])]
    return rows


def markdown_rows(text: str) -> dict[tuple[str, ...], list[float]]:
    """(row labels) -> numbers of every row of a markdown table in ``text``."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 2 and not cells[0].startswith(("---", "PE")):
            rows[tuple(cells[:2])] = [float(c) for c in cells[2:] if re.fullmatch(r"\d+(\.\d+)?", c)]
    return rows


# TAPA's rows depend on the CPU (README.md, after the example output): at one commit its ppl@128
# was 12.08 on one x86 machine and 11.81 on another, its accuracy 0.3428 and 0.3467, where RoPE's
# and PoPE's rows agreed to the last digit; they are held to 3 %, the others to 1 %
TAPA_REL, REL = 3e-2, 1e-2


def _same(got: dict, want: dict, what: str) -> None:
    assert got and set(want) <= set(got), f"{what}: rows {sorted(want)} not all in {sorted(got)}"
    for key, values in want.items():
        rel = TAPA_REL if any(k in ("TAPA", "pe=tapa,seed=0") for k in key) else REL
        assert got[key] == pytest.approx(values, rel=rel), \
            f"{what} is stale: {key} is {got[key]} now, {values} there; rerun with PHASELAB_UPDATE_GOLDEN=1"


def _check_readme_output(out: str) -> None:
    """The README's example output is this run's results table (numbers within 1 %, TAPA's 3 %)."""
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    block = README_OUTPUT.search(text)
    assert block, "README.md: no example output after 'What `make demo` prints at the end'"
    table = out[out.rindex("results from the catalog"):]
    if UPDATE:
        lines = [ln.rstrip() for ln in table.splitlines() if ln.lstrip().startswith(("┃", "│"))]
        readme.write_text(text[:block.start(2)] + "\n".join(lines) + "\n" + text[block.end(2):], encoding="utf-8")
        return
    _same(table_rows(table), table_rows(block[2]), "README.md's example output")


def _check_results(project: Project) -> None:
    """``phaselab tables quickstart_ppl --out results/`` gives docs/results/quickstart_ppl.*."""
    made, kept = project.path / "results", ROOT / "docs" / "results"
    if UPDATE:
        for ext in ("md", "png"):
            (kept / f"quickstart_ppl.{ext}").write_bytes((made / f"quickstart_ppl.{ext}").read_bytes())
        return
    _same(markdown_rows((made / "quickstart_ppl.md").read_text()),
          markdown_rows((kept / "quickstart_ppl.md").read_text()), "docs/results/quickstart_ppl.md")


def _walk(project: Project) -> set[str]:
    """Every step of the documents; returns the commands that ran."""
    state: dict = {"ran_quickstart": False}
    done: set[str] = set()
    for _doc, kind, text in steps():
        if kind == "file":
            project.join()
            name, _, body = text.partition("\n")
            (project.path / name).write_text(body)
            continue
        if kind == "python":
            project.join()
            project.sh(f"{sys.executable} - <<'PY'\n{text}PY")
            continue
        command, _why = QUICK.get(text, (text, ""))
        if command is None:
            continue
        if "CHECKPOINT" in command or "<stage-hash>" in command:
            project.join()   # the hash comes from the catalog as the commands before left it
            command = command.replace("CHECKPOINT", f".phaselab/runs/{project.rope_pretrain()}")
            command = command.replace("<stage-hash>", project.rope_pretrain()[:12])
        if command in done and command.split()[:2] != ["phaselab", "run"]:
            continue   # a read-only command both documents give: it would show the same again
        _run(project, command, state)
        done.add(command)
    project.join()
    if "mlflow" in state:
        state["mlflow"].result()
    assert state["ran_quickstart"]
    _check_results(project)
    return done


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_and_tutorial_commands_run(tmp_path: Path) -> None:
    project = Project(tmp_path)
    try:
        done = _walk(project)
    finally:
        project.close()
    assert MY_GRID in done
    # the tutorial's claim for the grids as written, without the overrides that shrink them
    assert _pretrains(tmp_path / "my_grid.yaml") == _pretrains("quickstart", pe={"rope", "pope"})
    print("\n".join(project.log))
