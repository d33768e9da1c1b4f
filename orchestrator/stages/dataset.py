"""``dataset`` stages and the data digests that enter every cache key (DESIGN §5.4).

Offline kinds (shipped assets or generated) are built once per config in the controller to read
``Dataset.digest`` (sha256 of the source bytes + tokenisation config). Network-backed kinds
(OpenWebText, PG-19, MAESTRO, the human genome, pre-tokenised shards) cannot be read offline at
plan time: their digest is ``declared:<sha256 of the DataConfig>``, i.e. they are identified by
their declared source (``real.hf_name``/``shards_dir``...), and a ``dataset`` stage records the
digest of the materialised data when it runs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.hashing import canonical_json, sha256_hex
from phaselab.orchestrator.stages.base import Stage, StageContext, StageResult, normalize_data

OFFLINE_KINDS = frozenset({"indirect_indexing", "jsb", "text", "dna"})


@functools.lru_cache(maxsize=64)
def _digest_of(canonical: str) -> str:
    from phaselab.workloads.config import from_dict
    from phaselab.workloads.data import DataConfig, build_dataset

    return build_dataset(from_dict(DataConfig, json.loads(canonical))).digest


def data_digest(cfg: Mapping[str, Any]) -> str:
    """Digest of one DataConfig dict (see the module docstring)."""
    if cfg.get("kind") in OFFLINE_KINDS:
        return _digest_of(canonical_json(cfg))
    return "declared:" + sha256_hex(canonical_json(cfg))


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
