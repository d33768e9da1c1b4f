"""Static import graph of phaselab's code packages, for per-stage code digests (DESIGN §5.4).

A stage's cache key depends on the code it can reach, not on every module: the modules its
stage class's module imports, and everything those import in turn. Found by reading the sources
with :mod:`ast`, never by importing them (planning stays torch-free). Counted as a reference:

- ``import a.b`` / ``from a.b import c`` (at any depth of the file, so lazy imports inside
  functions count), relative imports included; ``from a import b`` adds the module ``a.b`` when
  it exists; importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so those count;
- a string constant that is a module name, such as a registry's lazy ``"package.module:Class"``;
  an f-string whose constant head ends in a dot (``f"phaselab.workloads.models.{name}"``) counts
  as every module under that package, since the name is only known at run time.

Over-approximation is the safe side: an extra module can only cause a needless re-run, a missed
one a stale cache hit (flyteorg/flyte#2899).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

_LAZY_NAME = re.compile(r"phaselab(?:\.\w+)+(?::\w+)?")   # "pkg.module" or "pkg.module:Class"
_PREFIX = re.compile(r"phaselab(?:\.\w+)+\.")              # the constant head of an f-string


def module_files(package: str, root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``*.py`` under ``root`` (the folder of ``package``)."""
    out: dict[str, Path] = {}
    for path in sorted(Path(root).rglob("*.py")):
        parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
        out[".".join([package, *parts])] = path
    return out


def _base(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative import ``from <level dots><target> import ...``."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, *([target] if target else [])])


def _string_refs(node: ast.AST, known: set[str]) -> set[str]:
    """Modules a string names: a whole string that is a module name (prose such as docstrings
    never is), or an f-string whose constant head is a package prefix."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _LAZY_NAME.fullmatch(node.value):
        return {node.value.split(":")[0]}
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        head = str(node.values[0].value)
        if _PREFIX.fullmatch(head):
            return {m for m in known if m.startswith(head)} | {head[:-1]}
    return set()


def references(source: str, module: str, *, is_package: bool, known: Iterable[str]) -> set[str]:
    """Names in ``known`` that the source of ``module`` imports or names (module docstring)."""
    return scan(ast.parse(source), module, is_package=is_package, known=known)[0]


def leading_constant(node: ast.AST) -> ast.Constant | None:
    """The constant a module's, class's or function's body opens with (its docstring where a
    string), else None."""
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
        return node.body[0].value
    return None


def scan(tree: ast.Module, module: str, *, is_package: bool, known: Iterable[str]) -> tuple[set[str], list[ast.AST]]:
    """(:func:`references` of ``tree``, the nodes whose body opens with a docstring), in one walk:
    a node's docstring is found when the node is, before the walk reaches the string."""
    known = set(known)
    found: set[str] = set()
    docstrings: set[int] = set()
    holders: list[ast.AST] = []
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        lead = leading_constant(node)
        if lead is not None:
            docstrings.add(id(lead))
            if isinstance(lead.value, str):
                holders.append(node)
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or "" if node.level == 0 else _base(module, is_package, node.level, node.module)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        else:
            found.update(_string_refs(node, known))
    out: set[str] = set()
    for name in found:
        while name and name not in known:   # "pkg.mod.Class" -> "pkg.mod"
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out, holders


def import_graph(files: Mapping[str, Path]) -> dict[str, frozenset[str]]:
    """``{module: modules it references}`` over ``files`` (see :func:`references`)."""
    known = set(files)
    return {name: frozenset(references(path.read_text(encoding="utf-8"), name,
                                       is_package=path.name == "__init__.py", known=known))
            for name, path in files.items()}


def closure(entries: Iterable[str], graph: Mapping[str, Iterable[str]]) -> set[str]:
    """Every module of ``graph`` reachable from ``entries``, with the parent packages each
    import runs (``entries`` themselves included when they are in the graph)."""
    seen: set[str] = set()
    todo = [e for e in entries if e in graph]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parent = name.rpartition(".")[0]
        todo.extend(m for m in (*graph[name], parent) if m in graph and m not in seen)
    return seen


def plugin_files(module: str) -> dict[str, Path]:
    """The sources an out-of-package module (an encoding plugin) can reach: the ``*.py`` of its
    top-level package (or the module alone, for a single file on PYTHONPATH), restricted to its
    import closure. Found with ``find_spec`` (which imports only its parent packages); a module
    without a source file is a ValueError."""
    import importlib.util

    top = module.partition(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ValueError(f"plugin module {module!r} is not importable")
    if spec.submodule_search_locations:
        files = module_files(top, Path(next(iter(spec.submodule_search_locations))))
    elif spec.origin and spec.origin.endswith(".py"):
        files = {top: Path(spec.origin)}
    else:
        raise ValueError(f"plugin module {module!r} has no Python source to hash ({spec.origin})")
    if module not in files:
        raise ValueError(f"plugin module {module!r} is not under {top!r}'s sources")
    return {name: files[name] for name in sorted(closure([module], import_graph(files)))}
