"""Per-stage code digests from the static import closure (DESIGN §5.4): a change to code a stage
cannot import leaves its key alone; a change to code it runs changes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _orchestrator_grids import BASE

from phaselab.orchestrator.plan.closure import closure, references
from phaselab.orchestrator.plan.dag import build_dag, load_grid
from phaselab.orchestrator.plan.hashing import CODE_PACKAGES, code_index, package_root


@pytest.fixture
def code_copy(tmp_path: Path) -> dict[str, Path]:
    """A private copy of the workloads and kernels sources (edited by the tests)."""
    roots = {}
    for pkg in CODE_PACKAGES:
        roots[pkg] = tmp_path / pkg.split(".")[-1]
        shutil.copytree(package_root(pkg), roots[pkg], ignore=shutil.ignore_patterns("__pycache__", "assets"))
    return roots


def _keys(tmp_path: Path, roots: dict[str, Path]) -> dict[str, str]:
    path = tmp_path / "g.yaml"
    path.write_text(BASE)
    spec, marks, _, _ = load_grid(path)
    dag = build_dag(spec, marks, code=code_index(roots=roots))
    return {f"{n.name}[{n.members[0][0]}]": h for h, n in dag.nodes.items()}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_plotting_edit_keeps_pretrain_keys_and_model_edit_changes_them(tmp_path: Path,
                                                                       code_copy: dict[str, Path]) -> None:
    before = _keys(tmp_path, code_copy)
    assert len(before) == 4
    _edit(code_copy["phaselab.workloads"] / "evals" / "plots.py", "def niah_heatmap(",
          "def _unused_helper():\n    return 1\n\n\ndef niah_heatmap(")
    after_plot = _keys(tmp_path, code_copy)
    for name in ("pretrain[pe=pope,seed=0]", "pretrain[pe=rope,seed=0]"):
        assert after_plot[name] == before[name]
    for name in ("ppl[pe=pope,seed=0]", "ppl[pe=rope,seed=0]"):   # the eval draws the plots
        assert after_plot[name] != before[name]

    _edit(code_copy["phaselab.workloads"] / "models" / "transformer.py", "def forward(",
          "def _unused_helper(self):\n        return 1\n\n    def forward(")
    after_model = _keys(tmp_path, code_copy)
    assert set(after_model.values()).isdisjoint(after_plot.values())   # every stage runs the model


def test_why_names_the_changed_module(tmp_path: Path, code_copy: dict[str, Path]) -> None:
    index = code_index(roots=code_copy)
    before = index.for_kind("pretrain")
    _edit(code_copy["phaselab.kernels"] / "attention" / "reference.py", "def attention(",
          "def _unused_helper():\n    return 1\n\n\ndef attention(")
    after = code_index(roots=code_copy).for_kind("pretrain")
    changed = [m for m in after.modules if after.modules[m] != before.modules.get(m)]
    assert changed == ["phaselab.kernels.attention.reference"]
    assert "phaselab.workloads.evals.plots" not in after.modules
    assert "phaselab.workloads.train.loop" in after.modules
    # the eval stage reaches the evaluation code, not the training loop
    ev = index.for_kind("eval").modules
    assert "phaselab.workloads.evals.perplexity" in ev and "phaselab.workloads.train.loop" not in ev


def test_references_follow_lazy_imports_registry_strings_and_fstring_prefixes() -> None:
    known = {"p.a", "p.a.b", "p.a.c", "p.d", "p.e", "phaselab.x", "phaselab.x.y", "phaselab.x.z"}
    src = '''"""Docstring naming phaselab.x.z is prose, not a reference."""
from . import b
from .c import thing


def f():
    import p.d
    return {"k": "phaselab.x.y:Class"}, f"phaselab.x.{name}"
'''
    refs = references(src, "p.a", is_package=True, known=known)
    assert refs == {"p.a.b", "p.a.c", "p.d", "phaselab.x", "phaselab.x.y", "phaselab.x.z"}
    assert references('"""phaselab.x.z"""\nX = "see phaselab.x.y"\n', "p.e", is_package=False, known=known) == set()
    graph = {"p": frozenset(), "p.a": frozenset({"p.d"}), "p.d": frozenset(), "p.e": frozenset({"p.a"})}
    assert closure(["p.e"], graph) == {"p", "p.a", "p.d", "p.e"}      # parents run on import
    assert closure(["p.d"], graph) == {"p", "p.d"}


def test_one_walk_gives_the_references_and_hash_of_separate_walks(code_copy):
    """code_index reads each source once (closure.scan): its graph and hashes are what
    `references` and `ast_hash` give the same text, docstrings in nested defs, a non-string first
    statement and a docstring that names a module included."""
    import ast

    from phaselab.orchestrator.plan import closure as closure_module
    from phaselab.orchestrator.plan.hashing import _tree_hash, ast_hash

    source = ('"""phaselab.workloads.train.loop in prose"""\nimport phaselab.workloads.data\n'
              'def f():\n    "phaselab.workloads.models"\n    class C:\n        """doc"""\n        x = 1\n'
              'def g():\n    0\n    return "phaselab.workloads.train.spec"\n')
    known = {"phaselab.workloads.data", "phaselab.workloads.models", "phaselab.workloads.train.loop",
             "phaselab.workloads.train.spec"}
    refs, holders = closure_module.scan(ast.parse(source), "phaselab.m", is_package=False, known=known)
    assert refs == references(source, "phaselab.m", is_package=False, known=known) \
        == {"phaselab.workloads.data", "phaselab.workloads.train.spec"}
    assert len(holders) == 3   # the module, f and C; g opens with a number
    tree = ast.parse(source)
    assert _tree_hash(tree, closure_module.scan(tree, "phaselab.m", is_package=False, known=known)[1]) \
        == ast_hash(source) != ast_hash(source.replace('"""doc"""', '"""other"""') + "y = 2\n")
    index = code_index(CODE_PACKAGES, code_copy)
    for name, path in closure_module.module_files("phaselab.workloads", code_copy["phaselab.workloads"]).items():
        text = path.read_text(encoding="utf-8")
        assert index.hashes[name] == ast_hash(text, str(path)), name
        assert index.graph[name] == references(text, name, is_package=path.name == "__init__.py",
                                               known=set(index.hashes)), name
