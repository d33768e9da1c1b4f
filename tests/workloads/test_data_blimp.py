"""BLiMP reader: 67 UIDs x 1,000 pairs from the shipped zip, junk members skipped."""

from __future__ import annotations

import json
import zipfile
from collections import Counter

import pytest

from phaselab.workloads.data.blimp import blimp_digest, blimp_records, load_blimp


def test_67_uids_of_1000_pairs():
    data = load_blimp()
    assert len(data) == 67 and all(len(v) == 1000 for v in data.values())
    assert list(data) == sorted(data)
    first = data["adjunct_island"][0]
    assert first["sentence_good"] != first["sentence_bad"] and first["UID"] == "adjunct_island"
    fields = Counter(recs[0]["field"] for recs in data.values())  # BLiMP's own (inconsistent) labels
    assert fields == {"syntax": 26, "morphology": 18, "syntax_semantics": 13, "semantics": 9,
                      "syntax/semantics": 1}
    assert len(blimp_records()) == 67_000
    assert len(blimp_digest()) == 64


def test_only_data_jsonl_members_are_read(tmp_path):
    z = tmp_path / "mini.zip"
    rec = {"sentence_good": "A cat runs.", "sentence_bad": "A cat run.", "UID": "toy", "pairID": "0"}
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("data/toy.jsonl", json.dumps(rec) + "\n")
        f.writestr("data/.DS_Store", b"\x00\x00\x00\x01Bud1")
        f.writestr("__MACOSX/data/._toy.jsonl", b"\x00\x05\x16\x07")
        f.writestr("README.md", "not data")
    assert load_blimp(str(z)) == {"toy": [rec]}
    with zipfile.ZipFile(z, "a") as f:
        f.writestr("data/other.jsonl", json.dumps(rec) + "\n")  # UID disagrees with the file name
    with pytest.raises(ValueError, match="other.jsonl:1"):
        load_blimp(str(z))
    with pytest.raises(ValueError, match="escapes"):
        load_blimp("../BLiMP.zip")
