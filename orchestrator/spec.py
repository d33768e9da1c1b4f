"""The grid document's schema (pydantic 2, frozen, unknown keys forbidden) and its validation
with errors that name FILE:LINE:COLUMN, the key, and the nearest valid key.

A grid file::

    grid: quickstart                 # name: letters, digits, _ and -
    seeds: [0]                       # an implicit axis 'seed'; ${seed} is available
    axes:
      product: {pe: [rope, pope]}    # every combination
      zip: [{size: [s, m], lr: [1e-3, 5e-4]}]   # lists advanced together
      exclude: [{pe: rope, size: m}] # cells matching every listed axis value are dropped
    defaults:                        # merged under every stage's sections
      model: {preset: tiny, pe: {kind: "${pe}"}}
      data: {kind: text}
      train: {steps: 100}
      resources: {cpus: 1}
    stages:
      pretrain: {kind: pretrain}
      yarn: {kind: finetune, needs: [pretrain], when: {pe: rope}, extend: {...}}
      ppl: {kind: eval, needs: [pretrain], eval: {suite: ppl-by-length}}

Top-level keys starting with ``x-`` are ignored: they hold YAML anchors (``x-ppl: &ppl {...}``)
reused with ``*ppl``.

The model/data/train/extend/eval *contents* are checked later against the workloads' frozen
configs (phaselab.workloads.config.from_dict) by ``grid.resolve``; here they are free mappings.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from phaselab.orchestrator.yamlio import GridError, Issue, Marks, dotted, suggest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"   # names become run names and path parts
AXIS_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"
STAGE_KINDS = ("dataset", "pretrain", "cpt", "finetune", "eval", "analysis", "tune", "noop")
TRAINING_KINDS = ("pretrain", "cpt", "finetune", "tune")   # stages whose output is a checkpoint
SECTIONS = ("model", "data", "train", "extend", "eval", "tune", "noop")

StageKind = Literal["dataset", "pretrain", "cpt", "finetune", "eval", "analysis", "tune", "noop"]
Launcher = Literal["ray_train", "ray_task"]
Scalar = str | int | float | bool | None


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class ResourcesSpec(_Frozen):
    """Per-stage Ray resources. ``num_workers`` is the Ray Train worker count (launcher ray_train);
    each worker gets ``cpus``/``gpus``. ``accelerator`` is a Ray accelerator type (e.g. H200) or a
    custom node resource."""

    cpus: float = Field(1.0, ge=0)
    gpus: float = Field(0.0, ge=0)
    memory_gb: float = Field(4.0, gt=0)
    accelerator: str | None = None
    num_workers: int = Field(1, ge=1)


class DefaultsSpec(_Frozen):
    model: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    train: dict[str, Any] | None = None
    extend: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    tune: dict[str, Any] | None = None
    noop: dict[str, Any] | None = None
    resources: ResourcesSpec | None = None
    launcher: Launcher | None = None


class StageTemplate(_Frozen):
    """One stage per matching cell. ``needs`` names upstream stages of the same cell; ``when``
    restricts the stage to cells whose axis values match (a value or a list of allowed values).
    ``launcher``: ``ray_train`` (Ray Train V2 TorchTrainer, run named by the stage hash; the
    default for training stages) or ``ray_task`` (run_training inside one Ray task: no trainer
    start-up cost, single process — chosen per stage, never as a fallback)."""

    kind: StageKind
    needs: list[str] = Field(default_factory=list)
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    launcher: Launcher | None = None
    resources: ResourcesSpec | None = None
    model: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    train: dict[str, Any] | None = None
    extend: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    tune: dict[str, Any] | None = None
    noop: dict[str, Any] | None = None   # kind noop only (stages/noop.py: sleep_s, tag)
    salt: str = ""
    max_retries: int = Field(3, ge=0)


class AxesSpec(_Frozen):
    product: dict[str, list[Any]] = Field(default_factory=dict)
    zip: list[dict[str, list[Any]]] = Field(default_factory=list)
    exclude: list[dict[str, Any]] = Field(default_factory=list)


class GridSpec(_Frozen):
    grid: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    axes: AxesSpec = Field(default_factory=AxesSpec)
    defaults: DefaultsSpec = Field(default_factory=DefaultsSpec)
    stages: dict[str, StageTemplate] = Field(min_length=1)
    salt: str = ""

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be unique, got {v}")
        return v


def _unwrap(tp: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def fields_at(cls: Any, loc: tuple) -> list[str]:
    """Valid field names of the model reached by following ``loc`` from ``cls`` (for suggestions)."""
    tp: Any = cls
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if part not in tp.model_fields:
                return []
            tp = tp.model_fields[part].annotation
        elif origin in (dict, list):
            tp = typing.get_args(tp)[-1]
        else:
            return []
    tp = _unwrap(tp)
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _issue(err: dict, marks: Marks) -> Issue:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    loc = tuple(p for p in loc if p not in ("str", "int", "float", "bool", "list[any]"))
    if err["type"] == "extra_forbidden":
        valid = fields_at(GridSpec, loc[:-1])
        return Issue(marks.at(loc), dotted(loc), f"unknown key '{loc[-1]}'; valid keys: "
                     f"{', '.join(valid)}", suggest(str(loc[-1]), valid))
    if err["type"] == "literal_error" and loc and loc[-1] == "kind":
        return Issue(marks.at(loc), dotted(loc), f"{err['msg']}, got {err['input']!r}",
                     suggest(str(err["input"]), STAGE_KINDS))
    got = err.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f", got {got!r}"
    return Issue(marks.at(loc), dotted(loc), f"{err['msg']}{shown}")


def validate_spec(doc: Any, marks: Marks) -> GridSpec:
    """Validate the raw document into a frozen GridSpec; all problems in one GridError."""
    if not isinstance(doc, dict):
        raise GridError([Issue(marks.at(()), "", f"a grid must be a mapping, got {type(doc).__name__}")])
    # Top-level ``x-*`` keys hold YAML anchors for reuse (docker-compose's convention); they are
    # not part of the grid.
    doc = {k: v for k, v in doc.items() if not (isinstance(k, str) and k.startswith("x-"))}
    try:
        spec = GridSpec.model_validate(doc)
    except ValidationError as err:
        raise GridError([_issue(e, marks) for e in err.errors()]) from None
    check_structure(spec, marks)
    return spec


def check_structure(spec: GridSpec, marks: Marks) -> None:
    """Cross-field rules: names, axes, ``when``, ``needs`` targets, kinds, and cycles."""
    import re

    issues: list[Issue] = []
    axis_names = _axis_names(spec, marks, issues)
    for name, st in spec.stages.items():
        base = ("stages", name)
        if not re.match(NAME_PATTERN, name):
            issues.append(Issue(marks.at(base), dotted(base),
                                f"stage name {name!r} must match {NAME_PATTERN}"))
        for i, need in enumerate(st.needs):
            if need == name:
                issues.append(Issue(marks.at((*base, "needs", i)), dotted(base), "a stage cannot need itself"))
            elif need not in spec.stages:
                issues.append(Issue(marks.at((*base, "needs", i)), f"{dotted(base)}.needs",
                                    f"needs unknown stage {need!r}", suggest(need, spec.stages)))
        for axis in st.when:
            if axis not in axis_names:
                issues.append(Issue(marks.at((*base, "when", axis)), f"{dotted(base)}.when.{axis}",
                                    f"unknown axis {axis!r}", suggest(axis, axis_names)))
        issues += _kind_rules(spec, name, st, marks)
    evals = [n for n, st in spec.stages.items() if st.kind in ("eval", "analysis")]
    if spec.defaults.extend is not None and evals:   # it would silently rescale every eval's RoPE
        issues.append(Issue(marks.at(("defaults", "extend")), "defaults.extend",
                            f"an extension in defaults would also apply at inference to eval stage(s) "
                            f"{', '.join(evals)}; set 'extend' on the stages that need it"))
    issues += _cycles(spec, marks)
    if issues:
        raise GridError(issues)


def _axis_names(spec: GridSpec, marks: Marks, issues: list[Issue]) -> list[str]:
    import re

    names: list[str] = ["seed"]
    groups: list[tuple[tuple, dict[str, list]]] = [(("axes", "product"), spec.axes.product)]
    groups += [(("axes", "zip", i), z) for i, z in enumerate(spec.axes.zip)]
    for base, group in groups:
        lengths = {len(v) for v in group.values()}
        if base[1] == "zip" and len(lengths) > 1:
            issues.append(Issue(marks.at(base), dotted(base), f"zip lists must have equal lengths, "
                                f"got {({k: len(v) for k, v in group.items()})}"))
        for axis, values in group.items():
            path = (*base, axis)
            if axis in names:
                issues.append(Issue(marks.at(path), dotted(path), f"axis {axis!r} is defined twice"))
            elif not re.match(AXIS_PATTERN, axis):
                issues.append(Issue(marks.at(path), dotted(path), f"axis name {axis!r} must match {AXIS_PATTERN}"))
            if not values:
                issues.append(Issue(marks.at(path), dotted(path), "an axis needs at least one value"))
            names.append(axis)
    for i, rule in enumerate(spec.axes.exclude):
        for axis in rule:
            if axis not in names:
                path = ("axes", "exclude", i, axis)
                issues.append(Issue(marks.at(path), dotted(path), f"unknown axis {axis!r}", suggest(axis, names)))
    return names


def _kind_rules(spec: GridSpec, name: str, st: StageTemplate, marks: Marks) -> list[Issue]:
    base = ("stages", name)
    issues: list[Issue] = []
    ups = [spec.stages[n].kind for n in st.needs if n in spec.stages]
    producers = [k for k in ups if k in TRAINING_KINDS]
    if st.kind in ("pretrain", "tune") and producers:
        issues.append(Issue(marks.at((*base, "needs")), f"{dotted(base)}.needs",
                            "a pretrain stage starts from scratch; use kind 'cpt' or 'finetune' "
                            "to start from another training stage"))
    if st.kind in ("cpt", "finetune", "eval", "analysis") and len(producers) != 1:
        issues.append(Issue(marks.at((*base, "needs") if st.needs else base), f"{dotted(base)}.needs",
                            f"a {st.kind} stage needs exactly one training stage (pretrain/cpt/"
                            f"finetune) to start from, got {len(producers)}"))
    if st.kind in ("eval", "analysis"):
        if st.eval is None and spec.defaults.eval is None:
            issues.append(Issue(marks.at(base), dotted(base), f"a {st.kind} stage needs an 'eval' section"))
        if st.train is not None:   # 'extend' is allowed: an inference-time RoPE rescaling
            issues.append(Issue(marks.at((*base, "train")), f"{dotted(base)}.train",
                                f"a {st.kind} stage takes no 'train' section"))
    if st.kind in TRAINING_KINDS + ("dataset", "noop") and st.eval is not None:
        issues.append(Issue(marks.at((*base, "eval")), f"{dotted(base)}.eval",
                            f"a {st.kind} stage takes no 'eval' section (add an eval stage)"))
    if st.kind == "tune" and st.tune is None and spec.defaults.tune is None:
        issues.append(Issue(marks.at(base), dotted(base), "a tune stage needs a 'tune' section (space, metric, ...)"))
    if st.kind != "tune" and st.tune is not None:
        issues.append(Issue(marks.at((*base, "tune")), f"{dotted(base)}.tune", f"a {st.kind} stage takes no 'tune' section"))
    if st.kind not in ("pretrain", "tune") and st.model is not None:
        issues.append(Issue(marks.at((*base, "model")), f"{dotted(base)}.model",
                            f"a {st.kind} stage takes no 'model' section" + (
                                " (its model comes from the upstream checkpoint)"
                                if st.kind in ("cpt", "finetune") else "")))
    if st.kind in ("pretrain", "dataset", "tune") and st.extend is not None:
        issues.append(Issue(marks.at((*base, "extend")), f"{dotted(base)}.extend",
                            f"context extension belongs to cpt/finetune stages, not {st.kind}"))
    if st.kind == "noop":
        for sec in ("data", "train", "extend"):
            if getattr(st, sec) is not None:
                issues.append(Issue(marks.at((*base, sec)), f"{dotted(base)}.{sec}",
                                    f"a noop stage takes no '{sec}' section (only 'noop')"))
    elif st.noop is not None:
        issues.append(Issue(marks.at((*base, "noop")), f"{dotted(base)}.noop", f"a {st.kind} stage takes no 'noop' section"))
    return issues


def _cycles(spec: GridSpec, marks: Marks) -> list[Issue]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in spec.stages[n].needs:
            if m not in spec.stages or m == n:
                continue
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cyc := visit(m)):
                return cyc
        state[n] = 2
        stack.pop()
        return None

    for n in spec.stages:
        if n not in state and (cyc := visit(n)):
            path = ("stages", cyc[0], "needs")
            return [Issue(marks.at(path), dotted(path), "dependency cycle: " + " -> ".join(cyc))]
    return []
