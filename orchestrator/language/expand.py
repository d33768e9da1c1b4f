"""Grid expansion: axes (product, zip, exclude) x seeds -> cells; per cell, the stage templates
that apply, with ``defaults`` merged under each stage's sections and ``${axis}`` interpolated.

The typed conversion of each section (model preset + overrides, data, train, extend, eval) into
the workloads' frozen configs is done by ``phaselab.orchestrator.stages`` and its errors come
back here to be mapped onto the YAML line that set the offending key.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from phaselab.orchestrator.language import limits
from phaselab.orchestrator.language.spec import GridSpec, StageTemplate
from phaselab.orchestrator.language.yamlio import GridError, Issue, Marks, YamlPath, dotted, suggest
from phaselab.orchestrator.stages import STAGES

_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.-]*)\}")


def kind_sections(kind: str) -> tuple[str, ...]:
    """Which config sections a stage kind reads (DESIGN §3.3: a stage receives only its own
    config); e.g. cpt/finetune take their model from the upstream checkpoint."""
    return STAGES[kind].sections


@dataclass(frozen=True, slots=True)
class Cell:
    """One point of the grid: axis name -> value (``seed`` included). ``key`` is canonical."""

    axes: Mapping[str, Any]

    @property
    def key(self) -> str:
        return ",".join(f"{k}={v}" if isinstance(v, str) else
                        f"{k}={json.dumps(v, sort_keys=True, separators=(',', ':'))}" for k, v in self.axes.items())


@dataclass(frozen=True, slots=True)
class ResolvedStage:
    """A stage template instantiated for one cell: merged, interpolated sections (still raw
    mappings; typed conversion happens in ``stages``) plus where each leaf came from."""

    name: str
    cell: Cell
    template: StageTemplate
    sections: Mapping[str, Any]
    origins: Mapping[str, YamlPath] = field(repr=False)   # "train.lr" -> ("defaults", "train", "lr")
    resources: Mapping[str, Any] = field(default_factory=dict)
    launcher: str = "ray_task"


def _matches(axes: Mapping[str, Any], rule: Mapping[str, Any]) -> bool:
    for k, want in rule.items():
        allowed = want if isinstance(want, list) else [want]
        if axes.get(k) not in allowed:
            return False
    return True


def check_size(spec: GridSpec, marks: Marks, *, max_cells: int | None = None,
               max_stages: int | None = None) -> int:
    """Refuse a grid whose cell or stage count exceeds its maximum, from the axis lengths alone
    (before any cell exists). Returns the cell count before ``exclude``: what expansion visits."""
    max_cells = limits.max_cells() if max_cells is None else max_cells
    max_stages = limits.max_stages() if max_stages is None else max_stages
    issues: list[Issue] = []
    if len(spec.seeds) > limits.MAX_SEEDS:
        issues.append(Issue(marks.at(("seeds",)), "seeds", f"{len(spec.seeds)} seeds; at most {limits.MAX_SEEDS}"))
    else:
        bad = [(i, why) for i, seed in enumerate(spec.seeds) if (why := limits.out_of_range("seed", seed))]
        issues += [Issue(marks.at(("seeds", i)), f"seeds.{i}", why) for i, why in bad[:1]]
    groups = [(("axes", "product", k), v) for k, v in spec.axes.product.items()]
    groups += [(("axes", "zip", i, k), v) for i, z in enumerate(spec.axes.zip) for k, v in z.items()]
    for path, values in groups:
        if len(values) > limits.MAX_SWEEP_VALUES:
            issues.append(Issue(marks.at(path), dotted(path), f"{len(values)} values; an axis takes at "
                                f"most {limits.MAX_SWEEP_VALUES}"))
    cells = len(spec.seeds)
    for values in spec.axes.product.values():
        cells *= len(values)
    for group in spec.axes.zip:
        cells *= min((len(v) for v in group.values()), default=1)
    where = ("axes",) if spec.axes.product or spec.axes.zip else ("seeds",)
    if cells > max_cells:
        issues.append(Issue(marks.at(where), dotted(where), f"the grid has {cells} cells (axes x seeds); "
                            f"at most {max_cells} (raise it with --max-cells or {limits.CELLS_ENV})"))
    elif cells * len(spec.stages) > max_stages:
        issues.append(Issue(marks.at(("stages",)), "stages", f"{cells} cells x {len(spec.stages)} stages = "
                            f"{cells * len(spec.stages)} stage instances; at most {max_stages} "
                            f"(raise it with {limits.STAGES_ENV})"))
    if issues:
        raise GridError(issues)
    return cells


def _axis_values(spec: GridSpec, marks: Marks) -> dict[str, tuple[list[Any], bool]]:
    """axis -> (the values it takes, whether the command line set them)."""
    out: dict[str, tuple[list[Any], bool]] = {"seed": (list(spec.seeds), _from_override(marks, ("seeds",)))}
    out |= {k: (list(v), _from_override(marks, ("axes", "product", k))) for k, v in spec.axes.product.items()}
    for i, group in enumerate(spec.axes.zip):
        out |= {k: (list(v), _from_override(marks, ("axes", "zip", i, k))) for k, v in group.items()}
    return out


def _from_override(marks: Marks, path: YamlPath) -> bool:
    return marks.at(path).file.startswith("<override")


class IssueList:
    """Grid problems gathered across stages and cells, so that one run reports them all; the
    same problem found in several cells is listed once."""

    def __init__(self, issues: list[Issue] | None = None) -> None:
        self._found: dict[tuple[str, str], list[Issue]] = {}
        for issue in issues or []:
            self.add(issue)

    def add(self, issue: Issue) -> None:
        """Keep ``issue``; one at the same place and key as a kept one (the same setting, seen
        from another cell) only counts."""
        self._found.setdefault((str(issue.mark), issue.key), []).append(issue)

    @property
    def issues(self) -> list[Issue]:
        out = []
        for same in self._found.values():
            first = same[0]
            more = f" (and {len(same) - 1} more cells)" if len(same) > 1 else ""
            out.append(Issue(first.mark, first.key, first.message + more, first.suggestion))
        return out

    def call(self, fn: Callable[..., Any], *args: Any, ok: Any = None) -> Any:
        """``fn(*args)``, or None when it raised a GridError, whose issues are kept. ``ok``
        replaces a None result of a successful call (for functions that only check)."""
        try:
            out = fn(*args)
        except GridError as err:
            for issue in err.issues:
                self.add(issue)
            return None
        return ok if out is None else out

    def raise_any(self) -> None:
        if self._found:
            raise GridError(self.issues)


def when_issues(spec: GridSpec, marks: Marks) -> list[Issue]:
    """A ``when`` value that its axis never takes would silently drop the stage from every cell:
    most often a typo, reported with the nearest value. Values the command line narrowed an axis
    away from are allowed (``axes.product.pe=[pope]`` drops the RoPE-only stages on purpose)."""
    axes = _axis_values(spec, marks)
    issues = []
    for name, st in spec.stages.items():
        for axis, want in st.when.items():
            if axis not in axes:   # an unknown axis is reported by the schema's checks
                continue
            values, narrowed = axes[axis]
            for i, v in enumerate(want if isinstance(want, list) else [want]):
                if narrowed or v in values:   # the test _matches applies
                    continue
                path = ("stages", name, "when", axis, *((i,) if isinstance(want, list) else ()))
                shown = ", ".join(map(repr, values))
                near = suggest(str(v), [str(x) for x in values]) if isinstance(v, str) else None
                issues.append(Issue(marks.at(path), dotted(path), f"axis {axis!r} never takes the value {v!r} "
                                    f"(its values: {shown}), so stage {name!r} would run in no cell", near))
    return issues


def expand_cells(spec: GridSpec, marks: Marks | None = None) -> list[Cell]:
    """All cells in a stable order: product axes (in file order) x zip groups x seeds, minus
    ``exclude`` matches. Example: product {pe: [rope, pope]}, seeds [0, 1] -> 4 cells. The
    counts are checked first (:func:`check_size`)."""
    check_size(spec, marks if marks is not None else Marks("<grid>"))
    prod_names = list(spec.axes.product)
    prod = [dict(zip(prod_names, combo)) for combo in itertools.product(*spec.axes.product.values())]
    zips = [[dict(zip(g, vals)) for vals in zip(*g.values())] for g in spec.axes.zip]
    cells: list[Cell] = []
    for p in prod:
        for combo in itertools.product(*zips) if zips else [()]:
            for seed in spec.seeds:
                axes = dict(p)
                for z in combo:
                    axes.update(z)
                axes["seed"] = seed
                if not any(_matches(axes, rule) for rule in spec.axes.exclude):
                    cells.append(Cell(axes=axes))
    return cells


def check_ranges(stage: ResolvedStage, marks: Marks) -> None:
    """Refuse an integer of a stage's sections outside its documented range (``limits``), at the
    YAML line that set it. Values are only read: the cache key does not change."""
    issues: list[Issue] = []
    for name, value in limits.iter_leaves(dict(stage.sections), ""):
        why = limits.out_of_range(name.rpartition(".")[2], value) or limits.not_finite(value)
        if why is None:
            continue
        path = map_config_error(stage, name, marks)
        issues.append(Issue(marks.at(path), dotted(path), f"{why} (stage {stage.name!r}, cell {stage.cell.key})"))
    if issues:
        raise GridError(issues)


def deep_merge(base: Any, over: Any, base_path: YamlPath, over_path: YamlPath,
               origins: dict[str, YamlPath], prefix: str) -> Any:
    """Merge ``over`` onto ``base`` (mappings recursively, anything else replaced), recording for
    each leaf's dotted name the YAML path it came from."""
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        out = {}
        for k in list(base) + [k for k in over if k not in base]:
            name = f"{prefix}.{k}" if prefix else str(k)
            if k in over and k in base:
                out[k] = deep_merge(base[k], over[k], (*base_path, k), (*over_path, k), origins, name)
            elif k in over:
                out[k] = _record(over[k], (*over_path, k), origins, name)
            else:
                out[k] = _record(base[k], (*base_path, k), origins, name)
        return out
    return _record(over, over_path, origins, prefix)


