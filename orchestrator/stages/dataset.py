"""``dataset`` stages and the data digests that enter every cache key (DESIGN §5.4).

Offline kinds (shipped assets or generated) are built once per config in the controller to read
``Dataset.digest`` (sha256 of the source bytes + tokenisation config). Network-backed kinds
(OpenWebText, PG-19, MAESTRO, the human genome, pre-tokenised shards) cannot be read offline at
plan time: their digest is ``declared:<sha256 of the DataConfig>``, i.e. they are identified by
their declared source (``real.hf_name``/``shards_dir``...), and a ``dataset`` stage records the
digest of the materialised data when it runs.

``check_data`` is ``plan``'s data check (called by the DAG for every stage): from metadata alone
(the offline kinds' tokens, a token folder's meta.json or .bin sizes), it refuses a vocabulary
larger than the model's, a training block longer than the model's and a split shorter than a block.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.stages.base import Stage, StageContext, StageResult, normalize_data
from phaselab.orchestrator.stages.digest import canonical_json, sha256_hex

OFFLINE_KINDS = frozenset({"indirect_indexing", "jsb", "text", "dna"})


@functools.lru_cache(maxsize=64)
def _summary_of(canonical: str) -> dict[str, Any]:
    """Digest, vocabulary, block size and tokens per split (None for non-stream datasets)."""
    from phaselab.workloads.config import from_dict
    from phaselab.workloads.data import DataConfig, build_dataset

    ds = build_dataset(from_dict(DataConfig, json.loads(canonical)))
    tokens = {s: len(ds.tokens(s)) for s in ds.splits} if hasattr(ds, "tokens") else None
    return {"digest": ds.digest, "vocab_size": ds.vocab_size, "block_size": ds.block_size, "tokens": tokens}


def _token_folder_summary(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """kind ``tokens``: meta.json, or the .bin sizes and the grid's real.vocab_size (no hashing);
    None when the folder is not on this machine."""
    from pathlib import Path

    from phaselab.workloads.config import from_dict
    from phaselab.workloads.data import DataConfig, cache_root, resolve_path
    from phaselab.workloads.data.nanogpt import bare_meta
    from phaselab.workloads.data.real_scale import read_meta

    dc = from_dict(DataConfig, dict(cfg))
    if not dc.real.shards_dir:
        raise ValueError("data kind 'tokens' needs real.shards_dir (a token folder)")
    folder = resolve_path(dc.real.shards_dir, root=cache_root(dc.cache_dir), what="real.shards_dir")
    if not folder.is_dir():   # on the cluster's storage, not here: the stage reads it where it runs
        return None
    meta = read_meta(folder) if (Path(folder) / "meta.json").is_file() else bare_meta(folder, dc.real)
    return {"vocab_size": meta["vocab_size"], "block_size": dc.block_size or 1024,
            "tokens": {s: info["tokens"] for s, info in meta["splits"].items()}}


def data_summary(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``plan`` can know of a dataset from metadata alone: ``vocab_size``, ``block_size`` and
    ``tokens`` per split (None where not a token stream); None for kinds read only when run."""
    if cfg.get("kind") in OFFLINE_KINDS:
        return _summary_of(canonical_json(cfg))
    if cfg.get("kind") == "tokens":
        return _token_folder_summary(cfg)
    return None


def data_digest(cfg: Mapping[str, Any]) -> str:
    """Digest of one DataConfig dict (see the module docstring)."""
    if cfg.get("kind") in OFFLINE_KINDS:
        return _summary_of(canonical_json(cfg))["digest"]
    return "declared:" + sha256_hex(canonical_json(cfg))


def check_data(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(config key, problem) for a stage whose model cannot read its data, found at plan time:
    a vocabulary larger than ``model.vocab_size``, a training block longer than
    ``model.block_size``, a train split shorter than one block plus its target, a split that
    cannot score one token."""
    data, model = config.get("data"), config.get("model")
    info = data_summary(data) if isinstance(data, Mapping) else None
    if info is None:
        return []
    out = []
    if model is not None and info["vocab_size"] > model["vocab_size"]:
        out.append(("model.vocab_size", (f"the dataset ({data['kind']}) has {info['vocab_size']} tokens in its "
                    f"vocabulary, more than model.vocab_size={model['vocab_size']}")))
    if model is not None and "extend" not in config and info["block_size"] > model["block_size"]:
        out.append(("data.block_size", (f"data.block_size={info['block_size']} is longer than "
                    f"model.block_size={model['block_size']}")))
    tokens = info["tokens"] or {}
    if "train" in tokens and tokens["train"] < info["block_size"] + 1:   # one training window and its target
        out.append(("data.block_size", (f"the train split of the dataset has {tokens['train']} tokens, fewer "
                    f"than data.block_size+1={info['block_size'] + 1}")))
    out += [("data", f"split {s!r} of the dataset has {n} tokens (at least 2 are needed to score one)")
            for s, n in tokens.items() if s != "train" and n < 2]
    return out


class DatasetStage(Stage):
    """Materialises a dataset (downloads / tokenises / generates) and records its digest."""

    kind = "dataset"
    sections = ("data",)
    output = "dataset"

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        return {"data": normalize_data(sections.get("data") or {})}

    def run(self, ctx: StageContext) -> StageResult:
        from phaselab.workloads.config import from_dict
        from phaselab.workloads.data import DataConfig, build_dataset

        ds = build_dataset(from_dict(DataConfig, ctx.config["data"]))
        manifest = {"name": ds.name, "digest": ds.digest, "vocab_size": ds.vocab_size,
                    "block_size": ds.block_size, "splits": list(ds.splits), "config": ctx.config["data"]}
        path = ctx.out_dir / "dataset.json"
        path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        ctx.tracker.log_artifact(path, name="dataset.json")
        records = [MetricRecord(name="vocab_size", value=float(ds.vocab_size), task=ds.name)]
        return StageResult(status="succeeded", metrics={"vocab_size": float(ds.vocab_size)},
                           artifacts={"manifest": path}, records=records)
