"""Failure classes and the retry policy (DESIGN §5.9).

=============  =========================================================================  =======
class          examples                                                                   retried
=============  =========================================================================  =======
preemption     Ray worker/node/actor died (spot preemption, kill -9, OOM-killer on a       yes, resumes
               worker process), lost objects                                              from checkpoint
hung           the stage's worker stopped heartbeating while its task still ran (the       yes, up to 2 times
               controller force-cancels it; a worker stuck in a deadlock or a frozen      (POLICIES), resumes
               process, which would hang again as often as it is relaunched)              from checkpoint
nccl           NCCL / collective timeouts (DistBackendError)                              yes, up to max_retries
storage        ENOSPC / EIO / stale NFS handle                                            yes, with backoff
oom            CUDA/host out of memory, Ray's memory monitor                              no: advice
divergence     TrainingDiverged (NaN/Inf loss or gradient)                                no
data           missing or corrupt data files                                              no
config         ConfigError / ValueError / TypeError raised by a workload on its input     no
code           anything else (AttributeError, KeyError, RuntimeError, ...)                no; fail fast for every
                                                                                          stage with the same code hash
=============  =========================================================================  =======

``hung`` is never the result of :func:`classify` (no exception says it): the controller assigns it
when it cancels a silent worker (``controller.Controller._watch``).

Classification walks the exception, its class hierarchy (Ray's ``RayTaskError`` subclasses the
remote exception's class) and its cause chain, by class *name*, so the controller can classify
without importing torch.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

CLASSES = ("preemption", "hung", "nccl", "storage", "oom", "divergence", "data", "config", "code", "cancelled")


@dataclass(frozen=True, slots=True)
class Policy:
    retry: bool
    max_retries: int | None = None      # None: the stage's own max_retries
    backoff_s: float = 0.0
    advice: str = ""
    fail_fast: bool = False             # fail every pending stage that shares the code hash


POLICIES: dict[str, Policy] = {
    # DESIGN §5.9: preemptions have an unlimited budget; a cap stops a crash loop from spinning.
    "preemption": Policy(retry=True, max_retries=100),
    # A worker that went silent while its task kept running is most likely stuck in the stage's
    # own code (a deadlock, a wedged collective); unlike a preemption it would hang again on every
    # relaunch, each costing stale_after_s of a held allocation: a small budget, then FAILED.
    "hung": Policy(retry=True, max_retries=2, advice=(
        "the stage's worker stopped heartbeating and was cancelled after every retry: look for a "
        "deadlock or a stuck collective in its logs (py-spy dump on a live one), or raise the "
        "controller's stale_after_s if the stage blocks its heartbeat thread for long stretches")),
    "nccl": Policy(retry=True),
    "storage": Policy(retry=True, backoff_s=5.0),
    "oom": Policy(retry=False, advice=(
        "out of memory: raise train.grad_accum (smaller micro-batches; grad_accum is not part of the "
        "cache key, so the stage keeps its identity) or give the stage more resources.memory_gb / GPUs, "
        "then `phaselab retry GRID --failed --class oom`")),
    "divergence": Policy(retry=False, advice=(
        "training diverged (NaN/Inf): lower train.lr, lengthen train.warmup or lower train.grad_clip; "
        "a changed config is a new stage")),
    "data": Policy(retry=False, advice="fix the dataset (path, download, shards) and retry"),
    "config": Policy(retry=False, advice="the workload rejected its config; fix the grid"),
    "code": Policy(retry=False, fail_fast=True, advice=(
        "a code error: every pending stage with the same code hash is failed fast; fix the code "
        "(which changes the code hash) and run again")),
    "cancelled": Policy(retry=False),
}


def policy_of(cls: str) -> Policy:
    """The retry policy of failure class ``cls``; an unknown class is treated as ``code``."""
    return POLICIES.get(cls, POLICIES["code"])


def retry_limit(cls: str, stage_max_retries: int) -> int | None:
    """How many attempts a stage may have had and still be retried after a ``cls`` failure:
    the class's own ``max_retries`` (preemption 100, hung 2) or else the stage's ``max_retries``;
    None when the class is never retried. Attempts count every claim of the stage, whatever
    ended it (the catalog keeps no per-class history)."""
    policy = policy_of(cls)
    if not policy.retry:
        return None
    return policy.max_retries if policy.max_retries is not None else stage_max_retries


def should_retry(cls: str, *, attempts: int, stage_max_retries: int) -> bool:
    """Whether a stage whose attempt number ``attempts`` (1 = the first) ended in ``cls`` is
    retried: ``attempts <= retry_limit``, so a limit of 2 allows 2 retries (3 attempts)."""
    limit = retry_limit(cls, stage_max_retries)
    return limit is not None and attempts <= limit


_PREEMPTION = {"WorkerCrashedError", "NodeDiedError", "ActorDiedError", "ActorUnavailableError",
               "LocalRayletDiedError", "ObjectLostError", "OwnerDiedError", "ObjectReconstructionFailedError",
               "RaySystemError", "PreemptedError", "ActorUnschedulableError"}
_OOM = {"OutOfMemoryError", "MemoryError"}
_DATA = {"FileNotFoundError", "DataError", "UnicodeDecodeError", "EOFError", "BadZipFile",
         "JSONDecodeError", "IsADirectoryError", "NotADirectoryError", "MetricsFileError"}
_CONFIG = {"ConfigError", "ValueError", "TypeError"}
_CANCELLED = {"TaskCancelledError", "KeyboardInterrupt"}
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.ESTALE, errno.EROFS}


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return seen


def _names(exc: BaseException) -> list[str]:
    return [c.__name__ for c in type(exc).__mro__]


def classify(exc: BaseException) -> str:
    """The failure class of ``exc`` (see the module table). Most specific evidence wins: any
    divergence/OOM/preemption anywhere in the chain beats the generic class of the outer error."""
    chain = _chain(exc)
    names = [n for e in chain for n in _names(e)]
    text = " ".join(str(e) for e in chain)
    if any(n in _CANCELLED for n in names):
        return "cancelled"
    if "TrainingDiverged" in names:
        return "divergence"
    if any(n in _OOM for n in names) or "CUDA out of memory" in text:
        return "oom"
    if any(n in _PREEMPTION for n in names):
        return "preemption"
    if "DistBackendError" in names or "NCCL" in text:
        return "nccl"
    for e in chain:
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return "storage"
    if any(n in _DATA for n in names):
        return "data"
    primary = _names(_primary(exc))   # the error the workload raised decides config vs code
    return "config" if primary[0] in _CONFIG or "ConfigError" in primary else "code"


def _primary(exc: BaseException) -> BaseException:
    """The workload's own exception: Ray's ``.cause`` when wrapped, else ``exc``."""
    while getattr(exc, "cause", None) is not None:
        exc = exc.cause  # type: ignore[attr-defined]
    return exc


def message_of(exc: BaseException, limit: int = 2000) -> str:
    """``ClassName: text`` of the workload's own exception, truncated to ``limit`` characters."""
    inner = _primary(exc)
    return f"{type(inner).__name__}: {inner}"[:limit]
