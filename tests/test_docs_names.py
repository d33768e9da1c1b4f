"""The documents name only code that exists: every dotted name of ours in backticks resolves.

`tests/test_docs_paths.py` checks the paths a document names; this test checks the modules,
classes, functions and methods. A backticked token is checked when it is ours:

- ``phaselab.a.b[.Name[.attr]]``: the longest prefix must be a module of the package and the rest
  names defined in it (a top-level def, class, assignment or import; then a member of that class);
- ``a.b.Name`` or ``module.Name`` whose leading part is the tail of one of our module names
  (``workloads.train.api``, ``config.TrainConfig``): the name must be defined in one of the modules
  with that tail;
- ``Class.member`` where ``Class`` is a class defined in our code: the member must be defined in
  one of the classes of that name (its body or a dataclass field).

Everything else is not checked here: config keys (a token whose first part is a section of
the grid or model config, ``train.steps``), MLflow tags (``phaselab.git.dirty``), file names
(``reference.py``, checked by the paths test) and other libraries' names. Sources are read with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
import re
from functools import cache, lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["docs/DESIGN.md", "docs/CONTRACTS.md", "README.md", "CONTRIBUTING.md", "docs/TUTORIAL.md",
           "docs/CLUSTER.md", "kernels/attention/README.md", "benchmarks/README.md"]
PACKAGES = {"kernels": "phaselab.kernels", "catalog": "phaselab.catalog", "workloads": "phaselab.workloads",
            "orchestrator": "phaselab.orchestrator", "phaselab": "phaselab"}
# first parts of config keys (grid sections, model/train config fields) and of MLflow tag names
CONFIG_KEYS = {"train", "data", "model", "eval", "stages", "resources", "extend", "defaults", "ppl",
               "niah", "attention", "axes", "axis", "pe", "cfg", "engine", "mlflow", "attn"}
TAGS = {"phaselab.stage_hash", "phaselab.git.dirty"}
FILE_SUFFIX = re.compile(r"\.(py|md|ya?ml|toml|txt|json|jsonl|sh|png|pt|csv|ini|cfg|db|parquet|mako|log)$")
TOKEN = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    out: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines (defs, classes, assignments, imports)."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If | ast.Try):   # guarded definitions (optional imports)
            out.update(_names(node.body))
            for handler in getattr(node, "handlers", []):
                out.update(_names(handler.body))
            out.update(_names(node.orelse))
    return out


@cache
def module_names(module: str) -> dict[str, ast.AST]:
    return _names(ast.parse(modules()[module].read_text()).body)


@lru_cache(maxsize=1)
def classes() -> dict[str, list[ast.ClassDef]]:
    out: dict[str, list[ast.ClassDef]] = {}
    for module in modules():
        for node in module_names(module).values():
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


def _resolves(module: str, attrs: list[str]) -> bool:
    node = module_names(module).get(attrs[0])
    if node is None:
        return False
    if len(attrs) == 1 or not isinstance(node, ast.ClassDef):
        return len(attrs) == 1 or isinstance(node, ast.Import | ast.ImportFrom)
    return attrs[1] in _names(node.body)


def problem(token: str) -> str | None:
    """Why ``token`` does not resolve, or None when it does or is not ours."""
    if token in TAGS or FILE_SUFFIX.search(token) or token.split(".")[0] in CONFIG_KEYS:
        return None
    parts = token.split(".")
    mods = modules()
    if parts[0] == "phaselab":
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module in mods:
                rest = parts[cut:]
                if not rest or _resolves(module, rest):
                    return None
                return f"{'.'.join(rest)} is not defined in {module}"
        return "no such module"
    for cut in range(len(parts), 0, -1):
        tail = "." + ".".join(parts[:cut])
        owners = [m for m in mods if m.endswith(tail)]
        if owners:
            if cut == len(parts) or any(_resolves(m, parts[cut:]) for m in owners):
                return None
            return f"{'.'.join(parts[cut:])} is defined in none of {sorted(owners)}"
    if parts[0] in classes() and len(parts) == 2:
        if any(parts[1] in _names(c.body) for c in classes()[parts[0]]):
            return None
        return f"class {parts[0]} has no member {parts[1]}"
    return None


def test_the_resolver_finds_real_names_and_refuses_invented_ones() -> None:
    assert problem("phaselab.kernels.registry") is None
    assert problem("phaselab.catalog.tracking.Tracker") is None
    assert problem("workloads.train.api") is None
    assert problem("phaselab.kernels.registry.no_such_function") is not None
    assert problem("phaselab.orchestrator.no_such_module") is not None
    assert problem("registry.no_such_function") is not None
    assert problem("train.steps") is None   # a config key, not ours to check
    assert problem("spec.py") is None        # a file: tests/test_docs_paths.py checks it


@pytest.mark.parametrize("doc", CHECKED)
def test_documents_name_only_code_that_exists(doc: str) -> None:
    text = (ROOT / doc).read_text()
    bad = []
    for match in TOKEN.finditer(text):
        why = problem(match.group(1))
        if why:
            line = text.count("\n", 0, match.start()) + 1
            bad.append(f"{doc}:{line}: `{match.group(1)}`: {why}")
    assert not bad, "\n".join(bad)
