"""A frozen, local lm-eval task bundle built from the shipped BLiMP archive (DESIGN §5.8).

Layout of a bundle directory (everything lm-eval needs; no hub access at evaluation time)::

    <root>/data/<UID>.jsonl           BLiMP minimal pairs, one file per sub-task
    <root>/phaselab_blimp_<UID>.yaml  one task per UID: dataset_path json + local data_files
    <root>/phaselab_blimp.yaml        group "phaselab_blimp": unweighted mean acc over its UIDs
    <root>/BUNDLE.json                digest, UIDs, source

The task YAMLs are the template ``tasks/_phaselab_blimp_template_yaml`` plus ``task`` and
``dataset_kwargs: {data_files: {test: <abs path>}}``. The digest (part of the eval stage key)
covers the jsonl bytes, the template and the UID list, not the absolute path, so the same data
built in two places has the same digest. Bundles are built once into ``<cache>/<digest[:16]>``
(built in a temporary folder and renamed into place, so a reader never sees half a bundle).

    root, digest = build_blimp_bundle(cache_dir)            # all 67 sub-tasks
    TaskManager(include_path=[str(root), str(TASKS_DIR)])   # + phaselab_cbt for online users
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import yaml

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TEMPLATE = TASKS_DIR / "_phaselab_blimp_template_yaml"
BLIMP_GROUP = "phaselab_blimp"
_BUNDLE_VERSION = 1


def blimp_zip_path() -> Path:
    """The BLiMP archive shipped with the data package (workloads/data/assets)."""
    from phaselab.workloads.data import ASSETS_DIR

    return ASSETS_DIR / "BLiMP.zip"


def read_blimp_members(zip_path: Path) -> dict[str, bytes]:
    """UID -> raw jsonl bytes, keeping only ``data/<UID>.jsonl`` members (the archive also holds
    ``data/.DS_Store`` and ``__MACOSX/`` entries, EXPERIMENTS §5.1)."""
    out = {}
    with zipfile.ZipFile(zip_path) as z:
        for name in z.namelist():
            parts = name.split("/")
            if len(parts) == 2 and parts[0] == "data" and parts[1].endswith(".jsonl") \
                    and not parts[1].startswith("."):
                out[parts[1][: -len(".jsonl")]] = z.read(name)
    if not out:
        raise ValueError(f"{zip_path} holds no data/<UID>.jsonl members; is it the BLiMP archive?")
    return out


def bundle_digest(members: dict[str, bytes], uids: Sequence[str]) -> str:
    h = hashlib.sha256(f"phaselab-blimp-bundle-v{_BUNDLE_VERSION}".encode())
    h.update(TEMPLATE.read_bytes())
    for uid in uids:
        h.update(uid.encode() + b"\0" + hashlib.sha256(members[uid]).digest())
    return h.hexdigest()


def build_blimp_bundle(cache_dir: Path, *, uids: Sequence[str] | None = None,
                       zip_path: Path | None = None) -> tuple[Path, str]:
    """Build (or reuse) the BLiMP bundle; returns (bundle root, digest).

    Args:
        cache_dir: folder holding bundles, one sub-folder per digest.
        uids: the sub-tasks to include (default: all 67, sorted). Unknown UIDs are a ValueError.
        zip_path: the BLiMP archive (default: the shipped one).
    """
    members = read_blimp_members(Path(zip_path) if zip_path else blimp_zip_path())
    chosen = sorted(members) if uids is None else list(uids)
    unknown = [u for u in chosen if u not in members]
    if unknown or not chosen:
        raise ValueError(f"unknown BLiMP UIDs {unknown!r}; available: {sorted(members)[:5]}... "
                         f"({len(members)} in all)")
    digest = bundle_digest(members, chosen)
    root = Path(cache_dir).resolve() / digest[:16]
    if (root / "BUNDLE.json").exists():
        return root, digest
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".bundle-"))
    try:
        _fill(tmp, final=root, members=members, uids=chosen, digest=digest)
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished the same bundle first: keep theirs
            if not (root / "BUNDLE.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root, digest


def _fill(tmp: Path, *, final: Path, members: dict[str, bytes], uids: Sequence[str], digest: str) -> None:
    """Write data, per-UID task YAMLs, the group YAML and BUNDLE.json into ``tmp``; YAMLs point at
    ``final`` (where ``tmp`` is renamed to)."""
    template = yaml.safe_load(TEMPLATE.read_text())
    (tmp / "data").mkdir()
    for uid in uids:
        (tmp / "data" / f"{uid}.jsonl").write_bytes(members[uid])
        task = dict(template, task=f"{BLIMP_GROUP}_{uid}",
                    dataset_kwargs={"data_files": {"test": str(final / "data" / f"{uid}.jsonl")}})
        (tmp / f"{BLIMP_GROUP}_{uid}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    group = {"group": BLIMP_GROUP, "task": [f"{BLIMP_GROUP}_{u}" for u in uids],
             "aggregate_metric_list": [{"metric": "acc", "aggregation": "mean", "weight_by_size": False}],
             "metadata": {"version": 1.0}}
    (tmp / f"{BLIMP_GROUP}.yaml").write_text(yaml.safe_dump(group, sort_keys=False))
    (tmp / "BUNDLE.json").write_text(json.dumps({"digest": digest, "uids": list(uids),
                                                 "source": "BLiMP.zip (Warstadt et al. 2020, CC-BY)",
                                                 "version": _BUNDLE_VERSION}, indent=1))


def blimp_bundle_digest(uids: Sequence[str] | None = None, *, zip_path: Path | None = None) -> str:
    """The digest ``build_blimp_bundle`` would return, without writing anything (for stage keys)."""
    members = read_blimp_members(Path(zip_path) if zip_path else blimp_zip_path())
    chosen = sorted(members) if uids is None else list(uids)
    unknown = [u for u in chosen if u not in members]
    if unknown:
        raise ValueError(f"unknown BLiMP UIDs {unknown!r}")
    return bundle_digest(members, chosen)
