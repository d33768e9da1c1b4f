"""Content-hash cache keys (DESIGN §5.4): Flyte-like, with an explanation of every miss.

key = sha256(canonical JSON of {kind, cache_schema, config - ignored keys, upstream keys (Merkle),
code hash, data digests, salt}). Canonical JSON: sorted keys, no whitespace, floats normalised
(1.0 == 1, -0.0 == 0, shortest repr), tuples as lists, NaN/Inf as strings.

The code hash of a stage is an AST-normalised hash of the modules of ``phaselab.workloads`` and
``phaselab.kernels`` that its stage class can reach through imports (:mod:`closure`; the stage
kind's own modules are the entry points, :func:`stage_entries`): comments, docstrings and
formatting do not count, and a module the stage cannot import (the plotting code for a pretrain,
the training loop for an eval) does not either. flyteorg/flyte#2899 is the stale hit the hash
prevents; the closure keeps an unrelated edit from re-running every stage. Per-module hashes are
kept beside the key so ``why`` can name the changed files.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phaselab.orchestrator.plan import closure as _closure
from phaselab.orchestrator.stages.digest import canonical_json, normalize, package_root, sha256_hex
from phaselab.workloads.config import flatten

CACHE_SCHEMA = 1

# Keys that do not change what a stage computes (DESIGN §5.4): logging cadence, checkpoint
# cadence and retention (resume is bitwise exact), the micro-batch / accumulation split (the global batch
# train.batch_size stays in the key), dataloader workers and tags.
IGNORED_KEYS: frozenset[str] = frozenset({
    "train.log_every", "train.grad_accum", "train.micro_batch_size", "train.ckpt_every",
    "train.keep_checkpoints",
    "data.num_workers", "tags",
})

CODE_PACKAGES = ("phaselab.workloads", "phaselab.kernels")


# Config fields added after stages were keyed, with the default they were added with: a stage
# whose value is that default leaves the field out of its key, so adding a field does not change
# the config part of the keys already in catalogs (DESIGN §5.4, "Adding a config field"). The
# code part changes with the code as always. Entries are never removed.
KEY_DEFAULTS: dict[str, Any] = {"model.pe.options": {}}
KEY_DEFAULTS |= {f"{sec}.real.{k}": None for sec in ("data", "eval.data") for k in ("dtype", "vocab_size")}
# the attention kernels' options (kernels/common/options.py, model.attention)
KEY_DEFAULTS |= {"model.attention.pope_impl": "auto", "model.attention.tapa_series": True,
                 "model.attention.exp2": "mufu", "model.attention.autotune": False,
                 "model.attention.flash_impl": "auto"}


def strip_ignored(config: Mapping[str, Any], ignored: frozenset[str] = IGNORED_KEYS,
                  key_defaults: Mapping[str, Any] | None = None) -> dict:
    """``config`` without the IGNORED_KEYS and without the KEY_DEFAULTS fields at their default."""
    defaults = KEY_DEFAULTS if key_defaults is None else key_defaults

    def keep(path: str, value: Any) -> bool:
        return path not in ignored and not (path in defaults and normalize(value) == normalize(defaults[path]))

    def walk(node: Any, prefix: str) -> Any:
        if not isinstance(node, Mapping):
            return node
        return {k: walk(v, f"{prefix}.{k}" if prefix else k) for k, v in node.items()
                if keep(f"{prefix}.{k}" if prefix else k, v)}
    return walk(config, "")


# ---------------------------------------------------------------------------------- code hash
def _strip_docstrings(tree: ast.AST, holders: list[ast.AST] | None = None) -> ast.AST:
    """``tree`` without its docstrings, in place (``holders``: the nodes that open with one, as
    ``closure.scan`` found them; None: found here)."""
    if holders is None:
        holders = [node for node in ast.walk(tree) if isinstance(getattr(_closure.leading_constant(node), "value", None), str)]
    for node in holders:
        node.body = node.body[1:] or [ast.Pass()]
    return tree


def ast_hash(source: str, filename: str = "<source>") -> str:
    """sha256 of the AST dump without docstrings, comments or positions."""
    return _tree_hash(ast.parse(source, filename=filename))


def _tree_hash(tree: ast.Module, holders: list[ast.AST] | None = None) -> str:
    """:func:`ast_hash` of a parsed tree (its docstrings are removed in place; ``holders`` as
    :func:`_strip_docstrings`'s)."""
    return sha256_hex(ast.dump(_strip_docstrings(tree, holders), annotate_fields=True, include_attributes=False))


@dataclass(frozen=True, slots=True)
class CodeVersion:
    digest: str
    modules: Mapping[str, str]   # "phaselab.workloads.train.loop" -> ast hash


def code_version(packages: tuple[str, ...] = CODE_PACKAGES, roots: Mapping[str, Path] | None = None) -> CodeVersion:
    """AST hash of every ``*.py`` under the packages (``roots`` overrides where to look: tests)."""
    return code_index(packages, roots).version()


@dataclass(frozen=True)
class CodeIndex:
    """The code packages' per-module AST hashes and static import graph; :meth:`version` of an
    entry set is the :class:`CodeVersion` of the modules it reaches."""

    hashes: Mapping[str, str]                 # module -> ast hash
    graph: Mapping[str, frozenset[str]]       # module -> modules it references

    def version(self, entries: Iterable[str] | None = None) -> CodeVersion:
        """Over every module (``entries`` None) or over the import closure of ``entries``."""
        names = set(self.hashes) if entries is None else _closure.closure(entries, self.graph)
        modules = {m: self.hashes[m] for m in sorted(names)}
        return CodeVersion(digest=sha256_hex(canonical_json(modules)), modules=modules)

    def for_kind(self, kind: str) -> CodeVersion:
        """The code a stage of ``kind`` can reach (:func:`stage_entries`)."""
        return self.version(stage_entries(kind, self.hashes))


def code_index(packages: tuple[str, ...] = CODE_PACKAGES, roots: Mapping[str, Path] | None = None) -> CodeIndex:
    """Read (never import) the sources of ``packages`` (``roots`` overrides where: tests)."""
    files: dict[str, Path] = {}
    for pkg in packages:
        files |= _closure.module_files(pkg, Path(roots[pkg]) if roots and pkg in roots else package_root(pkg))
    # one parse and one walk a file for both (closure.scan): references first, since hashing
    # strips the docstrings from the tree
    known = set(files)
    hashes: dict[str, str] = {}
    graph: dict[str, frozenset[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        refs, holders = _closure.scan(tree, name, is_package=path.name == "__init__.py", known=known)
        graph[name] = frozenset(refs)
        hashes[name] = _tree_hash(tree, holders)
    return CodeIndex(hashes=hashes, graph=graph)


# The stage base module converts config sections (through every workloads config class): what it
# computes is the typed config, which the key holds itself, so its imports are no entry points.
_NOT_ENTRIES = ("phaselab.orchestrator.stages", "phaselab.orchestrator.stages.base")


def stage_entries(kind: str, known: Iterable[str]) -> set[str]:
    """The code modules (of ``known``) that the modules defining the ``kind`` stage class and
    its bases reference, following imports of other stage modules (:data:`_NOT_ENTRIES` aside)."""
    from phaselab.orchestrator.stages import STAGES

    if kind not in STAGES:
        raise ValueError(f"unknown stage kind {kind!r}; registered: {', '.join(STAGES)}")
    known = set(known)
    todo = [c.__module__ for c in type(STAGES[kind]).__mro__ if c.__module__ not in (*_NOT_ENTRIES, "builtins")]
    seen: set[str] = set()
    entries: set[str] = set()
    while todo:
        name = todo.pop()
        module = sys.modules.get(name)
        source_file = inspect.getsourcefile(module) if module is not None else None
        if name in seen or source_file is None:
            continue
        seen.add(name)
        refs = _closure.references(Path(source_file).read_text(encoding="utf-8"), name, is_package=False,
                                   known=known | _stage_modules())
        entries |= refs & known
        todo += [r for r in refs - known if r not in _NOT_ENTRIES and r not in seen]
    return entries


def _stage_modules() -> set[str]:
    return {m for m in sys.modules if m.startswith("phaselab.orchestrator.stages.")}


def plugin_code(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The code of the encoding plugin ``config["model"]["pe"]["kind"]`` names (None for a
    built-in): its "module:Class", its distribution's name==version when installed from an entry
    point, and the AST hashes of its module's import closure (:func:`closure.plugin_files`), so
    that editing the plugin re-keys the stages that use it and no other (docs/EXTENDING.md)."""
    from phaselab.workloads.models import pe_registry

    model = config.get("model")
    pe = model.get("pe") if isinstance(model, Mapping) else None
    kind = pe.get("kind") if isinstance(pe, Mapping) else None
    if not isinstance(kind, str) or pe_registry.is_builtin(kind):
        return None
    target, dist = pe_registry.target(kind)
    files = _closure.plugin_files(target.partition(":")[0])
    modules = {name: ast_hash(path.read_text(encoding="utf-8"), str(path)) for name, path in files.items()}
    return {"target": target, "dist": dist, "modules": modules}


# ------------------------------------------------------------------------------------ the key
@dataclass(frozen=True, slots=True)
class CacheKey:
    """``digest`` = sha256(canonical_json(parts)); ``code_modules`` is kept beside it (not hashed
    again: ``parts["code"]`` already is their digest) so a miss can name changed files."""

    digest: str
    parts: Mapping[str, Any]
    code_modules: Mapping[str, str] = field(default_factory=dict, compare=False)

    def explain(self, other: CacheKey | Mapping[str, Any], other_modules: Mapping[str, str] | None = None) -> list[str]:
        """Human-readable differences between this key and ``other`` (a key or stored parts)."""
        o_parts = other.parts if isinstance(other, CacheKey) else other
        o_mods = other.code_modules if isinstance(other, CacheKey) else (other_modules or {})
        return explain_parts(self.parts, o_parts, self.code_modules, o_mods)


def make_key(*, kind: str, config: Mapping[str, Any], upstream: Mapping[str, str],
             code: CodeVersion, data: Mapping[str, str], salt: str = "",
             ignored: frozenset[str] = IGNORED_KEYS) -> CacheKey:
    """Build the key of one stage. ``upstream`` maps input name -> upstream digest."""
    parts = normalize({
        "kind": kind, "cache_schema": CACHE_SCHEMA, "config": strip_ignored(config, ignored),
        "upstream": dict(upstream), "code": code.digest, "data": dict(data), "salt": salt,
    })
    plugin = plugin_code(config)
    if plugin is not None:   # only stages of a plugin encoding get this part: built-ins keep their keys
        parts["plugin"] = normalize(plugin)
    return CacheKey(digest=sha256_hex(canonical_json(parts)), parts=parts, code_modules=dict(code.modules))


def explain_parts(new: Mapping[str, Any], old: Mapping[str, Any], new_mods: Mapping[str, str],
                  old_mods: Mapping[str, str]) -> list[str]:
    lines: list[str] = []
    for part in ("kind", "cache_schema", "salt"):
        if new.get(part) != old.get(part):
            lines.append(f"{part}: {old.get(part)!r} -> {new.get(part)!r}")
    fa, fb = flatten(old.get("config", {})), flatten(new.get("config", {}))
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k, "<absent>") != fb.get(k, "<absent>"):
            lines.append(f"config.{k}: {fa.get(k, '<absent>')!r} -> {fb.get(k, '<absent>')!r}")
    ua, ub = old.get("upstream", {}), new.get("upstream", {})
    for k in sorted(set(ua) | set(ub)):
        if ua.get(k) != ub.get(k):
            lines.append(f"upstream {k}: {str(ua.get(k))[:12]} -> {str(ub.get(k))[:12]}")
    if old.get("code") != new.get("code"):
        changed = sorted(m for m in set(old_mods) | set(new_mods) if old_mods.get(m) != new_mods.get(m))
        lines.append("code: " + (", ".join(f"{m} ({'added' if m not in old_mods else 'removed' if m not in new_mods else 'changed'})"
                                          for m in changed) if changed else "changed (module list not stored)"))
    pa, pb = old.get("plugin") or {}, new.get("plugin") or {}
    if pa != pb:
        ma, mb = pa.get("modules", {}), pb.get("modules", {})
        changed = sorted(m for m in set(ma) | set(mb) if ma.get(m) != mb.get(m))
        lines.append(f"plugin {pb.get('target', pa.get('target'))}: " + (", ".join(changed) or "version"))
    da, db = old.get("data", {}), new.get("data", {})
    for k in sorted(set(da) | set(db)):
        if da.get(k) != db.get(k):
            lines.append(f"data {k}: {str(da.get(k))[:12]} -> {str(db.get(k))[:12]}")
    return lines
