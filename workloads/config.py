"""The one strict config converter (CONTRACTS §3.1; DESIGN §7 example 2).

Every component config is a frozen kw-only dataclass. YAML/JSON is parsed once, at the edge,
into plain mappings, and `from_dict` turns a mapping into the typed config:

- an unknown key is a `ConfigError` with its dotted `path`, a `message` and, in `suggestion`, the
  nearest valid key
  (torchtitan `config/configurable.py`; the rationale in torchtitan PR #2386);
- a wrong type is a `ConfigError` (bool is never an int, a string is never a number);
- `Literal` values are checked against their allowed set;
- nested dataclasses, `X | None`, unions, `tuple[X, ...]`, `list[X]` and `dict[K, V]` are walked;
- an int is accepted where a float is declared (JSON writes 4.0 as 4) and converted to float;
- a dataclass's own `__post_init__` ValueError/TypeError is re-raised as `ConfigError` with the path.

`to_dict(obj)` is the inverse: a JSON-safe dict with every field, defaults included, used for
hashing, run params and checkpoints. `from_dict(cls, to_dict(cfg)) == cfg` for every config.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class Opt:
    ...     lr: float = 1e-3
    >>> from_dict(Opt, {"lr": 3})
    Opt(lr=3.0)
    >>> from_dict(Opt, {"lrr": 3})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    ConfigError: lrr: unknown key for Opt; did you mean 'lr'? (valid keys: lr)

It also holds the plain-mapping helpers every layer above shares: `merge` (recursive), `flatten`
(dotted names) and `suggest` (the nearest valid name). This module imports no torch: the
orchestrator parses configs without loading it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import Any, Literal, TypeVar, Union

__all__ = ["ConfigError", "flatten", "from_dict", "merge", "suggest", "to_dict"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config mapping does not match its dataclass.

    ``path``: dotted path of the offending key ("train.lr", list items as "a[2]"; "" for the
    root); ``message``: what is wrong; ``suggestion``: the nearest valid key at that level, or
    None; ``valid``: the valid keys at that level (unknown keys only). ``str()`` is
    "PATH: MESSAGE; did you mean 'SUGGESTION'? (valid keys: ...)".

    ``ConfigError("PATH: MESSAGE")`` (one string) is accepted from code that formats the text
    itself; it is split at the first ": " so that ``path`` and ``message`` are still filled.
    """

    def __init__(self, path: str, message: str | None = None, suggestion: str | None = None,
                 valid: Iterable[str] = ()) -> None:
        if message is None:
            head, sep, tail = path.partition(": ")
            path, message = (head, tail) if sep and " " not in head else ("", path)
        self.path, self.message, self.suggestion, self.valid = path, message, suggestion, tuple(valid)
        hint = f"; did you mean {suggestion!r}?" if suggestion else ""
        super().__init__(f"{path or '<root>'}: {message}{hint}{self._valid_text()}")

    def _valid_text(self) -> str:
        return f" (valid keys: {', '.join(self.valid)})" if self.valid else ""

    @property
    def detail(self) -> str:
        """The message with the valid keys, without path or suggestion (for a caller that
        shows those itself)."""
        return self.message + self._valid_text()

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray ships exceptions between processes by pickling: keep the fields.
        return (type(self), (self.path, self.message, self.suggestion, self.valid))


