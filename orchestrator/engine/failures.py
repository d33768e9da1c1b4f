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
storage        EIO / stale NFS handle (transient)                                         yes, with backoff
resource       the machine refused a resource: no space left (ENOSPC, EDQUOT, and the      no: the message
               writer errors torch raises for it), read-only file system (EROFS),          names the path
               permission denied (EACCES), too many open files (EMFILE, ENFILE)            and the fix
oom            CUDA/host out of memory, Ray's memory monitor                              no: advice
divergence     TrainingDiverged (NaN/Inf loss or gradient)                                no
data           missing or corrupt data files                                              no
config         ConfigError / ValueError / TypeError raised by a workload on its input     no
code           anything else (AttributeError, KeyError, RuntimeError, ...)                no; fail fast for every
                                                                                          stage with the same code hash
=============  =========================================================================  =======

A resource fault is a fact about the machine, not the code: it never fails stages fast (they did
not run), and it is not retried blindly (a full disk stays full). :func:`failure_report` turns it
into one line naming the path and the fix (:func:`describe_resource`).

``hung`` is never the result of :func:`classify` (no exception says it): the controller assigns it
when it cancels a silent worker (``controller.Controller._watch``).

Classification walks the exception, its class hierarchy (Ray's ``RayTaskError`` subclasses the
remote exception's class) and its cause chain, by class *name*, so the controller can classify
without importing torch.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

CLASSES = ("preemption", "hung", "nccl", "storage", "resource", "oom", "divergence", "data", "config", "code",
           "cancelled")


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
    "resource": Policy(retry=False, advice=(
        "the machine refused a resource (disk space, write permission, open files): fix what the "
        "message names, then `phaselab retry GRID --failed --class resource`")),
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
_STORAGE_ERRNOS = {errno.EIO, errno.ESTALE}
_RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EMFILE, errno.ENFILE}
# The same faults as text: strerror in a wrapped or re-raised message (SQLite says "database or
# disk is full" / "attempt to write a readonly database"), and the writer errors torch.save raises
# on a full disk, which never say so: "PytorchStreamWriter failed writing file data/0: file write
# failed", or "[enforce fail at inline_container.cc:...] . unexpected pos 704 vs 598" chained to
# "basic_ios::clear: iostream error" (torch 2.x caffe2/serialize/inline_container.cc, checked by
# saving to /dev/full).
_RESOURCE_TEXT = {
    "No space left on device": errno.ENOSPC, "database or disk is full": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT, "Read-only file system": errno.EROFS,
    "readonly database": errno.EROFS, "Too many open files": errno.EMFILE,
    "PytorchStreamWriter failed writing": None, "file write failed": None,
    "unexpected pos": None, "basic_ios::clear": None,
}


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
    if _resource_fault(chain) is not None:
        return "resource"
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


def _resource_fault(chain: list[BaseException]) -> tuple[int | None, str | None] | None:
    """(errno, path) of the first resource fault in ``chain`` (errno None: a torch writer error,
    which does not say why; path None: not named), None when there is none."""
    for e in chain:
        if isinstance(e, OSError) and e.errno in _RESOURCE_ERRNOS:
            name = e.filename if e.filename is not None else e.filename2
            return e.errno, None if name is None else str(name)
    for e in chain:
        text = str(e)
        for needle, code in _RESOURCE_TEXT.items():
            if needle in text and (needle != "unexpected pos" or "inline_container" in text):
                return code, None
    return None


_LOW_FREE_BYTES = 16 << 20


def _probe(path: Path | None) -> tuple[int | None, int | None]:
    """(errno the file system holding ``path`` explains, free bytes): EROFS when it is mounted
    read-only, ENOSPC when under 16 MiB or 1 % of it is free, else None; (None, None) when there
    is no such path."""
    folder = path
    while folder is not None and not folder.exists():
        folder = folder.parent if folder.parent != folder else None
    if folder is None:
        return None, None
    try:
        st = os.statvfs(folder)
    except OSError:
        return None, None
    free = st.f_bavail * st.f_frsize
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS, free
    if free < min(_LOW_FREE_BYTES, st.f_blocks * st.f_frsize // 100) or free < _LOW_FREE_BYTES // 16:
        return errno.ENOSPC, free
    return None, free


def describe_resource(exc: BaseException, where: Path | None = None) -> str | None:
    """One line saying which resource failed, at which path, and the fix; None when ``exc`` is
    not a resource fault. ``where``: the folder the failing work wrote to (a stage's out_dir),
    used when the error names no path, and probed for the cause of torch's writer errors."""
    fault = _resource_fault(_chain(exc))
    if fault is None:
        return None
    code, named = fault
    path = Path(named) if named else where
    probed, free = _probe(path)
    code = code if code is not None else probed
    at = str(path) if path is not None else "an unnamed path"
    move = "or move the runs to another disk (PHASELAB_RUNS_ROOT / --runs-root, or PHASELAB_HOME)"
    if code in (errno.ENOSPC, errno.EDQUOT, None):
        what = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                None: "a write failed, most likely for lack of space"}[code]
        left = f", {free / 2**20:.1f} MiB free" if free is not None else ""
        line = f"{what} at {at}{left}: free space there (df -h {at}) {move}"
    elif code == errno.EROFS:
        line = f"read-only file system at {at}: remount it read-write {move}"
    elif code == errno.EACCES:
        line = (f"permission denied at {at} (running as uid {os.getuid()}): make it writable for this "
                f"user (ls -ld {at}) {move}")
    else:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        line = (f"too many open files at {at} (ulimit -n is {soft}): raise the limit (ulimit -n, or "
                f"LimitNOFILE= for a service) on every node")
    inner = _primary(exc)
    said = " ".join(str(inner).split())[:200]
    return f"{line}; then `phaselab retry GRID --failed --class resource` (from {type(inner).__name__}: {said})"


def failure_report(exc: BaseException, where: Path | None = None) -> dict[str, object]:
    """``{"ok": False, "failure_class", "message"}`` for ``exc``: a resource fault's message is
    :func:`describe_resource`'s line, any other's :func:`message_of`."""
    cls = classify(exc)
    message = describe_resource(exc, where) if cls == "resource" else None
    return {"ok": False, "failure_class": cls, "message": message or message_of(exc)}
