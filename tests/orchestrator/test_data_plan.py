"""plan checks the data from its metadata: a vocabulary larger than the model's, a block longer
than the model's and a too-short train split are refused with the grid line, before Ray."""

from __future__ import annotations

import numpy as np
import pytest
from _orchestrator_grids import BASE, locate

from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import plan_grid
from phaselab.orchestrator.stages.dataset import data_summary


def _bins(folder, n_train=500, vocab=300):
    folder.mkdir()
    np.arange(n_train, dtype=np.uint16).__mod__(vocab).astype(np.uint16).tofile(folder / "train.bin")
    np.arange(50, dtype=np.uint16).tofile(folder / "val.bin")
    return folder


def _grid(tmp_path, data: str, model: str = "{preset: tiny, block_size: 32, vocab_size: 256, pe: {kind: \"${pe}\"}}"):
    text = BASE.replace("  data: {kind: text, block_size: 32}", f"  data: {data}") \
        .replace("  model: {preset: tiny, block_size: 32, pe: {kind: \"${pe}\"}}", f"  model: {model}")
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return path, text


def test_vocabulary_mismatch_refused_by_plan(tmp_path):
    folder = _bins(tmp_path / "bins")
    path, text = _grid(tmp_path, f"{{kind: tokens, block_size: 32, real: {{shards_dir: {folder}, vocab_size: 300}}}}")
    with pytest.raises(GridError) as err:
        plan_grid(path)
    line, _ = locate(text, "vocab_size: 256")
    msg = str(err.value)
    assert f"{path}:{line}:" in msg and "stages.pretrain.model.vocab_size" in msg
    assert "300 tokens in its vocabulary, more than model.vocab_size=256" in msg
    assert data_summary({"kind": "tokens", "block_size": 32, "real": {"shards_dir": str(folder), "vocab_size": 300}}) \
        == {"vocab_size": 300, "block_size": 32, "tokens": {"train": 500, "valid": 50}}
    path, _ = _grid(tmp_path, f"{{kind: tokens, block_size: 32, real: {{shards_dir: {folder}, vocab_size: 256}}}}")
    assert len(plan_grid(path).nodes) == 4   # a fitting vocabulary plans


def test_block_and_split_sizes_checked_by_plan(tmp_path):
    path, text = _grid(tmp_path, "{kind: text, block_size: 64}")
    with pytest.raises(GridError, match=r"data.block_size=64 is longer than model.block_size=32") as err:
        plan_grid(path)
    assert f"{path}:{locate(text, 'block_size: 64')[0]}:" in str(err.value)
    folder = _bins(tmp_path / "short", n_train=20)
    path, _ = _grid(tmp_path, f"{{kind: tokens, block_size: 32, real: {{shards_dir: {folder}, vocab_size: 256}}}}")
    with pytest.raises(GridError, match=r"train split of the dataset has 20 tokens, fewer than data.block_size\+1=33"):
        plan_grid(path)
    path, _ = _grid(tmp_path, f"{{kind: tokens, block_size: 32, real: {{shards_dir: {folder}}}}}")
    with pytest.raises(GridError, match=r"cannot read the dataset: .*set data.real.vocab_size"):
        plan_grid(path)


def test_data_prepare_command_writes_shards_a_grid_plans(tmp_path):
    datasets = pytest.importorskip("datasets")
    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["alpha beta gamma " * 20] * 6}),
                          "validation": datasets.Dataset.from_dict({"text": ["delta epsilon"]})}
                         ).save_to_disk(str(tmp_path / "hf"))
    res = CliRunner().invoke(app, ["data", "prepare", str(tmp_path / "hf"), "--out", str(tmp_path / "sh"), "--json"])
    assert res.exit_code == 0, res.output
    assert '"documents": 6' in res.output and '"vocab_size": 50257' in res.output
    model = "{preset: tiny, block_size: 32, vocab_size: 50304, pe: {kind: \"${pe}\"}}"
    path, _ = _grid(tmp_path, f"{{kind: tokens, block_size: 32, real: {{shards_dir: {tmp_path / 'sh'}}}}}", model)
    assert len(plan_grid(path).nodes) == 4
    bad = CliRunner().invoke(app, ["data", "prepare", str(tmp_path / "hf"), "--out", str(tmp_path / "x"),
                                   "--text-field", "body", "--json"])
    assert bad.exit_code == 1 and "'body' is not a column" in bad.output


def test_token_folder_absent_here_is_left_to_the_stage(tmp_path):
    assert data_summary({"kind": "tokens", "real": {"shards_dir": str(tmp_path / "on-the-cluster")}}) is None