def suggest(word: str, candidates: Iterable[Any]) -> str | None:
    """The candidate nearest to a misspelt ``word`` (difflib ratio >= 0.6), or None."""
    got = difflib.get_close_matches(str(word), sorted({str(c) for c in candidates}), n=1, cutoff=0.6)
    return got[0] if got else None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``; lists and empty mappings stay leaves."""
    if isinstance(tree, Mapping) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive merge of plain config mappings: nested mappings merge, anything else replaces.
    The one merge used by presets and configs built on a grid's before ``from_dict`` validates the result."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def from_dict(cls: type[T], data: Mapping[str, Any], *, path: str = "") -> T:
    """Build the frozen dataclass `cls` from `data`, strictly.

    Args:
        cls: a dataclass type.
        data: a mapping of field name -> value (values may be nested mappings); an instance of
            `cls` is returned unchanged.
        path: dotted prefix used in error messages (e.g. "model.pe").
    Raises:
        ConfigError: unknown key (with a suggestion), missing required field, wrong type,
            a value outside a Literal, or a validation error raised by the dataclass itself.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a mapping for {cls.__name__}, got {type(data).__name__} {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(path, f"keys must be strings, got {key!r}")
        if key not in fields:
            raise ConfigError(_join(path, key), f"unknown key for {cls.__name__}", suggest(key, fields),
                              valid=fields)
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], _join(path, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(_join(path, name), f"required field of {cls.__name__} is missing")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(path, f"invalid {cls.__name__}: {exc}") from exc


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def _convert(tp: Any, value: Any, path: str) -> Any:
    """Check `value` against the annotation `tp` and return the converted value."""
    if tp is Any:
        return value
    if tp is type(None) or tp is None:
        if value is not None:
            raise ConfigError(path, f"expected null, got {value!r}")
        return None
    origin = typing.get_origin(tp)
    if origin is Literal:
        return _convert_literal(tp, value, path)
    if origin is Union or origin is types.UnionType:
        return _convert_union(tp, value, path)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value, path=path)
    if origin in (tuple, list) or tp in (tuple, list):
        return _convert_sequence(tp, value, path)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return _convert_mapping(tp, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError as exc:
            raise ConfigError(path, f"{value!r} is not a valid {tp.__name__}") from exc
    return _convert_scalar(tp, value, path)


def _convert_literal(tp: Any, value: Any, path: str) -> Any:
    allowed = typing.get_args(tp)
    for option in allowed:
        # type() check so that True never matches Literal[1] and 1 never matches Literal[True]
        if value == option and type(value) is type(option):
            return option
    raise ConfigError(path, f"{value!r} is not one of {list(allowed)}")


def _convert_union(tp: Any, value: Any, path: str) -> Any:
    members = typing.get_args(tp)
    if value is None:
        if type(None) in members:
            return None
        raise ConfigError(path, f"null is not allowed (expected {tp})")
    errors = []
    for member in members:
        if member is type(None):
            continue
        try:
            return _convert(member, value, path)
        except ConfigError as exc:
            errors.append(exc.message if exc.path == path else str(exc))
    raise ConfigError(path, f"{value!r} matches no member of {tp}: {'; '.join(errors)}")


def _convert_sequence(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp) or tp
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ConfigError(path, f"expected a list, got {type(value).__name__} {value!r}")
    args = typing.get_args(tp)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(value):
            raise ConfigError(path, f"expected {len(args)} items, got {len(value)}")
        return tuple(_convert(a, v, _join(path, i)) for i, (a, v) in enumerate(zip(args, value)))
    item_tp = args[0] if args else Any
    items = [_convert(item_tp, v, _join(path, i)) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _convert_mapping(tp: Any, value: Any, path: str) -> dict:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected a mapping, got {type(value).__name__} {value!r}")
    key_tp, val_tp = typing.get_args(tp) or (Any, Any)
    return {_convert(key_tp, k, _join(path, str(k))): _convert(val_tp, v, _join(path, str(k)))
            for k, v in value.items()}


def _convert_scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected a bool, got {type(value).__name__} {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an int, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {type(value).__name__} {value!r}")
        return value
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if isinstance(value, str) and issubclass(tp, PurePath):
            return tp(value)
        raise ConfigError(path, f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    raise ConfigError(path, f"unsupported annotation {tp!r} in config class")


def to_dict(obj: Any) -> Any:
    """JSON-safe plain data for a config dataclass: every field (defaults included), tuples as
    lists, paths as strings, enums as values. Non-finite floats are refused (JSON has none)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"to_dict: non-finite float {obj!r} cannot be stored in a config")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"to_dict: {type(obj).__name__} {obj!r} is not config data")
