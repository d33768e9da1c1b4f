"""YAML at the edge: parse safely, within bounds, and keep a line/column for every key.

A grid error must name FILE:LINE:COLUMN and the key. The text is *composed* once by a bounded
SafeLoader (node tree only: no tags beyond the safe ones, no object construction), which refuses
a file over ``limits.MAX_YAML_BYTES``, nesting deeper than ``limits.MAX_YAML_DEPTH`` and more than
``limits.MAX_YAML_NODES`` nodes after alias expansion, each with the position and key where the
limit was crossed. The node tree is then constructed into data by the same safe constructor and
walked once to map every path ``("stages", "pretrain", "train", "lr")`` to the position of its key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phaselab.orchestrator.language import limits
from phaselab.workloads.config import suggest  # noqa: F401 (re-exported: the one suggester)

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

    def replace(self, path: YamlPath, mark: Mark) -> None:
        """``path`` now comes from ``mark`` (an override): the positions recorded under it
        belonged to the value it replaced, so an error inside the new value points at ``mark``."""
        path = tuple(path)
        for old in [p for p in self.by_path if len(p) > len(path) and p[:len(path)] == path]:
            del self.by_path[old]
        self.by_path[path] = mark


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


class _LimitExceeded(Exception):
    def __init__(self, mark: yaml.Mark, path: YamlPath, message: str) -> None:
        super().__init__(message)
        self.mark, self.path, self.message = mark, path, message


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts nesting depth and expanded nodes as it goes: an alias
    adds the expanded size of the node it names (known once that node is complete), so the
    count is what a walk of the constructed data would visit, computed in linear time."""

    def __init__(self, text: str, base: YamlPath = ()) -> None:
        super().__init__(text)
        self._path: list[Any] = list(base)   # a value placed at ``base`` (an override) starts there
        self._depth = len(base)
        self._expanded = 0
        self._sizes: dict[int, int] = {}

    def _count(self, n: int, mark: yaml.Mark) -> None:
        self._expanded += n
        if self._expanded > limits.MAX_YAML_NODES:
            raise _LimitExceeded(mark, tuple(self._path), f"more than {limits.MAX_YAML_NODES} YAML "
                                 "nodes after alias expansion (an alias bomb?)")

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        part = index.value if isinstance(index, yaml.ScalarNode) else index
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = self.anchors.get(event.anchor)
            if node is not None and id(node) not in self._sizes:
                raise _LimitExceeded(event.start_mark, (*self._path, part) if part is not None else
                                     tuple(self._path), f"alias *{event.anchor} refers to itself")
            if node is not None:
                self._count(self._sizes[id(node)], event.start_mark)
            return super().compose_node(parent, index)
        if part is not None:
            self._path.append(part)
        self._depth += 1
        try:
            if self._depth > limits.MAX_YAML_DEPTH:
                raise _LimitExceeded(event.start_mark, tuple(self._path), f"nested deeper than "
                                     f"{limits.MAX_YAML_DEPTH} levels")
            if isinstance(event, yaml.ScalarEvent):
                self._check_scalar(event)
            before = self._expanded
            self._count(1, event.start_mark)
            node = super().compose_node(parent, index)
            self._sizes[id(node)] = self._expanded - before
            return node
        finally:
            self._depth -= 1
            if part is not None:
                self._path.pop()

    def _check_scalar(self, event: yaml.ScalarEvent) -> None:
        value = event.value
        if len(value) > limits.MAX_SCALAR_CHARS:
            raise _LimitExceeded(event.start_mark, tuple(self._path), f"a scalar of {len(value)} "
                                 f"characters (at most {limits.MAX_SCALAR_CHARS})")
        digits = sum(c.isdigit() for c in value[:200])
        if digits > 32 and self.resolve(yaml.ScalarNode, value, event.implicit).endswith((":int", ":float")):
            raise _LimitExceeded(event.start_mark, tuple(self._path), f"a number of {len(value)} "
                                 "characters; no setting takes more than 32 digits")


def _refuse_type(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(None, None, f"a value of YAML type {node.tag} has no place "
                                            "in a grid (no setting takes it)", node.start_mark)


# A date reads as its text (``description: 2024-05-01``); sets, binary and ordered pairs are
# refused with their position: no setting takes them, and the cache key cannot hash them.
_BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)
for _tag in ("set", "binary", "omap", "pairs"):
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_type)