def _record(value: Any, path: YamlPath, origins: dict[str, YamlPath], prefix: str) -> Any:
    origins[prefix] = path
    if isinstance(value, Mapping):
        for k, v in value.items():
            _record(v, (*path, k), origins, f"{prefix}.{k}")
    return value


def interpolate(value: Any, axes: Mapping[str, Any], name: str, origins: Mapping[str, YamlPath],
                marks: Marks) -> Any:
    """Replace ``${axis}`` with the cell's value: a whole-string reference keeps the value's type
    (``"${lr}"`` -> 0.001), a reference inside a longer string is formatted into it. ``name`` is
    the dotted config name of ``value``; ``origins`` maps it to the YAML path for errors."""
    if isinstance(value, Mapping):
        return {k: interpolate(v, axes, f"{name}.{k}", origins, marks) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, axes, name, origins, marks) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value
    for ref in _INTERP.findall(value):
        if ref not in axes:
            path = origins.get(name, (name,))
            raise GridError([Issue(marks.at(path), dotted(path), f"unknown axis '${{{ref}}}' in "
                                   f"{value!r}", suggest(ref, axes))])
    whole = _INTERP.fullmatch(value)
    if whole:
        return axes[whole.group(1)]
    return _INTERP.sub(lambda m: str(axes[m.group(1)]), value)


