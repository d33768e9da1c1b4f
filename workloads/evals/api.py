"""``run_eval``: the one entry point the orchestrator's eval stages call (CONTRACTS §3.5).

    records = run_eval(spec, checkpoint=Path("ckpt/model.pt"), out_dir=Path("eval/"), tracker=t)

``spec`` is a plain mapping; ``spec["suite"]`` picks the evaluation. ``extend`` (optional, a
``ContextExtension`` mapping: rule pi | ntk | dynamic_ntk | yarn, factor, original_max_seq_len,
base, attention_factor, block_size) re-builds the checkpoint's RoPE with that scaling rule before
any suite runs, weights unchanged: PI / YaRN applied at inference without fine-tuning (TAPA
Table 2, EXPERIMENTS §6 #22). Only RoPE checkpoints accept it (``ExtensionNotApplicable``).
Unknown keys are errors (``ConfigError`` naming the dotted key). Every suite returns
:class:`MetricRecord` rows (the catalog's schema, ``phaselab.catalog.tracking``), logs them
through ``tracker.log_records``, writes them to ``out_dir/records.json`` and logs its artifacts
(plots, arrays, samples) with ``tracker.log_artifact``.

Keys common to every suite:
    suite       "ppl-by-length" | "niah" | "lm-eval" | "task" | "freq"
    select      which checkpoint of the training run is evaluated (:class:`SelectConfig`):
                "last" (default: the final checkpoint, ``checkpoint``) | "best_valid" (the
                weights with the best periodic validation, EXPERIMENTS §2.2 "Reporting") |
                {rule: best_valid, metric: valid/loss | valid/acc, mode: min | max}. best_valid
                reads the training run's ``best/`` folder (``best=``); the suite's records are
                followed by ``select/step`` (the selected step) and ``select/best_valid/<metric>``
                (that metric's value there), both with ``step`` = the selected step.
    data        a DataConfig mapping (``phaselab.workloads.data``): the tokenizer / documents /
                dataset the suite reads. Default {kind: text} (Tiny Shakespeare, char level),
                except for ``task``, whose default is DataConfig() (Indirect Indexing).
    device      "auto" (cuda if available, else cpu) | "cpu" | "cuda" | "cuda:N"   (default auto)
    precision   "auto" (bf16 autocast on CUDA, fp32 on CPU) | "fp32" | "bf16"      (default auto)

Suite ``ppl-by-length`` (EXPERIMENTS §2.4, §3.3) — records ``nll`` [nats/token] and ``ppl`` per
context length, ``n`` = scored tokens, ``task`` = the data kind, ``split``:
    split       token split to read (default "valid"; PG-19: "test")
    ppl         {lengths: [..], mode: nonoverlap|sliding, stride: 256, batch_size: 1,
                 max_tokens: null}   (options.PplConfig)
    Documents: ``dataset.documents(split)`` (one array per book) when the dataset provides it,
    else the whole ``dataset.tokens(split)`` stream as one document. Offline default source:
    ``data: {kind: text}`` (Tiny Shakespeare, validation = last 10 %); online: ``{kind: pg19}``.

Suite ``niah`` (EXPERIMENTS §3.4; niah.py) — records ``niah_acc`` [fraction] per (context_len,
depth), n = trials; ``niah_not_attempted`` per length skipped by ``stop_below``; artifact
``niah_heatmap.png``:
    split       haystack token split (default "valid")
    niah        {lengths: [..], depths: [0, .1, .., 1], trials: 10, seed: 0, stop_below: null,
                 batch_size: 1, cache_dir: null, answer: digits|letters}   (options.NiahConfig;
                 "letters" for vocabularies without digits, e.g. char-level Tiny Shakespeare;
                 cache_dir null -> <data cache>/niah; samples are keyed by the dataset digest,
                 which covers the tokenizer and the source text, and the split)
    max_length  model context while decoding (default: the largest length)

Suite ``lm-eval`` (EXPERIMENTS §2.5; DESIGN §5.8; lm_harness.py, bundle.py) — records one row per
(task or group, metric) (``acc``, ``acc_norm``, ...), task = lm-eval task name, n = examples,
stderr, context_len = max_length; artifacts ``lm_eval_results.json`` (versions, configs) and
``lm_eval_samples/<task>.jsonl``:
    lm_eval     {tasks: ["phaselab_blimp"], max_length: 1024, batch_size: 8, num_fewshot: 0,
                 limit: null, log_samples: true, blimp_uids: null, prefix: null,
                 bundle_dir: null, bootstrap_iters: 1000}
    Task names: ``phaselab_blimp`` (offline BLiMP bundle, mean acc over its sub-tasks) and its
    sub-tasks ``phaselab_blimp_<UID>``; ``phaselab_cbt`` / ``phaselab_cbt_cn`` / ``phaselab_cbt_ne``
    (bundled YAML, Hugging Face data); any lm-eval task, e.g. ``lambada_openai``, ``hellaswag``,
    ``piqa``, ``arc_easy`` (network). When every task is in the BLiMP bundle,
    HF_DATASETS_OFFLINE/HF_HUB_OFFLINE are set to 1. ``prefix``: text of the single token that
    conditions an empty context, required for tokenizers without EOT (char level: "\\n").
    ``blimp_uids`` restricts the bundle; ``bundle_dir`` defaults to the data cache folder.

Suite ``task`` (EXPERIMENTS §2.1, §2.2; tasks_metrics.py) — one record: ``acc`` [fraction]
(n = examples) or ``nll`` [nats/token] (n = scored tokens), task = data kind, split:
    split       default "test"
    metric      "acc" (Indirect Indexing target accuracy) | "nll" (mean NLL per scored token);
                default: "acc" for kind indirect_indexing, else "nll"
    batch_size  default 64;  max_batches: null (whole split)

Suite ``freq`` (EXPERIMENTS §2.6; analysis.py) — records ``freq_high_share_q/layer{ℓ}``; artifacts
the .npy arrays and heat maps listed in analysis.py (PoPE: δ heat maps too):
    passages    "shakespeare" (10 fixed 14-line passages of Tiny Shakespeare) | [text, ...]
    max_len     tokens per passage (default: the model's block_size)
    data        tokenizer source (default {kind: text}, char level)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from phaselab.catalog.tracking import MetricRecord, Tracker, run_folder
from phaselab.workloads import provenance
from phaselab.workloads.config import from_dict
from phaselab.workloads.data import DataConfig
from phaselab.workloads.models.config import ContextExtension

SELECT_RULES = ("last", "best_valid")


@dataclass(frozen=True, kw_only=True)
class SelectConfig:
    """Checkpoint selection of an evaluation (``eval.select``; EXPERIMENTS §6 #7).

    ``metric``/``mode`` apply to ``best_valid``: a validation metric the training loop reports
    and the direction training keeps it in (config.BEST_CRITERIA: valid/loss min, valid/acc
    max); ``mode`` None means that direction. ``last`` takes no metric or mode.
    """

    rule: Literal["last", "best_valid"] = "last"
    metric: str | None = None
    mode: Literal["min", "max"] | None = None

    def __post_init__(self) -> None:
        from phaselab.workloads.train.config import BEST_CRITERIA

        if self.rule == "last":
            if self.metric is not None or self.mode is not None:
                raise ValueError("metric and mode apply to rule 'best_valid' only")
            return
        metric = self.metric or "valid/loss"
        if metric not in BEST_CRITERIA:
            raise ValueError(f"metric {metric!r}: training keeps best weights for "
                             f"{', '.join(BEST_CRITERIA)} only")
        kept = BEST_CRITERIA[metric]
        if self.mode is not None and self.mode != kept:
            raise ValueError(f"mode {self.mode!r}: training keeps {metric} at its {kept} only")
        object.__setattr__(self, "metric", metric)   # resolved, so equal selections hash equal
        object.__setattr__(self, "mode", kept)

    def label(self) -> str:
        return "last" if self.rule == "last" else f"best_valid {self.metric} ({self.mode})"


def parse_select(raw: Any, path: str = "select") -> SelectConfig:
    """``"last"`` | ``"best_valid"`` | a mapping -> SelectConfig (ConfigError naming ``path``)."""
    from phaselab.workloads.config import ConfigError

    if raw is None:
        return SelectConfig()
    if isinstance(raw, str):
        if raw not in SELECT_RULES:
            raise ConfigError(f"{path}: unknown selection rule {raw!r}; expected one of "
                              f"{', '.join(SELECT_RULES)}")
        raw = {"rule": raw}
    return from_dict(SelectConfig, raw, path=path)


@dataclass(frozen=True, kw_only=True)
class PplSpec:
    suite: Literal["ppl-by-length"] = "ppl-by-length"
    data: DataConfig = field(default_factory=lambda: DataConfig(kind="text"))
    split: str = "valid"
    ppl: Any = None  # mapping for options.PplConfig (validated there; lengths are required)
    device: str = "auto"
    precision: str = "auto"


@dataclass(frozen=True, kw_only=True)
class NiahSpec:
    suite: Literal["niah"] = "niah"
    data: DataConfig = field(default_factory=lambda: DataConfig(kind="text"))
    split: str = "valid"
    niah: Any = None  # mapping for options.NiahConfig
    max_length: int | None = None
    device: str = "auto"
    precision: str = "auto"


@dataclass(frozen=True, kw_only=True)
class LmEvalOptions:
    tasks: tuple[str, ...] = ("phaselab_blimp",)
    max_length: int = 1024
    batch_size: int = 8
    num_fewshot: int = 0
    limit: int | float | None = None
    log_samples: bool = True
    blimp_uids: tuple[str, ...] | None = None
    prefix: str | None = None
    bundle_dir: str | None = None
    bootstrap_iters: int = 1000


@dataclass(frozen=True, kw_only=True)
class LmEvalSpec:
    suite: Literal["lm-eval"] = "lm-eval"
    data: DataConfig = field(default_factory=lambda: DataConfig(kind="text"))
    lm_eval: LmEvalOptions = field(default_factory=LmEvalOptions)
    device: str = "auto"
    precision: str = "auto"


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    suite: Literal["task"] = "task"
    data: DataConfig = field(default_factory=DataConfig)
    split: str = "test"
    metric: Literal["acc", "nll"] | None = None
    batch_size: int = 64
    max_batches: int | None = None
    device: str = "auto"
    precision: str = "auto"


@dataclass(frozen=True, kw_only=True)
class FreqSpec:
    suite: Literal["freq"] = "freq"
    data: DataConfig = field(default_factory=lambda: DataConfig(kind="text"))
    passages: str | tuple[str, ...] = "shakespeare"
    max_len: int | None = None
    device: str = "auto"


@dataclass
class SuiteOutput:
    """What a suite produced: its records and named artifact files under out_dir."""

    records: list[MetricRecord]
    artifacts: dict[str, Path] = field(default_factory=dict)


def resolve_device(name: str):
    """"auto" -> cuda if available else cpu; anything else is passed to torch.device."""
    import torch

    if not isinstance(name, str):
        raise TypeError(f"device must be a string, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ExtensionNotApplicable(ValueError):
    """An inference-time ``extend`` was given for a checkpoint without RoPE frequencies."""


def eval_extension(extend: Mapping[str, Any] | ContextExtension | None) -> ContextExtension | None:
    """The strictly parsed ``extend`` mapping (unknown key -> ConfigError naming ``extend.KEY``)."""
    if extend is None or isinstance(extend, ContextExtension):
        return extend
    return from_dict(ContextExtension, extend, path="extend")


def extend_for_eval(model, ext: ContextExtension, *, checkpoint: Path | None = None) -> None:
    """Re-build ``model``'s RoPE in place with ``ext``'s scaling rule (MATH §2); weights unchanged.

    Only pe.kind "rope" has frequencies to rescale: PoPE/TAPA/ALiBi/NoPE checkpoints raise
    ExtensionNotApplicable naming the kind (even rule "none", which would evaluate nothing new).
    """
    kind = model.cfg.pe.kind
    if kind != "rope":
        where = f" {str(checkpoint)!r}" if checkpoint is not None else ""
        raise ExtensionNotApplicable(
            f"extend (rule={ext.rule!r}, factor={ext.factor}) rescales RoPE frequencies, but the "
            f"checkpoint{where} has pe.kind={kind!r}; evaluate it without 'extend'")
    model.extended(ext)


def load_checkpoint_model(checkpoint: Path, device: str, extend: ContextExtension | None = None):
    """The model saved by ``checkpoint_io.save_model``, in eval mode, on ``device``; with
    ``extend``, its RoPE re-built with that scaling rule first (``extend_for_eval``)."""
    from phaselab.workloads.models.checkpoint_io import load_model

    if not Path(checkpoint).exists():
        raise ValueError(f"checkpoint {str(checkpoint)!r} does not exist")
    model = load_model(Path(checkpoint))
    if extend is not None:
        extend_for_eval(model, extend, checkpoint=Path(checkpoint))
    return model.to(resolve_device(device)).eval()


def build_data(cfg: DataConfig):
    from phaselab.workloads.data import build_dataset

    return build_dataset(cfg)


def documents_of(dataset, split: str) -> list:
    """Per-document token arrays when the dataset has them (PG-19 books), else one stream."""
    if hasattr(dataset, "documents"):
        return list(dataset.documents(split))
    if not hasattr(dataset, "tokens"):
        raise ValueError(f"dataset {dataset.name!r} is not a token stream (no tokens(split)); "
                         "perplexity by length needs a text-like dataset")
    return [dataset.tokens(split)]


def _run_ppl(spec: Mapping[str, Any], checkpoint: Path, out_dir: Path,
             extend: ContextExtension | None) -> SuiteOutput:
    from phaselab.workloads.evals.options import PplConfig
    from phaselab.workloads.evals.perplexity import perplexity_by_length, ppl_records

    s = from_dict(PplSpec, spec)
    if s.ppl is None:
        raise ValueError("ppl-by-length spec needs 'ppl': {lengths: [...], ...}")
    cfg = from_dict(PplConfig, s.ppl, path="ppl")
    dataset = build_data(s.data)
    model = load_checkpoint_model(checkpoint, s.device, extend)
    results = perplexity_by_length(model, documents_of(dataset, s.split), cfg, precision=s.precision)
    return SuiteOutput(ppl_records(results, task=s.data.kind, split=s.split))


def _run_niah(spec: Mapping[str, Any], checkpoint: Path, out_dir: Path,
              extend: ContextExtension | None) -> SuiteOutput:
    from phaselab.workloads.data import cache_root
    from phaselab.workloads.evals import niah
    from phaselab.workloads.evals.options import NiahConfig
    from phaselab.workloads.evals.plots import niah_heatmap

    s = from_dict(NiahSpec, spec)
    if s.niah is None:
        raise ValueError("niah spec needs 'niah': {lengths: [...], ...}")
    cfg = from_dict(NiahConfig, s.niah, path="niah")
    dataset = build_data(s.data)
    model = load_checkpoint_model(checkpoint, s.device, extend)
    step = niah.model_step(model, max_length=s.max_length or max(cfg.lengths), precision=s.precision)
    cache = Path(cfg.cache_dir) if cfg.cache_dir else cache_root(s.data.cache_dir) / "niah"
    grid = niah.run_grid(step, dataset.tokenizer, dataset.tokens(s.split), cfg,
                         digest=f"{dataset.digest}/{s.split}", cache_dir=cache)
    plot = niah_heatmap(grid, out_dir / "niah_heatmap.png", title=f"NIAH ({s.data.kind})")
    return SuiteOutput(niah.niah_records(grid, cfg), {"niah_heatmap.png": plot})


def _prefix_id(tokenizer, prefix: str | None) -> int | None:
    if prefix is None:
        return None
    ids = tokenizer.encode(prefix)
    if len(ids) != 1:
        raise ValueError(f"lm_eval.prefix {prefix!r} must encode to exactly one token, got {ids}")
    return ids[0]


def _run_lm_eval(spec: Mapping[str, Any], checkpoint: Path, out_dir: Path,
                 extend: ContextExtension | None) -> SuiteOutput:
    import os

    from phaselab.workloads.data import cache_root
    from phaselab.workloads.evals.bundle import BLIMP_GROUP, TASKS_DIR, build_blimp_bundle

    s = from_dict(LmEvalSpec, spec)
    o = s.lm_eval
    bundle_root = Path(o.bundle_dir) if o.bundle_dir else cache_root(s.data.cache_dir) / "lm-eval-bundles"
    root, digest = build_blimp_bundle(bundle_root, uids=o.blimp_uids)
    local_only = all(t.startswith(BLIMP_GROUP) for t in o.tasks)
    # Fully local: forbid hub access for this run (DESIGN §5.8); restored afterwards so a later
    # online eval in the same worker is unaffected. Set before lm_eval/datasets are imported.
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    if local_only:
        os.environ.update({k: "1" for k in saved})
    try:
        from phaselab.workloads.evals import lm_harness

        tokenizer = build_data(s.data).tokenizer
        model = load_checkpoint_model(checkpoint, s.device, extend)
        lm = lm_harness.PhaseLabLM(model, tokenizer, max_length=o.max_length, batch_size=o.batch_size,
                                   precision=s.precision, prefix_token_id=_prefix_id(tokenizer, o.prefix))
        results = lm_harness.evaluate_tasks(lm, o.tasks, include_paths=[root, TASKS_DIR],
                                            num_fewshot=o.num_fewshot, limit=o.limit,
                                            log_samples=o.log_samples, bootstrap_iters=o.bootstrap_iters,
                                            include_defaults=not all(t.startswith("phaselab_") for t in o.tasks))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results["phaselab_bundle_digest"] = digest
    arts = lm_harness.write_outputs(results, out_dir)
    return SuiteOutput(lm_harness.results_to_records(results, context_len=o.max_length), arts)


def _run_task(spec: Mapping[str, Any], checkpoint: Path, out_dir: Path,
              extend: ContextExtension | None) -> SuiteOutput:
    from phaselab.workloads.evals import tasks_metrics

    s = from_dict(TaskSpec, spec)
    metric = s.metric or ("acc" if s.data.kind == "indirect_indexing" else "nll")
    fn = tasks_metrics.target_accuracy if metric == "acc" else tasks_metrics.split_nll
    model = load_checkpoint_model(checkpoint, s.device, extend)
    r = fn(model, build_data(s.data), s.split, batch_size=s.batch_size, max_batches=s.max_batches,
           precision=s.precision)
    return SuiteOutput([MetricRecord(name=r.name, value=r.value, unit=r.unit, task=s.data.kind, split=s.split,
                                     n=r.n)])


def _run_freq(spec: Mapping[str, Any], checkpoint: Path, out_dir: Path,
              extend: ContextExtension | None) -> SuiteOutput:
    from phaselab.workloads.data import ASSETS_DIR
    from phaselab.workloads.evals import analysis

    s = from_dict(FreqSpec, spec)
    if s.passages == "shakespeare":
        texts = analysis.fixed_passages((ASSETS_DIR / "tinyshakespeare.txt").read_text(encoding="utf-8"))
    elif isinstance(s.passages, tuple) and s.passages:
        texts = list(s.passages)
    else:
        raise ValueError(f"freq passages must be 'shakespeare' or a non-empty list of texts, got {s.passages!r}")
    tokenizer = build_data(s.data).tokenizer
    model = load_checkpoint_model(checkpoint, s.device, extend)
    usage = analysis.frequency_usage(model, [tokenizer.encode(t) for t in texts],
                                     max_len=s.max_len or model.cfg.block_size)
    label = f"{model.cfg.pe.kind}"
    arts = analysis.save_usage(usage, out_dir, label=label)
    return SuiteOutput(analysis.freq_records(usage, task=f"freq/{label}"), arts)


@dataclass(frozen=True)
class Suite:
    """One evaluation suite: ``spec`` is its spec class (the grid's ``eval`` section, converted
    strictly), ``run`` its runner; ``options`` names the nested mapping that ``options_config``
    ("module:Class", imported only when converted) validates, for suites that have one."""

    spec: type
    run: Callable[[Mapping[str, Any], Path, Path, ContextExtension | None], SuiteOutput]
    options: str | None = None
    options_config: str | None = None


# The suite table: the orchestrator's eval stages read it from here too.
SUITE_TABLE: Mapping[str, Suite] = {
    "ppl-by-length": Suite(PplSpec, _run_ppl, "ppl", "phaselab.workloads.evals.options:PplConfig"),
    "niah": Suite(NiahSpec, _run_niah, "niah", "phaselab.workloads.evals.options:NiahConfig"),
    "lm-eval": Suite(LmEvalSpec, _run_lm_eval),
    "task": Suite(TaskSpec, _run_task),
    "freq": Suite(FreqSpec, _run_freq),
}
SUITES = tuple(SUITE_TABLE)


class NoBestCheckpoint(ValueError):
    """``select: best_valid`` but the training run kept no best-validation weights."""


def select_checkpoint(select: SelectConfig, *, checkpoint: Path, best: Path | None
                      ) -> tuple[Path, dict[str, Any] | None]:
    """The model.pt that ``select`` picks and, for best_valid, its ``best.json`` (step, metric,
    value, mode). ``best`` is the training run's ``best/`` folder (None: it kept none)."""
    from phaselab.workloads.train.checkpoint import read_best

    if select.rule == "last":
        return Path(checkpoint), None
    info = read_best(best, select.metric, select.mode) if best is not None else None
    if info is None:
        where = f"under {str(best)!r}" if best is not None else "(the training stage exposes no 'best' artifact)"
        raise NoBestCheckpoint(
            f"select: {select.label()} needs the best-validation weights of the training run, but "
            f"none were kept {where}; train with periodic validation (train.eval_every > 0) or "
            "use select: last")
    return Path(info["model"]), info


def selection_records(info: Mapping[str, Any], records: list[MetricRecord]) -> list[MetricRecord]:
    """The catalog rows saying which step ``best_valid`` selected and why (module docstring)."""
    step = int(info["step"])
    task = records[0].task if records else None
    unit = "nats/token" if info["metric"].endswith("loss") else "fraction"
    return [MetricRecord(name="select/step", value=float(step), unit="step", step=step, task=task),
            MetricRecord(name=f"select/best_valid/{info['metric']}", value=float(info["value"]),
                         unit=unit, step=step, task=task, split=info["metric"].split("/")[0])]


def _write_provenance(spec: Mapping[str, Any], out_dir: Path) -> None:
    """What the suite ran (``workloads.provenance``), in ``out_dir/provenance.json``."""
    from phaselab.workloads.precision import resolved_precision

    device = resolve_device(str(spec.get("device", "auto")))
    provenance.write(out_dir, provenance.what_ran(
        device=device, precision=resolved_precision(str(spec.get("precision", "auto")), device)))


def run_eval(spec: Mapping[str, Any], *, checkpoint: Path, out_dir: Path, tracker: Tracker,
             extend: Mapping[str, Any] | ContextExtension | None = None,
             best: Path | None = None) -> list[MetricRecord]:
    """Run the evaluation ``spec["suite"]`` on the model that ``spec["select"]`` picks
    (``checkpoint``, the final one, or the best-validation weights under ``best``; module
    docstring), with its RoPE re-built by ``extend`` when given (inference-time context extension).

    Returns the MetricRecord rows (also logged to ``tracker`` and written to
    ``out_dir/records.json``). Raises ValueError for an unknown suite or a bad spec,
    ExtensionNotApplicable (a ValueError) for ``extend`` on a non-RoPE checkpoint and
    NoBestCheckpoint (a ValueError) for ``best_valid`` without kept best weights.
    """
    if not isinstance(spec, Mapping):
        raise TypeError(f"eval spec must be a mapping, got {type(spec).__name__}")
    suite = spec.get("suite")
    if suite not in SUITE_TABLE:
        raise ValueError(f"unknown eval suite {suite!r}; expected one of {SUITES}")
    spec = dict(spec)
    select = parse_select(spec.pop("select", None))
    ext = eval_extension(extend)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen, info = select_checkpoint(select, checkpoint=Path(checkpoint), best=best)
    provenance.reset()   # record the attention implementations of this evaluation only
    out = SUITE_TABLE[suite].run(spec, chosen, out_dir, ext)
    _write_provenance(spec, out_dir)
    if info is not None:
        out.records = out.records + selection_records(info, out.records)
    tracker.log_records(out.records)
    records_path = out_dir / run_folder.RECORDS_FILE
    records_path.write_text(json.dumps([r.to_dict() for r in out.records], indent=1))
    for name, path in sorted(out.artifacts.items()):
        tracker.log_artifact(path, name=name)
    tracker.log_artifact(records_path, name=run_folder.RECORDS_FILE)
    return out.records


__all__ = ["SUITES", "SUITE_TABLE", "ExtensionNotApplicable", "NoBestCheckpoint", "SelectConfig", "Suite", "SuiteOutput",
           "eval_extension", "extend_for_eval", "parse_select", "run_eval", "select_checkpoint"]
