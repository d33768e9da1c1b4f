"""Stage protocol pieces (DESIGN §3.3): resources, results, the run context, and the strict
conversion of a stage's config sections into the workloads' frozen configs.

A stage's *typed config* is a JSON-safe dict of its sections, each the ``to_dict`` of the
workloads' dataclass (defaults included), so the cache key sees every default (DESIGN §5.4).
Conversion errors come back as :class:`SectionError` with the dotted key, which the grid layer
maps onto the YAML line that set it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from phaselab.catalog.tracking import MetricRecord, Tracker


@dataclass(frozen=True, kw_only=True, slots=True)
class Resources:
    """What one stage asks Ray for. For launcher ``ray_train``, ``cpus``/``gpus`` are per worker."""

    gpus: float = 0
    cpus: float = 1
    memory_gb: float = 4.0
    accelerator: str | None = None
    num_workers: int = 1

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
    children: list[dict[str, Any]] = field(default_factory=list)   # tune: one dict per trial


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


class SectionError(ValueError):
    """A config section does not convert; ``key`` is the dotted path (``train.lr_max``)."""

    def __init__(self, key: str, message: str, suggestion: str | None = None) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message, self.suggestion = key, message, suggestion


_PATH_RE = re.compile(r"^([A-Za-z_][\w.\[\]-]*): (.*)$", re.DOTALL)
_MEAN_RE = re.compile(r"did you mean '([^']+)'\?")


def section_error(err: Exception, default_key: str) -> SectionError:
    """Turn a workloads ``ConfigError`` ("train.lrr: unknown key ...; did you mean 'lr'?") into a
    SectionError with a dotted key (list indices ``a[2]`` become ``a.2``)."""
    text = str(err)
    m = _PATH_RE.match(text)
    key, msg = (m.group(1), m.group(2)) if m else (default_key, text)
    key = re.sub(r"\[(\d+)\]", r".\1", key)
    if not key.startswith(default_key.split(".")[0]):
        key = f"{default_key}.{key}" if key != "<root>" else default_key
    sug = _MEAN_RE.search(msg)
    msg = re.sub(r";? ?did you mean '[^']+'\?", "", msg)
    return SectionError(key, msg, sug.group(1).rsplit(".", 1)[-1] if sug else None)


def _convert(cls: type, raw: Mapping[str, Any], path: str) -> dict:
    from phaselab.workloads.config import ConfigError, from_dict, to_dict

    try:
        return to_dict(from_dict(cls, raw, path=path))
    except ConfigError as err:
        raise section_error(err, path) from None


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def normalize_model(raw: Mapping[str, Any]) -> dict:
    """``{preset: NAME, **overrides}`` -> the full ModelConfig dict (preset fields overridden)."""
    from phaselab.workloads.config import to_dict
    from phaselab.workloads.models.config import ModelConfig

    raw = dict(raw)
    name = raw.pop("preset", None)
    if name is not None:
        from phaselab.workloads.models import presets

        names = list(presets.PRESET_NAMES)
        try:
            base = to_dict(presets.preset(name))
        except (KeyError, ValueError) as err:
            from phaselab.orchestrator.yamlio import suggest

            raise SectionError("model.preset", f"unknown model preset {name!r} ({err})",
                               suggest(str(name), names)) from None
        raw = _merge(base, raw)
    return _convert(ModelConfig, raw, "model")


def normalize_data(raw: Mapping[str, Any]) -> dict:
    from phaselab.workloads.data import DataConfig, registered_kinds

    out = _convert(DataConfig, raw, "data")
    if out["kind"] not in registered_kinds():
        from phaselab.orchestrator.yamlio import suggest

        raise SectionError("data.kind", f"unknown data kind {out['kind']!r}; registered: "
                           f"{', '.join(registered_kinds())}", suggest(out["kind"], registered_kinds()))
    return out


def normalize_train(raw: Mapping[str, Any]) -> dict:
    """TrainConfig's dict, plus ``eval_splits`` when it names splits besides "valid" (read by
    ``train.api.periodic_splits``; the default ["valid"] is left out, so keys stay as they were)."""
    from phaselab.workloads.config import ConfigError
    from phaselab.workloads.train.api import EVAL_SPLITS, parse_eval_splits
    from phaselab.workloads.train.loop import TrainConfig

    raw = dict(raw)
    splits = raw.pop(EVAL_SPLITS, None)
    out = _convert(TrainConfig, raw, "train")
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

    return _convert(ContextExtension, raw, "extend")


EVAL_SUITES = ("ppl-by-length", "niah", "lm-eval", "task", "freq")
# suite -> (spec class in workloads.evals.api, nested key, "module:Config" of the nested mapping)
_EVAL_SPECS = {
    "ppl-by-length": ("PplSpec", "ppl", "phaselab.workloads.evals.perplexity:PplConfig"),
    "niah": ("NiahSpec", "niah", "phaselab.workloads.evals.niah:NiahConfig"),
    "lm-eval": ("LmEvalSpec", None, None),
    "task": ("TaskSpec", None, None),
    "freq": ("FreqSpec", None, None),
}


def normalize_eval(raw: Mapping[str, Any], data: Mapping[str, Any] | None) -> dict:
    """The eval spec handed to ``run_eval``, converted strictly through the evals' own spec
    classes (defaults included). Its ``data`` defaults to the stage's data section."""
    import importlib

    from phaselab.orchestrator.yamlio import suggest
    from phaselab.workloads.evals import api

    spec = dict(raw)
    select = _normalize_select(spec.pop("select", None))
    suite = spec.get("suite")
    if suite not in EVAL_SUITES:
        raise SectionError("eval.suite", f"unknown eval suite {suite!r}; expected one of "
                           f"{', '.join(EVAL_SUITES)}", suggest(str(suite), EVAL_SUITES))
    if "data" not in spec and data is not None:
        spec["data"] = dict(data)
    cls_name, sub, sub_target = _EVAL_SPECS[suite]
    out = _convert(getattr(api, cls_name), spec, "eval")
    if "data" in out:
        out["data"] = _convert_data_in_eval(out["data"])
    if sub is not None:
        module, cls = sub_target.split(":")
        out[sub] = _convert(getattr(importlib.import_module(module), cls), out[sub] or {}, f"eval.{sub}")
    if select is not None:
        out["select"] = select
    return out


def _normalize_select(raw: Any) -> dict | None:
    """``eval.select`` as its SelectConfig dict (defaults included, DESIGN §5.4), or None for the
    default ``last``: an eval that selects the final checkpoint keeps the key it had before
    selection existed."""
    from phaselab.workloads.config import ConfigError, to_dict
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


class Stage:
    """Base of the six stage kinds. Subclasses set ``kind``/``sections`` and implement ``run``."""

    kind: ClassVar[str]
    sections: ClassVar[tuple[str, ...]]

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
        if "eval" in self.sections and "train" not in self.sections:
            out["eval"] = normalize_eval(sections.get("eval") or {}, out.pop("data", None))
        return out

    def data_inputs(self, config: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        """Data configs whose digests enter the key: name -> DataConfig dict."""
        if "eval" in config:
            return {"eval_data": config["eval"]["data"]} if "data" in config["eval"] else {}
        return {"data": config["data"]} if "data" in config else {}

    def resources(self, res: Mapping[str, Any]) -> Resources:
        return Resources(**res)

    def run(self, ctx: StageContext) -> StageResult:   # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}.run")