def _compose(text: str, file: str, base: YamlPath = ()) -> tuple[Any, yaml.Node | None]:
    """(data, node tree) of ``text``; GridError on syntax errors and exceeded limits. ``base``:
    the path the text's root is placed at (an override's key), counted in depth and named in errors."""
    if len(text) > limits.MAX_YAML_BYTES:
        raise GridError([Issue(Mark(file, 1, 1), dotted(base), f"grid text of {len(text)} characters "
                               f"is over the limit of {limits.MAX_YAML_BYTES}")])
    loader = None
    try:
        loader = _BoundedLoader(text, base)
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except _LimitExceeded as err:
        mark = Mark(file, err.mark.line + 1, err.mark.column + 1)
        raise GridError([Issue(mark, dotted(err.path), err.message)]) from None
    except yaml.MarkedYAMLError as err:
        m = err.problem_mark
        mark = Mark(file, m.line + 1, m.column + 1) if m is not None else Mark(file, 1, 1)
        raise GridError([Issue(mark, dotted(base), f"YAML syntax error: {err.problem}")]) from None
    except yaml.YAMLError as err:   # ReaderError: a character YAML does not allow
        line, col = _line_col(text, getattr(err, "position", 0) or 0)
        raise GridError([Issue(Mark(file, line, col), dotted(base), f"not a YAML text: {err}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, root


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def load_yaml(text: str, *, file: str) -> tuple[Any, Marks]:
    """Parse ``text`` (named ``file`` in messages). Returns (data, marks); raises GridError on
    syntax errors, exceeded limits and duplicate keys, with the position of the problem."""
    marks = Marks(file)
    data, root = _compose(text, file)
    marks.set((), Mark(file, 1, 1))
    issues: list[Issue] = []
    if root is not None:
        _walk(root, (), marks, issues)
    if issues:
        raise GridError(issues)
    return data, marks


def load_value(text: str, *, mark: Mark, path: YamlPath) -> Any:
    """The value an override gives the key ``path``, read by the same bounded loader as a grid
    file, with the same limits (nodes after alias expansion, depth counted from the root of the
    grid, scalar and number sizes); a refusal names ``mark`` (the override) and the key."""
    try:
        data, _ = _compose(text, mark.file, tuple(path))
    except GridError as err:
        raise GridError([Issue(mark, i.key or dotted(path), i.message) for i in err.issues]) from None
    return data


def check_tree(data: Any, marks: Marks) -> None:
    """Refuse a document (a grid after its overrides) with more than ``limits.MAX_YAML_NODES``
    nodes (shared values counted once per use, as in the file) or deeper than
    ``limits.MAX_YAML_DEPTH``, at the key where the limit is crossed. Iterative and stopping at the
    limit, so its time is bounded whatever the document."""
    count, stack = 0, [(data, ())]
    while stack:
        value, path = stack.pop()
        count += 1
        if count > limits.MAX_YAML_NODES:
            raise GridError([Issue(marks.at(path), dotted(path), f"more than {limits.MAX_YAML_NODES} "
                                   "YAML nodes after overrides and alias expansion")])
        if len(path) > limits.MAX_YAML_DEPTH:
            raise GridError([Issue(marks.at(path), dotted(path), f"nested deeper than "
                                   f"{limits.MAX_YAML_DEPTH} levels")])
        if isinstance(value, Mapping):
            stack += [(v, (*path, k)) for k, v in value.items()]
            count += len(value)   # the keys
        elif isinstance(value, list):
            stack += [(v, (*path, i)) for i, v in enumerate(value)]


def read_grid_text(path: Path) -> str:
    """The text of a grid file: its size checked before it is read, UTF-8 without NUL bytes.
    GridError (naming the file, and the line of the first bad byte) otherwise."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"grid {str(path)!r} is a directory; give a grid file (.yaml) or a shipped grid's name")
    if not path.is_file():
        raise FileNotFoundError(f"grid file {str(path)!r} does not exist")
    size = path.stat().st_size
    if size > limits.MAX_YAML_BYTES:
        raise GridError([Issue(Mark(str(path), 1, 1), "", f"grid file of {size} bytes is over the "
                               f"limit of {limits.MAX_YAML_BYTES} bytes")])
    raw = path.read_bytes()[:limits.MAX_YAML_BYTES + 1]
    bad = raw.find(b"\0")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = err.start if bad < 0 else min(bad, err.start)
    if bad >= 0:
        line = raw.count(b"\n", 0, bad) + 1
        col = bad - (raw.rfind(b"\n", 0, bad) + 1) + 1
        raise GridError([Issue(Mark(str(path), line, col), "", f"not a UTF-8 text file (byte "
                               f"0x{raw[bad]:02x} at offset {bad}); a grid is YAML in UTF-8")])
    return text


def load_yaml_file(path: Path) -> tuple[Any, Marks]:
    return load_yaml(read_grid_text(path), file=str(path))


def get_path(data: Any, path: YamlPath) -> Any:
    """Value at ``path``; KeyError/IndexError if absent."""
    for p in path:
        data = data[p]
    return data


def all_paths(data: Any, prefix: YamlPath = ()) -> list[YamlPath]:
    """Every mapping key path in ``data`` (used to suggest the nearest existing key)."""
    out: list[YamlPath] = []
    if isinstance(data, Mapping):
        for k, v in data.items():
            out.append((*prefix, k))
            out += all_paths(v, (*prefix, k))
    return out
