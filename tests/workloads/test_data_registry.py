"""Every offline dataset kind through the one registry: protocol, digests, strict configs."""

from __future__ import annotations

import re

import pytest

from phaselab.workloads.config import ConfigError, from_dict, to_dict
from phaselab.workloads.data import (
    DataConfig,
    Dataset,
    IndirectIndexingConfig,
    build_dataset,
    register,
    registered_kinds,
    resolve_path,
)

OFFLINE = {
    "indirect_indexing": (66, 48),
    "jsb": (90, 2048),
    "text": (65, 256),
    "dna": (4107, 1000),
}


@pytest.mark.parametrize("kind", sorted(OFFLINE))
def test_offline_kinds_follow_the_protocol(kind, tmp_path):
    cfg = DataConfig(kind=kind, cache_dir=str(tmp_path), ii=IndirectIndexingConfig(n_valid=64, n_test=64))
    ds = build_dataset(cfg)
    assert isinstance(ds, Dataset)
    assert (ds.vocab_size, ds.block_size) == OFFLINE[kind]
    assert re.fullmatch(r"[0-9a-f]{64}", ds.digest) and ds.digest == build_dataset(cfg).digest
    assert build_dataset(DataConfig(kind=kind, cache_dir=str(tmp_path), block_size=ds.block_size + 4)).digest != ds.digest
    b = ds.get_batch("train", 0, 2, seed=0)
    assert b.x_BT.shape[0] == 2 and b.x_BT.shape[1] <= ds.block_size
    assert int(b.x_BT.max()) < ds.vocab_size and b.n_scored > 0
    first = next(iter(ds.eval_batches("valid", 2)))
    assert first.n_scored > 0


def test_config_round_trip_and_strictness():
    cfg = from_dict(DataConfig, {"kind": "jsb", "block_size": 1024, "jsb": {"long_sequence_policy": "truncate"}})
    assert from_dict(DataConfig, to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="out_of_range"):
        from_dict(DataConfig, {"ii": {"out_of_rang": "resample"}})
    with pytest.raises(ConfigError, match="'clip' is not one of"):
        from_dict(DataConfig, {"ii": {"out_of_range": "clip"}})


def test_registry_and_paths(tmp_path):
    assert {"indirect_indexing", "jsb", "text", "dna", "maestro", "openwebtext", "pg19", "human_genome",
            "tokens"} <= set(registered_kinds())
    with pytest.raises(ValueError, match="module:Class"):
        register("bad", "no_colon")
    with pytest.raises(ValueError, match="block_size"):
        build_dataset(DataConfig(block_size=1))
    with pytest.raises(TypeError, match="DataConfig"):
        build_dataset({"kind": "jsb"})
    (tmp_path / "inside").mkdir()
    (tmp_path / "f.txt").write_text("x")
    assert resolve_path("f.txt", root=tmp_path, what="p") == (tmp_path / "f.txt").resolve()
    (tmp_path / "inside" / "link").symlink_to(tmp_path / "f.txt")
    with pytest.raises(ValueError, match="escapes"):
        resolve_path("link", root=tmp_path / "inside", what="p")  # a symlink out of the root
    with pytest.raises(ValueError, match="escapes"):
        resolve_path("../f.txt", root=tmp_path / "inside", what="p")
    assert resolve_path(str(tmp_path / "f.txt"), root=tmp_path / "inside", what="p").is_file()  # explicit absolute
