"""The stage DAG of a grid: one node per distinct content hash (DESIGN §3.3, §5.4).

``load_grid`` reads a grid (a path or a shipped name) with overrides and validates it;
``build_dag`` expands the cells, converts every stage's sections into typed configs, computes
the Merkle cache keys and collapses identical stages across cells (and, through the catalog,
across grids) into one node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phaselab.orchestrator.language.expand import (
    Cell,
    IssueList,
    ResolvedStage,
    expand_cells,
    map_config_error,
    resolve_cell,
    when_issues,
)
from phaselab.orchestrator.language.overrides import apply_overrides
from phaselab.orchestrator.language.spec import GridSpec, validate_spec
from phaselab.orchestrator.language.yamlio import GridError, Issue, Marks, dotted, load_yaml, read_grid_text
from phaselab.orchestrator.plan.hashing import (
    CacheKey,
    CodeIndex,
    CodeVersion,
    canonical_json,
    code_index,
    make_key,
    sha256_hex,
)
from phaselab.orchestrator.plan.placement import local_gpu, with_auto_gpus
from phaselab.orchestrator.stages import STAGES, Resources, SectionError, data_digest
from phaselab.orchestrator.stages.dataset import check_data


@dataclass(frozen=True)
class StageNode:
    """One distinct stage. ``members`` lists every (cell key, stage name) it stands for."""

    hash: str
    kind: str
    name: str
    config: Mapping[str, Any]
    key: CacheKey
    upstream: Mapping[str, str]              # input name -> upstream hash
    resources: Resources
    launcher: str
    max_retries: int
    members: list[tuple[str, str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        cell, name = self.members[0]
        more = f" (+{len(self.members) - 1} cells)" if len(self.members) > 1 else ""
        return f"{name}[{cell}]{more}"


@dataclass
class Dag:
    spec: GridSpec
    cells: list[Cell]
    nodes: dict[str, StageNode]                # topological order
    code: CodeVersion
    yaml_submitted: str
    yaml_resolved: str
    cell_stages: dict[str, dict[str, str]] = field(default_factory=dict)   # cell key -> name -> hash

    @property
    def grid_hash(self) -> str:
        return sha256_hex(canonical_json({"grid": self.spec.grid, "stages": sorted(self.nodes),
                                          "cells": [c.key for c in self.cells]}))

    def edges(self) -> list[tuple[str, str, str]]:
        return [(up, n.hash, STAGES[n.kind].relation) for n in self.nodes.values() for up in n.upstream.values()]

    def downstream(self, stage_hash: str) -> list[str]:
        return [n.hash for n in self.nodes.values() if stage_hash in n.upstream.values()]


def load_grid(source: str | Path, overrides: Sequence[str] = ()) -> tuple[GridSpec, Marks, str, str]:
    """(spec, marks, submitted text, resolved YAML) for a grid path or shipped name."""
    from phaselab.orchestrator.language.library import resolve_grid_path

    path = resolve_grid_path(source)
    text = read_grid_text(path)
    doc, marks = load_yaml(text, file=str(path))
    if overrides:
        if not isinstance(doc, dict):
            raise GridError([Issue(marks.at(()), "", "a grid must be a mapping")])
        doc = apply_overrides(doc, marks, overrides)
    spec = validate_spec(doc, marks)
    resolved = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
    return spec, marks, text, resolved


def _template_order(spec: GridSpec) -> list[str]:
    order: list[str] = []
    pending = list(spec.stages)
    while pending:
        for name in pending:
            if all(n in order for n in spec.stages[name].needs):
                order.append(name)
                pending.remove(name)
                break
    return order


def _typed(rs: ResolvedStage, marks: Marks, cache: dict[str, Any]) -> dict[str, Any]:
    memo = rs.template.kind + canonical_json(rs.sections)
    if memo in cache:
        return cache[memo]
    try:
        cache[memo] = STAGES[rs.template.kind].normalize(rs.sections)
    except SectionError as err:
        path = map_config_error(rs, err.key, marks)
        where = dotted(path) if path != ("stages", rs.name) else f"stages.{rs.name}.{err.key}"
        hint = (" (YAML 1.1 reads a float like 3e-4 as a string: write 3.0e-4)"
                if re.search(r"got str '[-+]?[\d.]+[eE][-+]?\d+'", err.message) else "")
        raise GridError([Issue(marks.at(path), where, f"{err.message}{hint} (stage {rs.name!r}, cell "
                               f"{rs.cell.key})", err.suggestion)]) from None
    return cache[memo]


def _data_parts(rs: ResolvedStage, config: Mapping[str, Any], marks: Marks) -> dict[str, str]:
    stage = STAGES[rs.template.kind]
    out: dict[str, str] = {}
    try:
        for name, cfg in stage.data_inputs(config).items():
            out[name] = data_digest(cfg)
        problems = check_data(config)   # from metadata: vocabulary, block size, split sizes
    except (OSError, ValueError) as err:
        path = ("stages", rs.name, "data")
        raise GridError([Issue(marks.at(map_config_error(rs, "data", marks)), dotted(path),
                               f"cannot read the dataset: {err}")]) from None
    if problems:
        raise GridError([Issue(marks.at(map_config_error(rs, key, marks)), f"stages.{rs.name}.{key}",
                               f"{msg} (stage {rs.name!r}, cell {rs.cell.key})") for key, msg in problems])
    return out | stage.key_digests(config)


def _inputs(rs: ResolvedStage, spec: GridSpec, hashes: Mapping[str, str]) -> dict[str, str]:
    """Input name -> upstream hash: the upstream's ``Stage.output`` name, else ``<kind><i>``."""
    inputs: dict[str, str] = {}
    others = []
    for need in rs.template.needs:
        kind = spec.stages[need].kind
        output = STAGES[kind].output
        if output is not None:
            inputs[output] = hashes[need]
        else:
            others.append((kind, hashes[need]))
    for i, (kind, h) in enumerate(sorted(others)):
        inputs[f"{kind}{i}"] = h
    return inputs


