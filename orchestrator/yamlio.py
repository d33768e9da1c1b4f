"""YAML at the edge: parse with ``yaml.safe_load`` and keep a line/column for every key.

A grid error must name FILE:LINE:COLUMN and the key (issue 6). ``yaml.safe_load`` drops marks, so
the same text is also *composed* (``yaml.compose`` with the SafeLoader: node tree only, no object
construction) and walked once to map every path ``("stages", "pretrain", "train", "lr")`` to the
position of its key. The data itself always comes from ``yaml.safe_load``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

YamlPath = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Mark:
    """A position in a source: 1-based line and column; ``line == 0`` for a command-line override."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return self.file if self.line == 0 else f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem in a grid: where, which key, what, and the nearest valid key if any."""

    mark: Mark
    key: str
    message: str
    suggestion: str | None = None

    def __str__(self) -> str:
        hint = f" (did you mean '{self.suggestion}'?)" if self.suggestion else ""
        return f"{self.mark}: {self.key or '<root>'}: {self.message}{hint}"


class GridError(ValueError):
    """A grid file (or an override) is invalid. ``issues`` lists every problem with its position."""

    def __init__(self, issues: Iterable[Issue]) -> None:
        self.issues = list(issues)
        super().__init__("invalid grid:\n  " + "\n  ".join(str(i) for i in self.issues))


def suggest(word: str, candidates: Iterable[str]) -> str | None:
    """Nearest valid key for a misspelt one (difflib ratio >= 0.6), or None."""
    got = difflib.get_close_matches(str(word), sorted({str(c) for c in candidates}), n=1, cutoff=0.6)
    return got[0] if got else None


def dotted(path: YamlPath) -> str:
    return ".".join(str(p) for p in path)


@dataclass
class Marks:
    """path -> Mark of its key (or of the item, inside lists). Lookup falls back to the nearest
    ancestor so that an error deep inside an interpolated or merged value still points somewhere."""

    file: str
    by_path: dict[YamlPath, Mark] = field(default_factory=dict)

    def at(self, path: YamlPath) -> Mark:
        path = tuple(path)
        while path:
            if path in self.by_path:
                return self.by_path[path]
            path = path[:-1]
        return self.by_path.get((), Mark(self.file, 1, 1))

    def set(self, path: YamlPath, mark: Mark) -> None:
        self.by_path[tuple(path)] = mark


def _walk(node: yaml.Node, path: YamlPath, marks: Marks, issues: list[Issue]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for knode, vnode in node.value:
            key = knode.value
            if knode.tag.endswith(":int"):
                key = int(key)
            mark = Mark(marks.file, knode.start_mark.line + 1, knode.start_mark.column + 1)
            if key in seen:
                issues.append(Issue(mark, dotted((*path, key)), "duplicate key"))
            seen.add(key)
            marks.set((*path, key), mark)
            _walk(vnode, (*path, key), marks, issues)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            marks.set((*path, i), Mark(marks.file, item.start_mark.line + 1, item.start_mark.column + 1))
            _walk(item, (*path, i), marks, issues)


def load_yaml(text: str, *, file: str) -> tuple[Any, Marks]:
    """Parse ``text`` (named ``file`` in messages). Returns (data, marks); raises GridError on
    syntax errors and duplicate keys, with the position PyYAML reports."""
    marks = Marks(file)
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        m = err.problem_mark
        mark = Mark(file, m.line + 1, m.column + 1) if m is not None else Mark(file, 1, 1)
        raise GridError([Issue(mark, "", f"YAML syntax error: {err.problem}")]) from None
    marks.set((), Mark(file, 1, 1))
    issues: list[Issue] = []
    if root is not None:
        _walk(root, (), marks, issues)
    if issues:
        raise GridError(issues)
    return data, marks


def load_yaml_file(path: Path) -> tuple[Any, Marks]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"grid file {str(path)!r} does not exist")
    return load_yaml(path.read_text(encoding="utf-8"), file=str(path))


def get_path(data: Any, path: YamlPath) -> Any:
    """Value at ``path``; KeyError/IndexError if absent."""
    for p in path:
        data = data[p]
    return data


def has_path(data: Any, path: YamlPath) -> bool:
    try:
        get_path(data, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


def all_paths(data: Any, prefix: YamlPath = ()) -> list[YamlPath]:
    """Every mapping key path in ``data`` (used to suggest the nearest existing key)."""
    out: list[YamlPath] = []
    if isinstance(data, Mapping):
        for k, v in data.items():
            out.append((*prefix, k))
            out += all_paths(v, (*prefix, k))
    return out
