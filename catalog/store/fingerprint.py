"""The environment fingerprint recorded with every stage attempt (DESIGN §4).

It is stored *separately from the cache key* (DESIGN §5.4): two runs with the same key but
different fingerprints are the same experiment run in different environments, which ``plan``
reports as a warning. Nothing here imports torch: the device and CUDA/NCCL versions are read from
torch only if the calling process has already imported it.

Keys of :func:`env_fingerprint` (the ``attempt`` table has a column for the first seven):

============== =====================================================================
git_sha         HEAD of the source checkout, or None outside git
dirty_diff_hash sha256 of ``git diff HEAD --binary`` plus untracked file names; None if clean
device          GPU name (e.g. "NVIDIA H200") or "cpu"
world_size      number of training ranks
seeds           per-rank seeds (list) or one seed
attn_backend    attention backend(s) that ran: a name or {call site: backend}
packages        {distribution: version or None} for the packages of DESIGN §4
deterministic   whether the backward was deterministic (None: not known)
provenance      what the process that ran the model reported (``workloads.provenance``):
                attention call sites and implementations, determinism, precision, graph
                mode, device; None for stages that run no model
python, platform, host, cuda, nccl, extra
============== =====================================================================
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("phaselab", "torch", "triton", "deepspeed", "ray", "lm-eval", "mlflow", "sqlalchemy",
            "alembic", "pyarrow", "numpy")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when it is not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(repo: Path, *args: str) -> bytes | None:
    try:
        res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def git_state(repo: Path | None = None) -> tuple[str | None, str | None]:
    """(HEAD sha, dirty-diff hash or None when clean) of the checkout holding ``repo``."""
    repo = Path(__file__).resolve().parent if repo is None else Path(repo)
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return None, None
    diff = _git(repo, "diff", "HEAD", "--binary") or b""
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard") or b""
    if not diff and not untracked:
        return head.decode().strip(), None
    return head.decode().strip(), hashlib.sha256(diff + b"\0" + untracked).hexdigest()


def device_info() -> dict[str, str | None]:
    """Device name and CUDA/NCCL versions, from torch only if it is already imported."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return {"device": "cpu", "cuda": None, "nccl": None}
    nccl = None
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001  NCCL absent from this build: record that, do not fail the stage
        nccl = None
    return {"device": torch.cuda.get_device_name(0), "cuda": torch.version.cuda, "nccl": nccl}


def env_fingerprint(*, seeds: Any = None, world_size: int | None = None, attn_backend: Any = None,
                    deterministic: bool | None = None, provenance: Mapping[str, Any] | None = None,
                    repo: Path | None = None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fingerprint dict documented in the module docstring (JSON-safe)."""
    sha, dirty = git_state(repo)
    env: dict[str, Any] = {
        "git_sha": sha, "dirty_diff_hash": dirty, **device_info(), "world_size": world_size,
        "seeds": seeds, "attn_backend": dict(attn_backend) if isinstance(attn_backend, Mapping)
        else attn_backend, "deterministic": deterministic,
        "provenance": None if provenance is None else dict(provenance), "packages": package_versions(),
        "python": platform.python_version(), "platform": platform.platform(),
        "host": socket.gethostname(), "extra": dict(extra or {}),
    }
    if provenance and provenance.get("device"):   # the device the model ran on, wherever that was
        env["device"] = provenance["device"]
    json.dumps(env)  # fail here, not in the catalog, if a caller passed something unserialisable
    return env


def what_ran(env: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flat fields that exports and table footnotes carry from a stage's fingerprint:
    ``attn_backend`` ("sdpa", "sdpa,triton"), ``attn_impl`` ("pope=cudnn,sdpa=cudnn"),
    ``deterministic``, ``precision``, ``graph_mode`` ("eager", "compile", "cuda_graphs",
    "compile+cuda_graphs") and ``device``; None where the stage recorded nothing."""
    env = env or {}
    ran = env.get("provenance") or {}
    attention = ran.get("attention") or {}
    backend = env.get("attn_backend")
    if isinstance(backend, Mapping):
        backend = ",".join(sorted(set(map(str, backend.values())))) or None
    impls = ",".join(f"{op}={'|'.join(map(str, v))}" for op, v in sorted((attention.get("impls") or {}).items()))
    modes = [m for m in ("compile", "cuda_graphs") if ran.get(m)]
    return {"attn_backend": backend, "attn_impl": impls or None, "deterministic": env.get("deterministic"),
            "precision": ran.get("precision"), "graph_mode": ("+".join(modes) or "eager") if ran else None,
            "device": ran.get("device") or env.get("device")}