def _check_eval_extend(rs: ResolvedStage, config: Mapping[str, Any], upstream: Mapping[str, str],
                       nodes: Mapping[str, StageNode], marks: Marks) -> None:
    """An ``extend`` on a stage that does not train rescales RoPE at inference: refuse it at plan
    time when the upstream chain's model (the pretrain/tune config its checkpoint descends from) is not RoPE."""
    if "extend" not in config:
        return
    digest = upstream.get("checkpoint")
    while digest in nodes and "model" not in nodes[digest].config:
        digest = nodes[digest].upstream.get("checkpoint")
    kind = nodes[digest].config["model"]["pe"]["kind"] if digest in nodes else "rope"
    if kind != "rope":   # unknown upstream model: the eval itself refuses it at run time
        # the section's own line: the parent of any of its leaves' origins
        path = next((o[:-1] for k, o in rs.origins.items() if k.startswith("extend.")), ("stages", rs.name))
        raise GridError([Issue(marks.at(path), dotted(path), f"stage {rs.name!r} (cell {rs.cell.key}): "
                               f"'extend' rescales RoPE frequencies at inference, but its upstream "
                               f"model has pe.kind={kind!r} (restrict the stage with 'when')")])


def build_dag(spec: GridSpec, marks: Marks, *, code: CodeVersion | CodeIndex | None = None,
              yaml_submitted: str = "", yaml_resolved: str = "") -> Dag:
    """Expand, convert, hash and deduplicate (see the module docstring). ``code``: the sources
    read now (None), an index whose per-kind import closures key each stage, or one fixed
    version for every stage (tests)."""
    index = code   # None: the sources are read when the first stage key needs them
    per_kind: dict[str, CodeVersion] = {}

    def code_of(kind: str) -> CodeVersion:
        nonlocal index
        if index is None:
            index = code_index()
        if isinstance(index, CodeVersion):
            return index
        if kind not in per_kind:
            per_kind[kind] = index.for_kind(kind)
        return per_kind[kind]

    order = _template_order(spec)
    nodes: dict[str, StageNode] = {}
    cache: dict[str, Any] = {}
    cells = expand_cells(spec, marks)   # an oversized grid is refused here, before any source is read
    cell_stages: dict[str, dict[str, str]] = {}
    issues = IssueList(when_issues(spec, marks))   # every problem of the grid in one error
    for cell in cells:
        resolved = {rs.name: rs for rs in issues.call(resolve_cell, spec, cell, marks) or []}
        hashes: dict[str, str] = {}
        for name in (n for n in order if n in resolved):
            rs = resolved[name]
            config = issues.call(_typed, rs, marks, cache)
            if config is None or any(n not in hashes for n in rs.template.needs):
                continue   # reported; its downstream stages are still checked on their own
            upstream = _inputs(rs, spec, hashes)
            if not STAGES[rs.template.kind].trains and not issues.call(
                    _check_eval_extend, rs, config, upstream, nodes, marks, ok=True):
                continue
            salt = "/".join(s for s in (spec.salt, rs.template.salt) if s)
            key = make_key(kind=rs.template.kind, config=config, upstream=upstream, code=code_of(rs.template.kind),
                           data=_data_parts(rs, config, marks), salt=salt)
            hashes[name] = key.digest
            if key.digest not in nodes:
                nodes[key.digest] = StageNode(
                    hash=key.digest, kind=rs.template.kind, name=name, config=config, key=key,
                    upstream=upstream, resources=STAGES[rs.template.kind].resources(rs.resources),
                    launcher=rs.launcher, max_retries=rs.template.max_retries)
            nodes[key.digest].members.append((cell.key, name))
        cell_stages[cell.key] = hashes
    issues.raise_any()
    if not nodes:
        raise GridError([Issue(marks.at(("stages",)), "stages", "no stage matches any cell")])
    with_auto_gpus(nodes, local_gpu())   # resources.gpus: auto (stages/gpu_packing.py); not in the key
    assert index is not None   # every node's key read it
    full = index if isinstance(index, CodeVersion) else index.version()
    return Dag(spec=spec, cells=cells, nodes=nodes, code=full, yaml_submitted=yaml_submitted,
               yaml_resolved=yaml_resolved, cell_stages=cell_stages)


def plan_grid(source: str | Path, overrides: Iterable[str] = ()) -> Dag:
    """load_grid + build_dag: the whole offline planning step (no catalog, no Ray)."""
    spec, marks, text, resolved = load_grid(source, list(overrides))
    return build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)


def stage_config(source: str | Path, stage: str, overrides: Iterable[str] = (), **axes: Any) -> Mapping[str, Any]:
    """The typed config of ``stage`` in the one cell of grid ``source`` whose axes include
    ``axes`` (``seed=0`` unless given): how benchmarks, the demo and tests take a paper's
    configuration from the grid that runs it rather than from a copy.

    Raises ValueError naming the cells and stages there are when none or several match."""
    dag = plan_grid(source, overrides)
    want = {"seed": 0, **axes}
    cells = {c.key for c in dag.cells if all(c.axes.get(k) == v for k, v in want.items())}
    found = [n for n in dag.nodes.values() if any(c in cells and name == stage for c, name in n.members)]
    if len(found) != 1:
        raise ValueError(f"grid {dag.spec.grid!r}: {len(found)} stages named {stage!r} in the cells "
                         f"with {want} (cells: {[c.key for c in dag.cells]}; stages: "
                         f"{sorted({name for n in dag.nodes.values() for _, name in n.members})})")
    return found[0].config

