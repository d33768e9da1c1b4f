"""The documents name only paths that exist: every repository path in the checked documents must
be a file or folder of this checkout, and no document points outside the repository.

A candidate path is a token that ends in a file extension (`spec.py`, `docs/MATH.md`) or starts
with a top-level entry of the repository (`kernels/attention/`). It must exist relative to the
repository root, relative to the document's folder, or as the tail of a path in the checkout
(`stages/base.py` for `orchestrator/stages/base.py`). Tokens with placeholders (`<id>`, `{a,b}`,
`*`, `$OUT`), absolute paths, URLs and upstream files written `owner/repo:path` are not paths of
the repository. RUNTIME lists what a run
creates (it is named by the documents but is not in a checkout).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["docs/DESIGN.md", "docs/CONTRACTS.md", "README.md", "CONTRIBUTING.md", "kernels/attention/README.md",
           "docs/GRID_REFERENCE.md",
           "docs/TUTORIAL.md", "docs/CLUSTER.md", "deploy/gpu/README.md"]
NO_OUTSIDE = CHECKED + ["docs/EXPERIMENTS.md", "docs/MATH.md", "docs/STACK.md", "benchmarks/README.md"]
# outputs created at run time (or by `make install`), named by the documents
RUNTIME = (".phaselab", "runs", "mlruns", ".venv", ".whl", "out", "benchmarks/results/scaling-h200",
           "benchmarks/results/small-models-h200", "metrics.jsonl", "metrics.replayed.json", "model.pt",
           "outputs.json", "meta.json",   # an MLflow run artifact; a prepared shard folder's metadata
           "provenance.json", "stage.yaml",   # what a stage run writes in its folder
           "grid.yaml", "my_grid.yaml", "tune_grid.yaml")   # grids the tutorial and cluster guide have a user write
EXTENSIONS = ("py", "md", "yaml", "yml", "toml", "txt", "sh", "json", "jsonl", "cfg", "ini", "csv", "png",
              "ipynb", "lock", "mako", "db", "parquet", "pt")
SKIP_DIRS = {".git", ".venv", "__pycache__", ".ruff_cache", ".pytest_cache", "node_modules", ".phaselab"}

TOKEN = re.compile(r"(?<![\w./$~:-])(?:\.\./|\./)?[A-Za-z0-9_][\w.-]*(?:/[\w.-]+)*/?")


def _tree() -> tuple[set[str], set[str]]:
    """(relative paths of every file and folder in the checkout, top-level names)."""
    paths: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        rel = Path(dirpath).relative_to(ROOT).as_posix()
        if rel != ".":
            paths.add(rel)
        paths.update((Path(rel) / f).as_posix() if rel != "." else f for f in filenames)
    top = {p for p in paths if "/" not in p}
    return paths, top


PATHS, TOP = _tree()


def candidates(text: str) -> list[str]:
    """Repository-path tokens of a document (see the module docstring)."""
    out = []
    for match in TOKEN.finditer(text):
        token = match.group(0).rstrip(".")
        after = text[match.end():match.end() + 1]
        if after in "<{*=(" and after != "" or "://" in text[match.start():match.end() + 3]:
            continue  # a placeholder, a call, an assignment or a URL
        if token.startswith("../"):
            out.append(token)
            continue
        first = token.lstrip("./").split("/")[0]
        ext = token.rsplit(".", 1)[-1] if "." in token.split("/")[-1] else ""
        if ("/" in token and first in TOP) or (ext in EXTENSIONS and not token.replace(".", "").isdigit()):
            out.append(token)
    return out


def exists(token: str, doc: Path) -> bool:
    path = token.lstrip("./").rstrip("/") if token.startswith("./") else token.rstrip("/")
    if any(path == r or path.startswith(r + "/") for r in RUNTIME):
        return True
    if path in PATHS or (doc.parent / path).resolve().exists() and ROOT in (doc.parent / path).resolve().parents:
        return True
    return any(p.endswith("/" + path) for p in PATHS)


@pytest.mark.parametrize("name", CHECKED)
def test_every_path_a_document_names_exists(name):
    doc = ROOT / name
    missing = sorted({t for t in candidates(doc.read_text()) if not t.startswith("../") and not exists(t, doc)})
    assert not missing, f"{name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("name", NO_OUTSIDE)
def test_no_document_points_outside_the_repository(name):
    text = (ROOT / name).read_text()
    outside = sorted(set(re.findall(r"\.\./[\w./-]+", text)))
    assert not outside, f"{name} names paths outside the repository: {outside}"


def test_the_checker_finds_missing_and_outside_paths():
    text = ("see `kernels/rotary/triton.py`, docs/MATH.md, ../shared/x, tokens/s, 1/sqrt(D), runs/<id>/a.json, "
            "`karpathy/nanoGPT:model.py`")
    found = candidates(text)
    assert "kernels/rotary/triton.py" in found and "docs/MATH.md" in found and "../shared/x" in found
    assert "tokens/s" not in found and not any("sqrt" in t or "runs" in t or "model.py" in t for t in found)
    assert not exists("kernels/rotary/triton.py", ROOT / "docs/DESIGN.md")
    assert exists("docs/MATH.md", ROOT / "docs/DESIGN.md") and exists("stages/base.py", ROOT / "README.md")
