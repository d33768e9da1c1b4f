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

Which stage kinds exist, which config sections each takes, and the per-kind rules (what a kind
needs upstream, which sections it requires or refuses) come from the stage registry
(``phaselab.orchestrator.stages``): the schema has one optional mapping per section that some
registered kind reads (:func:`grid_model`). The sections' *contents* are checked later against
the workloads' frozen configs (phaselab.workloads.config.from_dict), when ``dag.build_dag``
converts each stage's merged sections; here they are free mappings.
"""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from phaselab.orchestrator.language.yamlio import GridError, Issue, Marks, dotted
from phaselab.orchestrator.stages import STAGES, section_names
from phaselab.workloads.config import suggest

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"   # names become run names and path parts
AXIS_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"

Launcher = Literal["ray_train", "ray_task"]
Scalar = str | int | float | bool | None


def _not_bool(value: Any) -> Any:
    """YAML's ``true`` is not the number 1: a boolean where a number goes is an error (pydantic's
    lax mode would read it as 1, and ``seeds: [true]`` would run seed 1)."""
    if isinstance(value, bool):
        raise PydanticCustomError("bool_number", "a boolean is not a number")
    return value


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


def _gpus(value: Any) -> Any:
    """``gpus``: ``auto`` or a number >= 0 (one message for anything else, not one per union arm)."""
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == float("inf"):
        raise PydanticCustomError("gpus", "gpus is 'auto' or a finite number of GPUs >= 0",
                                  {"value": value})
    return float(value)


class ResourcesSpec(_Frozen):
    """Per-stage Ray resources. ``num_workers`` is the Ray Train worker count (launcher ray_train);
    each worker gets ``cpus``/``gpus``. ``accelerator`` is a Ray accelerator type (e.g. H200) or a
    custom node resource. ``gpus: auto`` (the default) packs stages that fit onto one GPU. A number always wins. Under
    ``auto`` a stage gets 0 when its kind uses no model (``dataset``, ``noop``), its device is
    ``cpu`` (``train.device`` / ``eval.device``) or there is no GPU where it runs; 1 per worker
    under Ray Train (``launcher: ray_train``); otherwise ``1/k`` of a GPU, ``k = min(4,
    floor(0.8 x GPU memory / the stage's estimated memory))``, at least 1: 1, 1/2, 1/3 or 1/4.
    The estimate comes from the model config (its own, or for an eval its upstream's: weights,
    AdamW state, activations at the stage's batch and length, 2 GiB per process). The GPU is the
    local one (``nvidia-smi``) for a plan or a local run, the cluster's ``accelerator_type`` for
    a ``RAY_ADDRESS`` cluster; ``PHASELAB_GPU_MEMORY_GB`` sets its memory. ``phaselab plan``
    shows each fraction and why. Packed stages overlap their kernels only under CUDA MPS
    (``deploy/gpu/run_grid.sh --mps``); the rule and its reasons: ``stages/gpu_packing.py``."""

    cpus: float = Field(1.0, ge=0, allow_inf_nan=False)
    gpus: float | Literal["auto"] = "auto"
    memory_gb: float = Field(4.0, gt=0, allow_inf_nan=False)
    accelerator: str | None = None
    num_workers: int = Field(1, ge=1)

    _numbers = field_validator("cpus", "memory_gb", "num_workers", mode="before")(_not_bool)
    _gpus_value = field_validator("gpus", mode="before")(_gpus)


class DefaultsSpec(_Frozen):
    """Merged under every stage; plus one optional mapping per config section (:func:`grid_model`)."""

    resources: ResourcesSpec | None = None
    launcher: Launcher | None = None

    def section(self, name: str) -> dict[str, Any] | None:
        return getattr(self, name, None)


class StageTemplate(_Frozen):
    """One stage per matching cell. ``needs`` names upstream stages of the same cell; ``when``
    restricts the stage to cells whose axis values match (a value or a list of allowed values).
    ``launcher``: ``ray_train`` (Ray Train V2 TorchTrainer, run named by the stage hash; the
    default for training stages) or ``ray_task`` (run_training inside one Ray task: no trainer
    start-up cost, single process — chosen per stage, never as a fallback). Its config sections
    are fields added per registered section (:func:`grid_model`)."""

    kind: str
    needs: list[str] = Field(default_factory=list)
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    launcher: Launcher | None = None
    resources: ResourcesSpec | None = None
    salt: str = ""
    max_retries: int = Field(3, ge=0)

    _numbers = field_validator("max_retries", mode="before")(_not_bool)

    @field_validator("kind")
    @classmethod
    def _registered(cls, v: str) -> str:
        if v not in STAGES:
            raise PydanticCustomError("stage_kind", "unknown stage kind '{kind}'; expected one of {kinds}",
                                      {"kind": v, "kinds": ", ".join(STAGES)})
        return v

    def section(self, name: str) -> dict[str, Any] | None:
        return getattr(self, name, None)


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

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_not_bool(cls, v: Any) -> Any:
        if isinstance(v, list):
            for i, seed in enumerate(v):
                if isinstance(seed, bool):
                    raise PydanticCustomError("bool_number", "a boolean is not a number", {"item": i})
        return v

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be unique, got {v}")
        return v


@functools.cache
def _grid_model(sections: tuple[str, ...]) -> type[GridSpec]:
    fields: dict[str, Any] = {sec: (dict[str, Any] | None, None) for sec in sections}
    template = create_model("StageTemplate", __base__=StageTemplate, __module__=__name__, **fields)
    defaults = create_model("DefaultsSpec", __base__=DefaultsSpec, __module__=__name__, **fields)
    return create_model("GridSpec", __base__=GridSpec, __module__=__name__,
                        defaults=(defaults, Field(default_factory=defaults)),
                        stages=(dict[str, template], Field(min_length=1)))


def grid_model() -> type[GridSpec]:
    """The GridSpec model with one optional mapping per config section of the registered stage
    kinds, on each stage and in ``defaults`` (built once per set of sections)."""
    return _grid_model(section_names())


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


def _issue(err: dict, marks: Marks, model: type[GridSpec]) -> Issue:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    loc = tuple(p for p in loc if p not in ("str", "int", "float", "bool", "list[any]"))
    if err["type"] == "extra_forbidden":
        valid = fields_at(model, loc[:-1])
        return Issue(marks.at(loc), dotted(loc), f"unknown key '{loc[-1]}'; valid keys: "
                     f"{', '.join(valid)}", suggest(str(loc[-1]), valid))
    if err["type"] == "stage_kind":
        return Issue(marks.at(loc), dotted(loc), err["msg"], suggest(str(err["input"]), STAGES))
    if err["type"] == "bool_number" and "item" in (err.get("ctx") or {}):   # a list's item
        loc = (*loc, err["ctx"]["item"])
        return Issue(marks.at(loc), dotted(loc), err["msg"])
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
    model = grid_model()
    try:
        spec = model.model_validate(doc)
    except ValidationError as err:
        raise GridError([_issue(e, marks, model) for e in err.errors()]) from None
    check_structure(spec, marks)
    return spec


def check_structure(spec: GridSpec, marks: Marks) -> None:
    """Cross-field rules: names, axes, ``when``, ``needs`` targets, kinds, and cycles."""
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
        issues += _upstream_rules(spec, name, st, marks) + _section_rules(spec, name, st, marks)
    issues += _defaults_rules(spec, marks) + _cycles(spec, marks)
    if issues:
        raise GridError(issues)


def _axis_names(spec: GridSpec, marks: Marks, issues: list[Issue]) -> list[str]:
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
            if base[1] == "product":   # a zip repeats a value legitimately: its tuples must differ
                issues += _duplicate_values(path, values, marks)
            names.append(axis)
        if base[1] == "zip" and len(lengths) == 1:
            issues += _duplicate_values(base, [list(t) for t in zip(*group.values())], marks)
    for i, rule in enumerate(spec.axes.exclude):
        for axis in rule:
            if axis not in names:
                path = ("axes", "exclude", i, axis)
                issues.append(Issue(marks.at(path), dotted(path), f"unknown axis {axis!r}", suggest(axis, names)))
    return names


def _duplicate_values(path: tuple, values: list[Any], marks: Marks) -> list[Issue]:
    """A value listed twice would make two cells with one key (the same stages, run once, counted
    twice): refused at the second occurrence. ``true`` and ``1`` are different values here."""
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        try:
            canon = json.dumps(value, sort_keys=True, default=str) + type(value).__name__
        except (TypeError, ValueError):   # mixed key types cannot be sorted: compare the text
            canon = repr(value)
        if canon in seen:
            return [Issue(marks.at((*path, i)), dotted((*path, i)), f"value {value!r} is listed twice "
                          f"(also at index {seen[canon]}); each axis value makes its own cells")]
        seen[canon] = i
    return []


def _upstream_rules(spec: GridSpec, name: str, st: StageTemplate, marks: Marks) -> list[Issue]:
    """What the stage's kind starts from (``Stage.starts_from``) against its checkpoint-producing
    upstreams."""
    stage, base = STAGES[st.kind], ("stages", name)
    producers = [n for n in st.needs if n in spec.stages and STAGES[spec.stages[n].kind].produces_checkpoint]
    if stage.starts_from == "scratch" and producers:
        continuing = " or ".join(repr(s.kind) for s in STAGES.values() if s.starts_from == "checkpoint" and s.trains)
        return [Issue(marks.at((*base, "needs")), f"{dotted(base)}.needs",
                      f"a {st.kind} stage starts from scratch; use kind {continuing} to start from "
                      f"another training stage")]
    if stage.starts_from == "checkpoint" and len(producers) != 1:
        kinds = "/".join(s.kind for s in STAGES.values() if s.produces_checkpoint)
        return [Issue(marks.at((*base, "needs") if st.needs else base), f"{dotted(base)}.needs",
                      f"a {st.kind} stage needs exactly one training stage ({kinds}) to start from, "
                      f"got {len(producers)}")]
    return []


def _section_rules(spec: GridSpec, name: str, st: StageTemplate, marks: Marks) -> list[Issue]:
    """The sections the stage's kind requires (on the stage or in defaults) and those it takes not."""
    stage, base = STAGES[st.kind], ("stages", name)
    issues = [Issue(marks.at(base), dotted(base), f"a {st.kind} stage needs {_article(sec)} '{sec}' section")
              for sec in stage.required if st.section(sec) is None and spec.defaults.section(sec) is None]
    for sec in section_names():
        if sec not in stage.sections and st.section(sec) is not None:
            why = stage.notes.get(sec) or f"it takes {', '.join(repr(s) for s in stage.sections) or 'none'}"
            issues.append(Issue(marks.at((*base, sec)), f"{dotted(base)}.{sec}",
                                f"a {st.kind} stage takes no '{sec}' section ({why})"))
    return issues


def _defaults_rules(spec: GridSpec, marks: Marks) -> list[Issue]:
    """A section in defaults that some stage's kind must get on the stage itself
    (``Stage.not_from_defaults``)."""
    issues = []
    for sec in section_names():
        if spec.defaults.section(sec) is None:
            continue
        refusing = {n: STAGES[st.kind].not_from_defaults[sec] for n, st in spec.stages.items()
                    if sec in STAGES[st.kind].not_from_defaults}
        if refusing:
            issues.append(Issue(marks.at(("defaults", sec)), f"defaults.{sec}",
                                f"'{sec}' in defaults would also apply to stage(s) {', '.join(refusing)} "
                                f"({next(iter(refusing.values()))}); set '{sec}' on the stages that need it"))
    return issues


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


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
