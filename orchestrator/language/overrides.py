"""Command-line overrides in Hydra's grammar, applied to the raw grid document before validation.

=====================  ==========================================================================
``key=v``              set an existing key (error, with the nearest key, if it does not exist;
                       inside a config section any field of its config may be set, and an
                       unknown one is reported by the strict validation)
``+key=v``             add a new key (error if it exists: Hydra's "use ++ to force")
``++key=v``            set, adding it if missing
``~key``               delete a key (error if missing)
``key=a,b``            sweep: a new product axis named ``key`` (Hydra multirun, here a grid axis)
``key=range(0,3)``     sweep over ``range(0, 3)``; ``choice(a,b)`` is an explicit list sweep
=====================  ==========================================================================

Values are parsed with ``yaml.safe_load`` (``1e-3`` -> float, ``[1,2]`` -> list, ``true`` -> bool).
Keys are dotted paths into the grid document, e.g. ``defaults.train.lr=3e-4`` or
``stages.pretrain.train.steps=100``. In a grid, two short forms address the stage config the way
users think of it (as Hydra's overrides address the config, not the file):

=====================  ==========================================================================
``train.steps=3000``   a config section (or ``launcher``) first: ``defaults.train.steps`` — every
                       stage that does not set the key itself
``yarn.train.steps=5`` a stage name first: ``stages.yarn.train.steps`` — that stage only
=====================  ==========================================================================

A section name wins over a stage of the same name (``stages.<name>...`` reaches that stage).
A key naming an axis of the grid (``pe=pope``, ``pe=[rope,pope]``, ``seed=0,1``) sets that axis's
values, and a sweep of a key the grid binds to a product axis (``train.lr=1e-3,3e-3`` where
``train.lr: ${lr}``) sets the values of that axis. Numbers are typed inside lists too
(``[3e-3,1e-2]`` is two floats).

Values are read by the grid files' bounded loader, with the same limits (``limits``): nodes after
alias expansion (one budget for all overrides of a command), depth counted from the grid's root,
scalar and number sizes, sweep sizes; the document they make is counted again. A refusal names the
override (its text) and the key.
A sweep binds the key to ``${key}`` (the key as typed) and adds the axis, so sweeps are allowed
only under ``defaults`` and ``stages`` (where interpolation applies).

Every problem of every override is reported in one :class:`GridError`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phaselab.orchestrator.language import limits
from phaselab.orchestrator.language.yamlio import (
    GridError,
    Issue,
    Mark,
    Marks,
    all_paths,
    check_tree,
    dotted,
    load_value,
    suggest,
)
from phaselab.orchestrator.stages import section_names

_KEY_RE = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
_CALL_RE = re.compile(r"^(range|choice)\((.*)\)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Override:
    """One parsed override. ``op`` is ``set | add | force | delete``; ``sweep`` holds the values of
    a sweep (then ``value`` is None)."""

    text: str
    op: str
    path: tuple[str | int, ...]
    value: Any = None
    sweep: tuple[Any, ...] | None = None
    axis: str | None = None    # a sweep's axis name when it differs from the dotted path


def _sections() -> frozenset[str]:
    """Config sections (every registered stage kind's, and ``resources``): inside one, any field
    of its config may be set, and the strict validation reports an unknown one."""
    return frozenset(section_names()) | {"resources"}


def override_mark(text: str) -> Mark:
    """Where an override's problems are reported: its text (shortened past 120 characters)."""
    shown = text if len(text) <= 120 else f"{text[:100]}... ({len(text)} characters)"
    return Mark(f"<override {shown!r}>", 0, 0)


def _fail(text: str, msg: str, key: str = "", suggestion: str | None = None) -> GridError:
    return GridError([Issue(override_mark(text), key, msg, suggestion)])


class _Budget:
    """The YAML node budget all overrides share with each other (``limits.MAX_YAML_NODES``, as for
    one file), spent as each value is read, so many small bombs are refused as one big one."""

    def __init__(self) -> None:
        self.left = limits.MAX_YAML_NODES

    def spend(self, value: Any, text: str, key: str) -> None:
        stack = [value]
        while stack:
            item = stack.pop()
            self.left -= 1
            if self.left < 0:
                raise _fail(text, f"the overrides hold more than {limits.MAX_YAML_NODES} YAML nodes "
                                  "after alias expansion", key)
            if isinstance(item, Mapping):
                self.left -= len(item)
                stack += item.values()
            elif isinstance(item, list):
                stack += item


def _split_top(value: str) -> list[str]:
    """Split on commas outside brackets and quotes: ``a,[1,2],'x,y'`` -> 3 items."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _scalar(text: str, raw: str, path: tuple = (), budget: _Budget | None = None) -> Any:
    """The value ``raw`` of override ``text`` for key ``path``, read by the grid files' bounded
    loader (same limits; refusals name the override and the key)."""
    value = load_value(raw, mark=override_mark(text), path=path) if raw.strip() else ""
    (budget or _Budget()).spend(value, text, dotted(path))
    return _numbers(value)


def _numbers(value: Any) -> Any:
    """YAML 1.1 reads 3e-4 as a string; on the command line it means the number (as in Hydra),
    inside lists and mappings too (``[3e-3,1e-2]`` is two floats). Depth is bounded by the loader."""
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        return float(value)
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    return value


def _sweep(text: str, raw: str, path: tuple, budget: _Budget) -> tuple[Any, ...] | None:
    call = _CALL_RE.match(raw.strip())
    if call and call.group(1) == "range":
        args = [_scalar(text, a, path, budget) for a in _split_top(call.group(2))]
        if not (1 <= len(args) <= 3) or not all(isinstance(a, int) for a in args):
            raise _fail(text, f"range() takes 1 to 3 integers, got {call.group(2)!r}")
        if len(args) == 3 and args[2] == 0:
            raise _fail(text, "range() step must not be 0")
        span = range(*args)   # a lazy range: its length is known before a value exists
        if len(span) > limits.MAX_SWEEP_VALUES:
            raise _fail(text, f"range({call.group(2)}) has {len(span)} values; a sweep takes at most "
                              f"{limits.MAX_SWEEP_VALUES}")
        values = tuple(span)
        if not values:
            raise _fail(text, f"range({call.group(2)}) is empty")
        return values
    parts = _split_top(call.group(2)) if call else _split_top(raw)   # choice(a,b,...) or a,b,...
    if len(parts) > limits.MAX_SWEEP_VALUES:
        raise _fail(text, f"a sweep of {len(parts)} values; a sweep takes at most {limits.MAX_SWEEP_VALUES}",
                    dotted(path))
    return tuple(_scalar(text, p, path, budget) for p in parts) if call or len(parts) > 1 else None


def parse_override(text: str, budget: _Budget | None = None) -> Override:
    """Parse one ``key=value`` string (see the module docstring). ``budget``: the node budget
    shared by the overrides of one command (a fresh one when None)."""
    if not isinstance(text, str) or not text:
        raise TypeError(f"an override must be a non-empty string, got {text!r}")
    if len(text) > limits.MAX_YAML_BYTES:
        raise _fail(text, f"an override of {len(text)} characters; at most {limits.MAX_YAML_BYTES}")
    budget = budget or _Budget()
    if text.startswith("~"):
        key, _, _ = text[1:].partition("=")
        op = "delete"
    else:
        if "=" not in text:
            raise _fail(text, "expected key=value, +key=value, ++key=value or ~key")
        key, _, raw = text.partition("=")
        op = "force" if key.startswith("++") else "add" if key.startswith("+") else "set"
        key = key.lstrip("+")
    if len(key) > 1024 or not _KEY_RE.match(key):
        raise _fail(text, f"invalid key {key[:100]!r} (dotted names of letters, digits, _ and -)", key[:100])
    path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
    if len(path) > limits.MAX_YAML_DEPTH:
        raise _fail(text, f"a key nested deeper than {limits.MAX_YAML_DEPTH} levels", key[:100])
    if op == "delete":
        return Override(text=text, op=op, path=path)
    sweep = _sweep(text, raw, path, budget)
    if sweep is not None:
        if path[0] in TOP_LEVEL and path[0] not in ("defaults", "stages"):
            raise _fail(text, "sweeps are allowed only under 'defaults.' and 'stages.'", key)
        return Override(text=text, op=op, path=path, sweep=sweep)
    return Override(text=text, op=op, path=path, value=_scalar(text, raw, path, budget))


# The grid document's own top-level keys (GridSpec's fields): a path starting with one of them is
# already a full path.
TOP_LEVEL = frozenset({"grid", "description", "seeds", "axes", "defaults", "stages", "salt"})


def grid_path(path: tuple, doc: Mapping[str, Any]) -> tuple:
    """The full grid path of an override key (module docstring): ``train.steps`` ->
    ``defaults.train.steps``, ``yarn.train.steps`` -> ``stages.yarn.train.steps`` when ``yarn``
    is a stage of ``doc``; full paths and ``x-*`` keys unchanged."""
    head = path[0]
    if head in TOP_LEVEL or (isinstance(head, str) and head.startswith("x-")):
        return path
    if head in _sections() or head == "launcher":
        return ("defaults", *path)
    stages = doc.get("stages")
    if len(path) >= 2 and isinstance(stages, Mapping) and head in stages:
        return ("stages", *path)
    return path


def in_section(path: tuple) -> bool:
    """Paths inside a config section (``defaults.train.lr``, ``stages.x.model.pe.kind``): their
    keys are checked against the workloads' configs later, so a ``key=v`` there may name a field
    the YAML leaves at its default (Hydra's structured-config behaviour)."""
    return (len(path) >= 3 and path[0] == "defaults" and path[1] in _sections()) or (
        len(path) >= 4 and path[0] == "stages" and path[2] in _sections())


def _parent(doc: Any, ov: Override, *, create: bool) -> Any:
    node = doc
    for i, p in enumerate(ov.path[:-1]):
        if isinstance(node, Mapping) and p not in node and create:
            node[p] = {}
        if isinstance(node, Mapping) and p in node or isinstance(node, list) and isinstance(p, int) and p < len(node):
            node = node[p]
        else:
            raise _missing(doc, ov, ov.path[: i + 1])
    return node


def _missing(doc: Any, ov: Override, path: tuple) -> GridError:
    paths = [dotted(p) for p in all_paths(doc)]
    if isinstance(doc, Mapping) and isinstance(doc.get("stages"), Mapping) and path[0] not in TOP_LEVEL:
        # a short key (module docstring): suggest among the short forms of the grid's keys
        paths = [dotted(p[1:]) for p in all_paths(doc) if len(p) > 1 and p[0] in ("defaults", "stages")]
    near = suggest(dotted(path), paths)
    hint = "" if ov.op in ("add", "force") else " (use +key=value to add a new key)"
    return _fail(ov.text, f"key {dotted(path)!r} is not in the grid{hint}", dotted(path), near)


def apply_overrides(doc: Mapping[str, Any], marks: Marks, overrides: Sequence[str]) -> dict:
    """Return a deep copy of ``doc`` with the overrides applied; ``marks`` records each override
    as the source of the paths it sets, so later validation errors point at the override. In a
    grid (a document with ``stages``) keys may take the short forms of the module docstring.
    Raises one GridError listing the problems of all overrides."""
    out = copy.deepcopy(dict(doc))
    grid = isinstance(out.get("stages"), Mapping)
    issues: list[Issue] = []
    budget = _Budget()
    for text in overrides:
        try:
            ov = parse_override(text, budget)
            if grid:
                ov = _full(ov, out)
            _apply(out, marks, ov)
        except GridError as err:
            issues += err.issues
    if issues:
        raise GridError(issues)
    check_tree(out, marks)   # the file's limits hold for the document the overrides made
    return out


def axis_path(path: tuple, doc: Mapping[str, Any]) -> tuple | None:
    """The grid path of the axis named by ``path`` as typed (``pe``, ``seed``, or ``train.lr``
    for an axis of that name, or the key a whole ``${axis}`` binds), or None."""
    axes = doc.get("axes") if isinstance(doc.get("axes"), Mapping) else {}
    name = dotted(path)
    if name == "seed":
        return ("seeds",)
    if isinstance(axes.get("product"), Mapping) and name in axes["product"]:
        return ("axes", "product", name)
    groups = axes.get("zip") if isinstance(axes.get("zip"), list) else []   # not a list: the schema says so
    for i, group in enumerate(groups):
        if isinstance(group, Mapping) and name in group:
            return ("axes", "zip", i, name)
    return None


def _bound_axis(path: tuple, doc: Mapping[str, Any]) -> tuple | None:
    """The axis path when the value at ``path`` is exactly ``${axis}`` of a product axis."""
    node: Any = doc
    for p in path:
        if not (isinstance(node, Mapping) and p in node):
            return None
        node = node[p]
    ref = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_.-]*)\}", node) if isinstance(node, str) else None
    axis = axis_path(tuple(ref.group(1).split(".")), doc) if ref else None
    # a zip axis advances with its group: a sweep of the key stays a new product axis
    return axis if axis is not None and axis[:2] == ("axes", "product") else None


