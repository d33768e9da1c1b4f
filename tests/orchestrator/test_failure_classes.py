"""Failure classification and the retry policy table (DESIGN §5.9)."""

from __future__ import annotations

import errno

import pytest

from phaselab.orchestrator.engine.failures import (
    POLICIES,
    classify,
    describe_resource,
    failure_report,
    message_of,
)


def _diverged():
    from phaselab.workloads.train.loop import TrainingDiverged

    return TrainingDiverged(7, "loss is nan")


def _config_error():
    from phaselab.workloads.config import ConfigError

    return ConfigError("train.lrr: unknown key for TrainConfig")


def _chained(outer: type[BaseException], inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer("wrapped") from e
    except BaseException as e:  # noqa: BLE001
        return e


def _sqlite_error(text: str) -> BaseException:
    import sqlite3

    return sqlite3.OperationalError(text)


class OutOfMemoryError(RuntimeError):   # the name torch.cuda and Ray both use
    pass


@pytest.mark.parametrize("make,expected", [
    (_diverged, "divergence"),
    (lambda: _chained(RuntimeError, _diverged()), "divergence"),
    (_config_error, "config"),
    (lambda: ValueError("model.block_size=16 < data block_size=32"), "config"),
    (lambda: TypeError("expects a DataConfig"), "config"),
    (lambda: KeyError("x"), "code"),
    (lambda: AttributeError("no attribute"), "code"),
    (lambda: RuntimeError("shape mismatch"), "code"),
    (lambda: MemoryError(), "oom"),
    (lambda: OutOfMemoryError("CUDA out of memory. Tried to allocate"), "oom"),
    (lambda: RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), "oom"),
    (lambda: FileNotFoundError(2, "No such file", "train.bin"), "data"),
    (lambda: OSError(errno.ENOSPC, "No space left on device"), "resource"),
    (lambda: OSError(errno.EROFS, "Read-only file system", "/x/ckpt"), "resource"),
    (lambda: PermissionError(errno.EACCES, "Permission denied", "/x/ckpt"), "resource"),
    (lambda: OSError(errno.EMFILE, "Too many open files"), "resource"),
    (lambda: _chained(RuntimeError, OSError(errno.EDQUOT, "Disk quota exceeded")), "resource"),
    (lambda: _sqlite_error("database or disk is full"), "resource"),
    (lambda: _sqlite_error("attempt to write a readonly database"), "resource"),
    (lambda: RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"), "resource"),
    (lambda: RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), "resource"),
    (lambda: RuntimeError("unexpected pos in my parser"), "code"),   # only torch's writer error says that
    (lambda: OSError(errno.EIO, "Input/output error"), "storage"),
    (lambda: OSError(errno.ESTALE, "Stale file handle"), "storage"),
    (lambda: RuntimeError("NCCL timeout in allreduce"), "nccl"),
    (lambda: KeyboardInterrupt(), "cancelled"),
])
def test_classify(make, expected: str) -> None:
    assert classify(make()) == expected


def test_classify_ray_errors() -> None:
    import ray.exceptions as rex

    assert classify(rex.WorkerCrashedError()) == "preemption"
    assert classify(rex.NodeDiedError("node gone")) == "preemption"
    wrapped = rex.RayTaskError("execute", "Traceback ...", _diverged()).as_instanceof_cause()
    assert classify(wrapped) == "divergence"
    assert message_of(wrapped) == "TrainingDiverged: training diverged at step 7: loss is nan"
    wrapped = rex.RayTaskError("execute", "Traceback ...", KeyError("k")).as_instanceof_cause()
    assert classify(wrapped) == "code"


def test_policies() -> None:
    assert POLICIES["preemption"].retry and POLICIES["preemption"].max_retries >= 100
    assert POLICIES["storage"].retry and POLICIES["storage"].backoff_s > 0
    # a full or read-only disk is no code error: it fails no other stage and is not retried blindly
    assert not POLICIES["resource"].retry and not POLICIES["resource"].fail_fast
    assert "--class resource" in POLICIES["resource"].advice
    for cls in ("oom", "divergence", "data", "config", "code"):
        assert not POLICIES[cls].retry and POLICIES[cls].advice
    assert POLICIES["code"].fail_fast and not POLICIES["config"].fail_fast
    assert "grad_accum" in POLICIES["oom"].advice


def _full_write() -> OSError:
    """A real ENOSPC from the kernel: /dev/full refuses every write with it."""
    try:
        with open("/dev/full", "wb", buffering=0) as f:
            f.write(b"x")
    except OSError as err:
        return err
    raise AssertionError("/dev/full took a write")


def test_a_full_disk_is_one_line_naming_the_path_and_the_fix(tmp_path) -> None:
    import ray.exceptions as rex

    err = _full_write()
    report = failure_report(err, where=tmp_path / "run")
    assert report["failure_class"] == "resource"
    msg = report["message"]
    assert msg.startswith(f"no space left on device at {tmp_path / 'run'}") and "\n" not in msg
    assert f"df -h {tmp_path / 'run'}" in msg and "--class resource" in msg and "PHASELAB_RUNS_ROOT" in msg
    # the same fault out of a Ray worker that died of it
    wrapped = rex.RayTaskError("execute", "Traceback ...", err).as_instanceof_cause()
    assert failure_report(wrapped, where=tmp_path)["failure_class"] == "resource"
    named = PermissionError(errno.EACCES, "Permission denied", "/srv/runs/ckpt.pt")
    assert describe_resource(named).startswith("permission denied at /srv/runs/ckpt.pt (running as uid ")
    assert describe_resource(KeyError("k")) is None
    assert failure_report(KeyError("k")) == {"ok": False, "failure_class": "code", "message": "KeyError: 'k'"}


def test_torch_save_on_a_full_device_is_a_resource_fault(tmp_path) -> None:
    """torch.save reports ENOSPC as an 'enforce fail ... unexpected pos' RuntimeError, without
    errno or path; it was classed as a code error, which fails every stage sharing the code hash."""
    import torch

    with pytest.raises(RuntimeError) as info:
        torch.save({"w": torch.zeros(4096)}, "/dev/full")
    report = failure_report(info.value, where=tmp_path)
    assert report["failure_class"] == "resource"
    assert report["message"].startswith(f"a write failed, most likely for lack of space at {tmp_path}")


def test_torch_save_on_a_full_filesystem_names_it(tmp_path) -> None:
    import torch
    from _fs_faults import fill, tiny_fs

    with tiny_fs(tmp_path / "disk", size_kb=256) as disk:
        fill(disk)
        out = disk / "runs" / "abc"
        with pytest.raises(RuntimeError) as info:
            torch.save({"w": torch.zeros(65536)}, disk / "ckpt.pt")
        report = failure_report(info.value, where=out)
    assert report["failure_class"] == "resource"
    assert report["message"].startswith(f"no space left on device at {out}, 0.0 MiB free: free space there")
