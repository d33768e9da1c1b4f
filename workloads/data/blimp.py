"""BLiMP reader (Warstadt et al. 2020; EXPERIMENTS §5.1) for the offline lm-eval task bundle.

The shipped `assets/BLiMP.zip` holds 67 `data/<UID>.jsonl` files of 1,000 minimal pairs each,
plus a `data/.DS_Store` and a `__MACOSX/` resource fork that are not JSON: only members matching
`data/*.jsonl` are read. Records keep every field of the source (`sentence_good`,
`sentence_bad`, `field`, `linguistics_term`, `UID`, `pairID`, the method flags, ...).
The metric (computed by the eval contributor) is the fraction of pairs with
log p(good) > log p(bad), averaged over the 67 UIDs.
"""

from __future__ import annotations

import json
import posixpath
import zipfile
from pathlib import Path
from typing import Any

from phaselab.workloads.data import ASSETS_DIR, file_sha256, make_digest, resolve_path

DEFAULT_ZIP = "BLiMP.zip"
REQUIRED_FIELDS = ("sentence_good", "sentence_bad", "UID", "pairID")


def _is_data_member(name: str) -> bool:
    head, base = posixpath.split(name)
    return head == "data" and base.endswith(".jsonl") and not base.startswith(".")


def blimp_path(path: str = DEFAULT_ZIP) -> Path:
    """The BLiMP zip: relative to assets/ (default BLiMP.zip) or an explicit absolute path."""
    p = resolve_path(path, root=ASSETS_DIR, what="blimp path")
    if not p.is_file():
        raise ValueError(f"BLiMP archive {p} does not exist")
    return p


def load_blimp(path: str = DEFAULT_ZIP) -> dict[str, list[dict[str, Any]]]:
    """{UID: [record, ...]} in file order, UIDs sorted. Raises ValueError on a malformed record
    or when a file's UID field disagrees with its file name."""
    out: dict[str, list[dict[str, Any]]] = {}
    with zipfile.ZipFile(blimp_path(path)) as z:
        for name in sorted(n for n in z.namelist() if _is_data_member(n)):
            uid = posixpath.basename(name)[: -len(".jsonl")]
            records = []
            for line_no, line in enumerate(z.read(name).decode("utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                missing = [f for f in REQUIRED_FIELDS if f not in rec]
                if missing or rec["UID"] != uid:
                    raise ValueError(f"{name}:{line_no}: bad BLiMP record (missing {missing}, "
                                     f"UID {rec.get('UID')!r})")
                records.append(rec)
            out[uid] = records
    if not out:
        raise ValueError(f"no data/*.jsonl members in {path}")
    return out


def blimp_records(path: str = DEFAULT_ZIP) -> list[dict[str, Any]]:
    """All records as one flat list (UIDs sorted, pairs in file order)."""
    return [r for recs in load_blimp(path).values() for r in recs]


def blimp_digest(path: str = DEFAULT_ZIP) -> str:
    """Digest of the archive bytes and the member filter (for the eval stage's cache key)."""
    return make_digest(file_sha256(blimp_path(path)), {"kind": "blimp", "members": "data/*.jsonl"})