def resolve_cell(spec: GridSpec, cell: Cell, marks: Marks) -> list[ResolvedStage]:
    """The stages of one cell in file order; checks that every ``needs`` target is present."""
    present = {n for n, st in spec.stages.items() if _matches(cell.axes, st.when)}
    out: list[ResolvedStage] = []
    for name, st in spec.stages.items():
        if name not in present:
            continue
        for need in st.needs:
            if need not in present:
                path = ("stages", name, "needs")
                raise GridError([Issue(marks.at(path), dotted(path), f"in cell {cell.key}, stage "
                                       f"{name!r} needs {need!r}, which its 'when' excludes")])
        origins: dict[str, YamlPath] = {}
        sections: dict[str, Any] = {}
        for sec in kind_sections(st.kind):
            base, over = getattr(spec.defaults, sec), getattr(st, sec)
            if base is None and over is None:
                continue
            merged = deep_merge(base or {}, over or {}, ("defaults", sec), ("stages", name, sec),
                                origins, sec)
            sections[sec] = interpolate(merged, cell.axes, sec, origins, marks)
        stage = STAGES[st.kind]
        if stage.trains:
            train = sections.setdefault("train", {})
            if "seed" not in train:   # the grid's seed axis drives the training seed
                train["seed"] = cell.axes["seed"]
                origins["train.seed"] = ("seeds",)
        res = {**(spec.defaults.resources.model_dump(exclude_unset=True) if spec.defaults.resources else {}),
               **(st.resources.model_dump(exclude_unset=True) if st.resources else {})}
        launcher = st.launcher or spec.defaults.launcher or stage.launcher_for(res, sections)
        rs = ResolvedStage(name=name, cell=cell, template=st, sections=sections,
                           origins=origins, resources=res, launcher=launcher)
        check_ranges(rs, marks)
        out.append(rs)
    return out


def map_config_error(stage: ResolvedStage, dotted_key: str, marks: Marks) -> YamlPath:
    """YAML path for a dotted config key reported by the workloads' converter (``train.lr_max``):
    the leaf's origin if known, else the nearest recorded ancestor, else the stage itself."""
    key = dotted_key
    while key:
        if key in stage.origins:
            return stage.origins[key]
        parent, _, last = key.rpartition(".")
        if parent in stage.origins:   # an unknown key sits inside a section set by this path
            origin = stage.origins[parent]
            return (*origin, last) if (*origin, last) in marks.by_path else origin
        key = parent
    return ("stages", stage.name)
