"""``run_eval``: the one entry point the orchestrator's eval stages call (CONTRACTS §3.5).

    records = run_eval(spec, checkpoint=Path("ckpt/model.pt"), out_dir=Path("eval/"), tracker=t)

``spec`` is a plain mapping; ``spec["suite"]`` picks the evaluation. Unknown keys are errors
(``ConfigError`` naming the dotted key). Every suite returns :class:`MetricRecord` rows (the
catalog's schema, ``phaselab.catalog.tracking``), logs them through ``tracker.log_records``,
writes them to ``out_dir/records.json`` and logs its artifacts (plots, arrays, samples) with
``tracker.log_artifact``.

Keys common to every suite:
    suite       "ppl-by-length" | "niah" | "lm-eval" | "task" | "freq"
    data        a DataConfig mapping (``phaselab.workloads.data``): the tokenizer / documents /
                dataset the suite reads. Required except where noted.
    device      "auto" (cuda if available, else cpu) | "cpu" | "cuda" | "cuda:N"   (default auto)
    precision   "auto" (bf16 autocast on CUDA, fp32 on CPU) | "fp32" | "bf16"      (default auto)

Suite ``ppl-by-length`` (EXPERIMENTS §2.4, §3.3) — records ``nll`` [nats/token] and ``ppl`` per
context length, ``n`` = scored tokens, ``task`` = the data kind, ``split``:
    split       token split to read (default "valid"; PG-19: "test")
    ppl         {lengths: [..], mode: nonoverlap|sliding, stride: 256, batch_size: 1,
                 max_tokens: null}   (perplexity.PplConfig)
    Documents: ``dataset.documents(split)`` (one array per book) when the dataset provides it,
    else the whole ``dataset.tokens(split)`` stream as one document. Offline default source:
    ``data: {kind: text}`` (Tiny Shakespeare, validation = last 10 %); online: ``{kind: pg19}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from phaselab.catalog.tracking import MetricRecord, Tracker
from phaselab.workloads.config import from_dict
from phaselab.workloads.data import DataConfig

SUITES = ("ppl-by-length", "niah", "lm-eval", "task", "freq")


@dataclass(frozen=True, kw_only=True)
class PplSpec:
    suite: Literal["ppl-by-length"] = "ppl-by-length"
    data: DataConfig = field(default_factory=lambda: DataConfig(kind="text"))
    split: str = "valid"
    ppl: Any = None  # mapping for perplexity.PplConfig (validated there; lengths are required)
    device: str = "auto"
    precision: str = "auto"


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


def load_checkpoint_model(checkpoint: Path, device: str):
    """The model saved by ``checkpoint_io.save_model``, in eval mode, on ``device``."""
    from phaselab.workloads.models.checkpoint_io import load_model

    if not Path(checkpoint).exists():
        raise ValueError(f"checkpoint {str(checkpoint)!r} does not exist")
    model = load_model(Path(checkpoint))
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


def _run_ppl(spec: Mapping[str, Any], checkpoint: Path, out_dir: Path) -> SuiteOutput:
    from phaselab.workloads.evals.perplexity import PplConfig, perplexity_by_length, ppl_records

    s = from_dict(PplSpec, spec)
    if s.ppl is None:
        raise ValueError("ppl-by-length spec needs 'ppl': {lengths: [...], ...}")
    cfg = from_dict(PplConfig, s.ppl, path="ppl")
    dataset = build_data(s.data)
    model = load_checkpoint_model(checkpoint, s.device)
    results = perplexity_by_length(model, documents_of(dataset, s.split), cfg, precision=s.precision)
    return SuiteOutput(ppl_records(results, task=s.data.kind, split=s.split))


_RUNNERS: dict[str, Callable[[Mapping[str, Any], Path, Path], SuiteOutput]] = {
    "ppl-by-length": _run_ppl,
}


def run_eval(spec: Mapping[str, Any], *, checkpoint: Path, out_dir: Path,
             tracker: Tracker) -> list[MetricRecord]:
    """Run the evaluation ``spec["suite"]`` on the model at ``checkpoint`` (module docstring).

    Returns the MetricRecord rows (also logged to ``tracker`` and written to
    ``out_dir/records.json``). Raises ValueError for an unknown suite or a bad spec.
    """
    if not isinstance(spec, Mapping):
        raise TypeError(f"eval spec must be a mapping, got {type(spec).__name__}")
    suite = spec.get("suite")
    if suite not in _RUNNERS:
        raise ValueError(f"unknown eval suite {suite!r}; expected one of {SUITES}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = _RUNNERS[suite](spec, Path(checkpoint), out_dir)
    tracker.log_records(out.records)
    records_path = out_dir / "records.json"
    records_path.write_text(json.dumps([r.to_dict() for r in out.records], indent=1))
    for name, path in sorted(out.artifacts.items()):
        tracker.log_artifact(path, name=name)
    tracker.log_artifact(records_path, name="records.json")
    return out.records


__all__ = ["SUITES", "SuiteOutput", "run_eval"]
