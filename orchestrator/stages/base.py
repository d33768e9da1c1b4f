"""Stage protocol pieces (DESIGN §3.3): resources, results, the run context, and the strict
conversion of a stage's config sections into the workloads' frozen configs.

A stage's *typed config* is a JSON-safe dict of its sections, each the ``to_dict`` of the
workloads' dataclass (defaults included), so the cache key sees every default (DESIGN §5.4).
Conversion errors come back as :class:`SectionError` (a ``ConfigError`` with the dotted key,
message and suggestion as fields), which the grid layer maps onto the YAML line that set it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from phaselab.catalog.tracking import MetricRecord, Tracker
from phaselab.workloads.config import ConfigError, from_dict, merge, suggest, to_dict


@dataclass(frozen=True, kw_only=True, slots=True)
class Resources:
    """What one stage asks Ray for. For launcher ``ray_train``, ``cpus``/``gpus`` are per worker.
    ``gpus_auto``: the grid left ``gpus`` to the packing rule (``stages/gpu_packing.py``), and
    ``gpus`` is what the rule gave on the GPU the plan was made for, for the reason ``gpus_why``
    (0 and "" until :func:`with_auto_gpus` resolves it)."""

    gpus: float = 0
    cpus: float = 1
    memory_gb: float = 4.0
    accelerator: str | None = None
    num_workers: int = 1
    gpus_auto: bool = False
    gpus_why: str = ""

    def __post_init__(self) -> None:
        for name in ("gpus", "cpus", "memory_gb"):
            if getattr(self, name) < 0:
                raise ValueError(f"resources.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.num_workers < 1:
            raise ValueError(f"resources.num_workers must be >= 1, got {self.num_workers!r}")


@dataclass(frozen=True, slots=True)
class StageResult:
    """What a stage produced. ``artifacts``: name -> local path (the runner adds digests)."""

    status: Literal["succeeded", "failed", "cached"]
    metrics: Mapping[str, float]
    artifacts: Mapping[str, Path]
    records: list[MetricRecord] = field(default_factory=list)
    backend: str | None = None
    # Child stages (Stage.child_kind) to record in the catalog, one dict each: "id", "config"
    # (besides the parent's hash), "folder" (under the stage's out_dir), "completed", "records",
    # "checkpoint" (a path or None), and for an unfinished one "failure_class" and "message".
    children: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class StageContext:
    """Everything ``Stage.run`` may use. It writes only under ``out_dir`` (DESIGN §3.3)."""

    stage_hash: str
    name: str
    config: Mapping[str, Any]
    out_dir: Path
    runs_root: Path
    tracker: Tracker
    upstream: Mapping[str, Mapping[str, Any]]   # input name -> {"hash", "kind", "artifacts": {name: uri}}
    launcher: str = "ray_task"
    resources: Resources = field(default_factory=Resources)

    def upstream_artifact(self, input_name: str, artifact: str, *, required: bool = True) -> Path | None:
        """The upstream's artifact path; a missing one raises, or is None when not ``required``."""
        up = self.upstream.get(input_name)
        if up is None or artifact not in up.get("artifacts", {}):
            if not required:
                return None
            raise ValueError(f"stage {self.name}: no upstream {input_name!r} artifact {artifact!r} "
                             f"(have {sorted(self.upstream)})")
        return Path(up["artifacts"][artifact])


class SectionError(ConfigError):
    """A config section does not convert. Its ``path`` (also ``key``) is dotted from the
    section root with list items as ``.N`` (``train.lr_max``, ``eval.ppl.lengths.0``): the form
    the grid layer maps onto the YAML line that set it."""

    @property
    def key(self) -> str:
        return self.path


def section_error(err: ConfigError, section: str) -> SectionError:
    """A workloads ``ConfigError`` raised while converting ``section`` ("train", "eval.select")
    as a SectionError rooted at the section's first part."""
    key = re.sub(r"\[(\d+)\]", r".\1", err.path) or section
    if key.split(".")[0] != section.split(".")[0]:
        key = f"{section}.{key}"
    return SectionError(key, err.detail, err.suggestion)


def convert_section(cls: type, raw: Mapping[str, Any], path: str) -> dict:
    """``raw`` strictly converted to ``cls`` (a workloads config dataclass) and back to its dict,
    defaults included; errors as SectionError under ``path``."""
    try:
        return to_dict(from_dict(cls, raw, path=path))
    except ConfigError as err:
        raise section_error(err, path) from None


def normalize_model(raw: Mapping[str, Any]) -> dict:
    """``{preset: NAME, **overrides}`` -> the full ModelConfig dict (preset fields overridden)."""
    from phaselab.workloads.models.config import ModelConfig

    raw = dict(raw)
    name = raw.pop("preset", None)
    if name is not None:
        from phaselab.workloads.models import presets

        names = list(presets.PRESET_NAMES)
        try:
            base = presets.preset_fields(name)   # converted once, with the overrides, below
        except (KeyError, ValueError) as err:
            raise SectionError("model.preset", f"unknown model preset {name!r} ({err})",
                               suggest(str(name), names)) from None
        raw = merge(base, raw)
    return convert_section(ModelConfig, raw, "model")


