"""No import cycles among phaselab's modules, read statically from the source tree.

Every ``import`` and ``from ... import`` of every .py file under the package folders counts,
including those inside functions (a function-level import that closes a cycle only hides it);
imports under ``if TYPE_CHECKING:`` do not (they never run). Relative imports are resolved
against the importing module; ``from package import name`` counts as an import of
``package.name`` when that is a module, else of ``package``. A package's ``__init__`` is the
package's own module. Cycles are found as the strongly connected components of the graph.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it installs as (pyproject.toml's package-dir)
FOLDERS = {"phaselab": "phaselab", "kernels": "phaselab.kernels", "catalog": "phaselab.catalog",
           "workloads": "phaselab.workloads", "orchestrator": "phaselab.orchestrator"}
# Cycles tolerated, each as the sorted tuple of its modules: none. The mechanism stays so that a
# listed cycle that no longer exists fails too (the list can only shrink; a new cycle always fails).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def module_files() -> dict[str, Path]:
    """module name -> source file, for every .py file under the package folders."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            out[".".join([package, *(p for p in parts if p != "__init__")])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (their else runs)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                yield other
                yield from _nodes(other)
            continue
        yield node
        yield from _nodes(node)


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The phaselab modules ``module`` (source at ``path``) imports, resolved to known modules."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in _nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:   # `import phaselab.x.y.Class` -> its module
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    modules = set(files)
    return {m: imports_of(m, p, modules) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path through ``component`` (for the message): a -> b -> ... -> a."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def test_the_graph_sees_relative_function_level_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
                              "def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("import pkg.a\n")
    (pkg / "c.py").write_text("from pkg.a import f\n")
    modules = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    graph = {m: imports_of(m, pkg / f"{m.split('.')[1]}.py", modules) for m in ("pkg.a", "pkg.b", "pkg.c")}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert cycle_path(graph, ["pkg.a", "pkg.b"]) == ["pkg.a", "pkg.b", "pkg.a"]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 100 and "phaselab.workloads.train.session" in graph
    found = {tuple(c) for c in cycles(graph)}
    new = sorted(found - KNOWN_CYCLES)
    gone = sorted(KNOWN_CYCLES - found)
    assert not new, "import cycles:\n" + "\n".join(" -> ".join(cycle_path(graph, list(c))) for c in new)
    assert not gone, f"these KNOWN_CYCLES are broken now; remove them from the list: {gone}"