def _full(ov: Override, doc: Mapping[str, Any]) -> Override:
    """``ov`` with its grid path (:func:`grid_path`); a sweep keeps the key as typed for its axis.
    A key naming an axis (``pe=rope,pope``, ``pe=[pope]``, ``seed=0,1``), or a sweep of a key bound
    to one (``train.lr=1e-3,3e-3`` where ``train.lr: ${lr}``), sets that axis's values."""
    axis = axis_path(ov.path, doc) if ov.op != "delete" else None
    bound = _bound_axis(grid_path(ov.path, doc), doc) if ov.sweep is not None else None
    if axis is not None or bound is not None:
        values = ov.sweep if ov.sweep is not None else ov.value
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        return Override(text=ov.text, op="set", path=axis or bound, value=values)
    path = grid_path(ov.path, doc)
    if ov.sweep is not None and path[0] not in ("defaults", "stages"):
        raise _fail(ov.text, "sweeps are allowed only under 'defaults.' and 'stages.'", dotted(ov.path))
    return ov if path == ov.path else Override(text=ov.text, op=ov.op, path=path, value=ov.value, sweep=ov.sweep,
                                               axis=ov.axis or dotted(ov.path))


def _apply(out: dict, marks: Marks, ov: Override) -> None:
    text = ov.text
    mark = override_mark(text)
    parent = _parent(out, ov, create=ov.op in ("add", "force") or (ov.op == "set" and in_section(ov.path)))
    last = ov.path[-1]
    exists = (isinstance(parent, Mapping) and last in parent) or (
        isinstance(parent, list) and isinstance(last, int) and last < len(parent))
    if not exists and not isinstance(parent, Mapping):   # inside a scalar, or past a list's end
        what = f"a list of {len(parent)} items" if isinstance(parent, list) else f"a {type(parent).__name__}"
        raise _fail(text, f"{dotted(ov.path[:-1])!r} is {what}: it has no key {last!r}", dotted(ov.path))
    if (ov.op == "delete" or (ov.op == "set" and not in_section(ov.path))) and not exists:
        raise _missing(out, ov, ov.path)
    if ov.op == "add" and exists:
        raise _fail(text, f"key {dotted(ov.path)!r} already exists (use ++key=value to force)",
                    dotted(ov.path))
    if ov.op == "delete":
        del parent[last]
        return
    if ov.sweep is not None:
        axis = ov.axis or dotted(ov.path)
        axes = out.setdefault("axes", {}) or {}
        product = axes.setdefault("product", {}) or {} if isinstance(axes, dict) else None
        if not isinstance(product, dict):
            raise _fail(text, "a sweep adds an axis under 'axes.product', which is not a mapping here",
                        dotted(ov.path))
        out["axes"], axes["product"] = axes, product
        product[axis] = list(ov.sweep)
        parent[last] = "${" + axis + "}"
        marks.replace(("axes", "product", axis), mark)
    else:
        parent[last] = ov.value
    marks.replace(ov.path, mark)