def normalize_data(raw: Mapping[str, Any]) -> dict:
    from phaselab.workloads.data import DataConfig, registered_kinds

    out = convert_section(DataConfig, raw, "data")
    if out["kind"] not in registered_kinds():
        raise SectionError("data.kind", f"unknown data kind {out['kind']!r}; registered: "
                           f"{', '.join(registered_kinds())}", suggest(out["kind"], registered_kinds()))
    return out


def normalize_train(raw: Mapping[str, Any]) -> dict:
    """TrainConfig's dict, plus ``eval_splits`` when it names splits besides "valid" (read by
    ``train.api.periodic_splits``; the default ["valid"] is left out, so keys stay as they were)."""
    from phaselab.workloads.train.config import TrainConfig
    from phaselab.workloads.train.spec import EVAL_SPLITS, parse_eval_splits

    raw = dict(raw)
    splits = raw.pop(EVAL_SPLITS, None)
    out = convert_section(TrainConfig, raw, "train")
    if splits is not None:
        try:
            splits = parse_eval_splits(splits)
        except ConfigError as err:
            raise section_error(err, f"train.{EVAL_SPLITS}") from None
        if splits != ("valid",):
            out[EVAL_SPLITS] = list(splits)
    return out


def normalize_extend(raw: Mapping[str, Any]) -> dict:
    from phaselab.workloads.models.config import ContextExtension

    return convert_section(ContextExtension, raw, "extend")


def normalize_eval(raw: Mapping[str, Any], data: Mapping[str, Any] | None) -> dict:
    """The eval spec handed to ``run_eval``, converted strictly through the evals' own spec
    classes (defaults included). Its ``data`` defaults to the stage's data section."""
    import importlib

    from phaselab.workloads.evals.api import SUITE_TABLE

    spec = dict(raw)
    select = _normalize_select(spec.pop("select", None))
    suite = spec.get("suite")
    if suite not in SUITE_TABLE:
        raise SectionError("eval.suite", f"unknown eval suite {suite!r}; expected one of "
                           f"{', '.join(SUITE_TABLE)}", suggest(str(suite), SUITE_TABLE))
    if "data" not in spec and data is not None:
        spec["data"] = dict(data)
    entry = SUITE_TABLE[suite]
    out = convert_section(entry.spec, spec, "eval")
    if "data" in out:
        out["data"] = _convert_data_in_eval(out["data"])
    if entry.options is not None:
        module, cls = entry.options_config.split(":")
        out[entry.options] = convert_section(getattr(importlib.import_module(module), cls),
                                             out[entry.options] or {}, f"eval.{entry.options}")
    if select is not None:
        out["select"] = select
    return out


def _normalize_select(raw: Any) -> dict | None:
    """``eval.select`` as its SelectConfig dict (defaults included, DESIGN §5.4), or None for the
    default ``last``: an eval that selects the final checkpoint keeps the key it had before
    selection existed."""
    from phaselab.workloads.evals.api import SelectConfig, parse_select

    try:
        select = parse_select(raw, path="eval.select")
    except ConfigError as err:
        raise section_error(err, "eval.select") from None
    return None if select == SelectConfig() else to_dict(select)


def _convert_data_in_eval(raw: Any) -> dict:
    try:
        return normalize_data(raw)
    except SectionError as err:
        raise SectionError("eval." + err.key, err.message, err.suggestion) from None


Launcher = Literal["ray_train", "ray_task"]
AUTO_GPUS = "auto"   # resources.gpus left to the packing rule (stages/gpu_packing.py); the default


