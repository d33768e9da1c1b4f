"""phaselab.workloads.paths: the one check of user-given paths and of the run folders we write
(NUL, length, type, confinement after every symlink), and the writers and readers that use it:
CheckpointDir never saves through a symlink leading out of its run folder, and a damaged or
foreign model.pt is refused naming the file, a pickle that names code never run."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from phaselab.workloads.models.checkpoint_io import UnreadableCheckpoint, load_config, load_model, save_model
from phaselab.workloads.models.presets import preset
from phaselab.workloads.models.transformer import Transformer
from phaselab.workloads.paths import (
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    PathRefused,
    check_path,
    check_run_folder,
    confine,
)
from phaselab.workloads.train.checkpoint import CheckpointDir, load_train_state


def _refused(match: str, raw, **kw) -> str:
    with pytest.raises(PathRefused, match=match) as info:
        check_path(raw, what="out_dir", **kw)
    message = str(info.value)
    assert "\n" not in message and message.startswith("out_dir")
    return message


def test_nul_length_and_type_are_refused_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    assert "'a\\x00b'" in _refused("NUL byte", "a\x00b")
    assert f"{MAX_PATH_BYTES + 1} bytes long" in _refused("at most 4095", "d/" * 2047 + "xy")
    assert f"name of {MAX_NAME_BYTES + 1} bytes" in _refused("at most 255", "runs/" + "n" * 256)
    assert check_path("runs/" + "n" * 255, what="out_dir", expect="new_dir") == Path("runs/" + "n" * 255)
    _refused("must be a path string, got int 3", 3)
    _refused("is empty", "")
    _refused("names an existing file; expected a folder", str(tmp_path / "afile"), expect="new_dir")
    _refused("which is a file, not a folder", str(tmp_path / "afile" / "run"), expect="new_dir")
    _refused("is a folder; expected a file", str(tmp_path), expect="file")
    _refused("does not exist; expected a file", str(tmp_path / "nope"), expect="file")
    _refused("names an existing file; expected a folder", str(tmp_path / "afile"), expect="dir")
    assert check_path(tmp_path / "afile", what="out_dir", expect="file") == tmp_path / "afile"


def test_confinement_resolves_every_symlink_on_the_way(tmp_path: Path) -> None:
    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / "runs").mkdir(parents=True)
    outside.mkdir()
    (project / "runs" / "away").symlink_to(outside)
    (project / "runs" / "here").symlink_to(project / "runs")
    assert check_path(project / "runs" / "here" / "x", what="out_dir", expect="new_dir",
                      within=project) == project / "runs" / "here" / "x"
    message = _refused("outside", str(project / "runs" / "away" / "deep" / "x"), expect="new_dir", within=project)
    assert f"leads to '{outside / 'deep' / 'x'}'" in message
    (project / "loop1").symlink_to(project / "loop2")
    (project / "loop2").symlink_to(project / "loop1")
    _refused("cannot be resolved", str(project / "loop1" / "x"), expect="new_dir")
    with pytest.raises(PathRefused, match="outside"):
        confine(project / "runs" / "away", project / "runs")


def test_a_symlink_anywhere_in_a_run_folder_that_leads_outside_is_refused(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "checkpoints" / "step_0000001").mkdir(parents=True)
    outside.mkdir()
    check_run_folder(run)
    check_run_folder(tmp_path / "missing")            # nothing in it yet
    (run / "inner").symlink_to(run / "checkpoints")   # a link that stays inside is fine
    check_run_folder(run)
    (run / "checkpoints" / "step_0000001" / "metrics.json").symlink_to(outside / "stolen.json")
    with pytest.raises(PathRefused, match="metrics.json' leads to .*outside") as info:
        check_run_folder(run)
    assert str(info.value).startswith(f"run folder '{run}': symlink")
    (run / "checkpoints" / "step_0000001" / "metrics.json").unlink()
    for i in range(5):
        (run / f"f{i}").write_text("")
    with pytest.raises(PathRefused, match="more than 4 entries"):
        check_run_folder(run, max_entries=4)


def test_ray_train_refuses_such_a_run_folder_before_any_worker_starts(tmp_path: Path) -> None:
    """``ray_entry.fit`` (the multi-worker launcher) checks its run folder as run_training does."""
    from phaselab.workloads.train.ray_entry import fit

    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "checkpoints").symlink_to(outside)
    spec = {"model": {"vocab_size": 66, "block_size": 8, "n_layer": 1, "n_head": 1, "d_model": 8},
            "data": {"kind": "text", "block_size": 8}, "train": {"steps": 1, "device": "cpu"}}
    with pytest.raises(PathRefused, match="checkpoints' leads to .*outside"):
        fit(spec, out_dir=run, run_name="r", storage_path=tmp_path / "ray")
    assert not any(outside.iterdir()) and not (tmp_path / "ray").exists()


def test_checkpoint_dir_never_saves_through_a_symlink_out_of_its_run_folder(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "checkpoints").symlink_to(outside)
    with pytest.raises(PathRefused, match="checkpoint folder .*checkpoints' leads to .*outside"):
        CheckpointDir(run / "checkpoints").save(1, lambda d: (d / "model.pt").write_text("w"))
    assert list(outside.iterdir()) == []
    inside = CheckpointDir(tmp_path / "run2" / "checkpoints").save(3, lambda d: (d / "model.pt").write_text("w"))
    assert inside == tmp_path / "run2" / "checkpoints" / "step_0000003"
    assert (inside / "model.pt").read_text() == "w"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = Transformer(preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=16, vocab_size=64))
    return save_model(model, tmp_path_factory.mktemp("ckpt") / "model.pt")


def test_damaged_checkpoints_are_refused_naming_the_file(model_file: Path, tmp_path: Path) -> None:
    assert load_config(model_file).d_model == 32
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(model_file.read_bytes()[:3000])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(bytes(range(256)) * 20)
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for path in (truncated, garbage, text):
        for load in (load_model, load_config):
            with pytest.raises(UnreadableCheckpoint, match="is not a readable phaselab.model/1 file") as info:
                load(path)
            assert str(info.value).startswith(f"checkpoint '{path}'") and "\n" not in str(info.value)
    with pytest.raises(PathRefused, match="is a folder; expected a file"):
        load_model(tmp_path)
    with pytest.raises(UnreadableCheckpoint, match="truncated"):
        load_train_state(truncated)
    payload = torch.load(model_file, weights_only=True)
    payload["state_dict"] = {k: v[..., :1] for k, v in payload["state_dict"].items()}
    torch.save(payload, tmp_path / "shapes.pt")
    with pytest.raises(UnreadableCheckpoint, match="its weights do not fit its model config"):
        load_model(tmp_path / "shapes.pt")


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_pickle_that_names_code_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    torch.save({"format": "phaselab.model/1", "x": _RunsCode(marker)}, tmp_path / "zip.pt")
    with open(tmp_path / "plain.pt", "wb") as f:
        pickle.dump({"format": "phaselab.model/1", "x": _RunsCode(marker)}, f)
    for name in ("zip.pt", "plain.pt"):
        with pytest.raises(UnreadableCheckpoint, match="objects other than tensors .* refused unrun"):
            load_model(tmp_path / name)
    assert not marker.exists()
