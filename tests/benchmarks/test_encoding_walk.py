"""benchmarks/encoding_walk.py at this tree: the probe on known objects, and one measured walk
(the pope_jsb grid planned, handed to the worker's entry and trained one tiny step on CPU, about
15 s) whose counts must describe a real path to the PoPE kernel."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import encoding_walk as ew


def test_find_pe_reaches_the_encoding_in_mappings_and_configs():
    from phaselab.workloads.config import from_dict
    from phaselab.workloads.models.config import ModelConfig

    pe = {"kind": "pope"}
    assert ew.find_pe({"defaults": {"model": {"pe": pe}}}) is pe
    assert ew.find_pe({"model": {"pe": {"kind": "rope"}}}) is None
    assert ew.find_pe("pope") is None   # the bare kind string is counted as a dispatch, not found
    cfg = from_dict(ModelConfig, {"vocab_size": 8, "block_size": 8, "n_layer": 1, "n_head": 2,
                                  "d_model": 8, "pe": {"kind": "pope"}})
    assert ew.find_pe(cfg) is cfg.pe
    assert ew.find_pe({"a": [1, {"b": cfg}]}) is cfg.pe
    assert ew.find_pe({"a": {"b": {"c": {"d": {"e": pe}}}}}) is None   # deeper than 4 levels


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("walk") / "walk"
    rc = ew.main(["--backend", "reference", "--grid", str(ROOT / "experiments" / "pope_jsb.yaml"),
                  "--out", str(out)])
    return rc, json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".md").read_text()


def test_walk_reaches_the_kernel_with_sane_counts(measured):
    rc, doc, md = measured
    (result,) = doc["results"]
    m = result["metrics"]
    assert rc == 0 and result["outcome"]["ok"], result["outcome"]
    assert m["backend"] == "reference"
    assert m["kernel_entry_reached"] and m["kernel_entry"] == "kernels/pope/reference.py:pope_scores"
    chain = m["hops_chain"]
    assert chain[0].startswith("orchestrator/engine/runner.py:execute:")   # the worker's entry
    assert chain[-1].startswith("kernels/pope/reference.py:pope_scores:")
    assert any(":CausalSelfAttention.forward:" in c for c in chain)
    assert m["hops_frames"] == len(chain) >= m["hops_functions"] >= m["hops_files"] > 1
    assert m["kernel_calls"] >= 2   # the training forward and the final evaluation's
    assert "workloads/config.py:from_dict" in m["config_functions"]
    assert m["config_functions_handed_pe"] >= m["config_files_handed_pe"] > 0
    assert m["pe_representation_chain"][0].startswith("builtins.dict @ ")
    assert any(".PEConfig @ " in c for c in m["pe_representation_chain"])
    assert any(".ScoreMod @ " in c for c in m["pe_representation_chain"])
    carrying = m["by_phase_carrying"]
    assert carrying["config"]["phaselab.workloads.models.config.ModelConfig"] >= 1
    assert carrying["worker"]["phaselab.workloads.models.config.PEConfig"] >= 1   # parsed again there
    assert m["config_constructions"] >= m["config_constructions_carrying_pe"] >= 2
    assert m["converter_calls"] >= m["converter_calls_carrying_pe"] > 0
    assert m["kind_string_calls"] > 0 and m["kind_test_lines"] > 0
    assert doc["meta"]["command"].startswith("python benchmarks/encoding_walk.py")
    assert "| hops: distinct files |" in md
