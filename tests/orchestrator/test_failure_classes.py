"""Failure classification and the retry policy table (DESIGN §5.9)."""

from __future__ import annotations

import errno

import pytest

from phaselab.orchestrator.failures import POLICIES, classify, message_of


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
    (lambda: OSError(errno.ENOSPC, "No space left on device"), "storage"),
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
    for cls in ("oom", "divergence", "data", "config", "code"):
        assert not POLICIES[cls].retry and POLICIES[cls].advice
    assert POLICIES["code"].fail_fast and not POLICIES["config"].fail_fast
    assert "grad_accum" in POLICIES["oom"].advice