class Stage:
    """One stage kind. A subclass declares what the grid schema, the DAG, the controller, the
    views, ``verify`` and ``gc`` need to know about its kind, and implements ``normalize``
    (sections -> typed config) and ``run``; nothing outside its module branches on its name.
    The registry (``phaselab.orchestrator.stages``) holds one instance per kind.

    Declarations:
        kind: its name in grids and in the catalog (it enters the cache key).
        sections: the config sections it reads; a grid may set no other on it.
        required: sections a grid must give it (on the stage or in ``defaults``).
        not_from_defaults: section -> why that section must be set on the stage itself.
        starts_from: "scratch" (no checkpoint-producing upstream allowed), "checkpoint"
            (exactly one), or None (no rule).
        relation: the lineage edge from each upstream (catalog schema RELATIONS).
        output: the input name downstream stages receive this stage under ("checkpoint",
            "dataset"); None: ``<kind><i>``. It enters the downstream cache keys.
        default_launcher: the launcher when the grid names none.
        child_kind: catalog kind of the child stages its result lists (StageResult.children).
        storage_roots: folders under the runs root its launchers share between stages.
        notes: section -> why this kind takes no such section (appended to that error).
        scores: its records are evaluation scores (results-table columns per context length
            and task), not a run's final values.
    """

    kind: ClassVar[str]
    sections: ClassVar[tuple[str, ...]]
    required: ClassVar[tuple[str, ...]] = ()
    not_from_defaults: ClassVar[Mapping[str, str]] = {}
    starts_from: ClassVar[Literal["scratch", "checkpoint"] | None] = None
    relation: ClassVar[str] = "uses"
    output: ClassVar[str | None] = None
    default_launcher: ClassVar[Launcher] = "ray_task"
    child_kind: ClassVar[str | None] = None
    storage_roots: ClassVar[tuple[str, ...]] = ()
    notes: ClassVar[Mapping[str, str]] = {}
    scores: ClassVar[bool] = False

    @property
    def produces_checkpoint(self) -> bool:
        """Its output is a model checkpoint that cpt/finetune/eval stages can start from."""
        return self.output == "checkpoint"

    @property
    def trains(self) -> bool:
        """It trains (so the grid's seed axis drives its ``train.seed``)."""
        return "train" in self.sections

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        """Raw merged sections -> typed config dict (raises SectionError)."""
        out: dict[str, Any] = {}
        if "data" in self.sections and "data" in sections:
            out["data"] = normalize_data(sections["data"])
        if "model" in self.sections and "model" in sections:
            out["model"] = normalize_model(sections["model"])
        if "train" in self.sections:
            out["train"] = normalize_train(sections.get("train", {}))
        if "extend" in self.sections and sections.get("extend") is not None:
            out["extend"] = normalize_extend(sections["extend"])
        return out

    def data_inputs(self, config: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        """Data configs whose digests enter the key: name -> DataConfig dict."""
        return {"data": config["data"]} if "data" in config else {}

    def key_digests(self, config: Mapping[str, Any]) -> dict[str, str]:
        """Digests of further inputs the config names (files shipped with the code), by name;
        they enter the key beside the data digests."""
        return {}

    def launcher_for(self, resources: Mapping[str, Any], sections: Mapping[str, Any]) -> Launcher:
        """The launcher when the grid names none, from the stage's merged (raw) resources and
        sections; ``default_launcher`` unless a kind decides per stage."""
        return self.default_launcher

    @property
    def uses_gpu(self) -> bool:
        """It trains or evaluates a model, so ``resources.gpus: auto`` may give it a GPU."""
        return any(s in self.sections for s in ("model", "train", "eval"))

    def resources(self, res: Mapping[str, Any]) -> Resources:
        """The grid's merged ``resources`` mapping as Resources; ``gpus`` unset or ``auto`` is
        left to the packing rule (``gpus_auto``; resolved over the whole DAG by
        :func:`with_auto_gpus`, which knows each stage's model and the GPU)."""
        res = dict(res)
        gpus = res.pop("gpus", AUTO_GPUS)
        if gpus == AUTO_GPUS:
            return Resources(**res, gpus=0, gpus_auto=True)
        return Resources(**res, gpus=gpus)

    def auto_gpus(self, res: Resources, config: Mapping[str, Any], model: Mapping[str, Any] | None,
                  launcher: str, gpu: Mapping[str, Any] | None) -> Resources:
        """``res`` with an ``auto`` gpus resolved by the packing rule (``gpu_packing.resolve``)."""
        from dataclasses import replace

        from phaselab.orchestrator.stages import gpu_packing

        if not res.gpus_auto:
            return res
        gpus, why = gpu_packing.resolve(uses_gpu=self.uses_gpu, config=config, model=model,
                                        launcher=launcher, gpu=gpu)
        return replace(res, gpus=gpus, gpus_why=why)

    def demand(self, res: Resources, config: Mapping[str, Any]) -> tuple[float, float]:
        """(CPUs, GPUs) the stage occupies on the cluster while it runs, all workers included."""
        return res.cpus * res.num_workers, res.gpus * res.num_workers

    def ray_options(self, res: Resources, launcher: str) -> dict[str, Any]:
        """Resource options of the stage's own Ray task (what that task itself holds)."""
        opts: dict[str, Any] = {"num_cpus": res.cpus, "num_gpus": res.gpus, "memory": int(res.memory_gb * 2**30)}
        if res.accelerator:
            opts["accelerator_type"] = res.accelerator
        return opts

    def training_spec(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """The ``run_training`` spec when the stage is exactly one training run (its steps can
        be estimated and re-run by ``verify``); None otherwise."""
        return None

    def intermediate_checkpoints(self, runs_root: Path, stage_hash: str) -> list[Path]:
        """Checkpoint folders of a finished stage that ``gc`` may delete unless referenced."""
        return []

    def run(self, ctx: StageContext) -> StageResult:   # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}.run")
