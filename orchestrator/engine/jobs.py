"""``phaselab submit --address``: the grid's controller as a Ray job (DESIGN §5.2), with a
deterministic submission id, and clean errors for an unreachable Jobs API or a refused token.

Credentials (a catalog URL with a password, an MLflow URI with one) never travel in the clear:
Ray writes a job's runtime_env to ``runtime_env_agent.log`` (world-readable on the head) and
serves it in its Jobs API. They travel sealed (Fernet: AES-128-CBC + HMAC-SHA256) with a key
derived from the cluster's token, which the head's job driver holds too; ``phaselab resume``
unseals them into its own environment before it opens the catalog (:func:`unseal_env`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def _ray_auth_headers() -> dict[str, str] | None:
    """Ray 2.60 dashboards require token auth by default (STACK.md); the client sends the token
    only with RAY_AUTH_MODE=token, so pass the user's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
    ~/.ray/auth_token) explicitly when there is one."""
    from phaselab.orchestrator.engine.ray_local import find_token

    token = find_token()[0]
    return {"Authorization": f"Bearer {token}"} if token else None


# Settings a submitted controller needs; they travel in the job's environment (runtime_env),
# never in its entrypoint, which the Jobs API, the job log and the process list show.
# The cluster's token is not among them: the job driver runs on the head, which has its own.
JOB_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_DISABLE_TELEMETRY", "PHASELAB_MAX_CELLS", "PHASELAB_MAX_STAGES",
           "PHASELAB_RESOURCE_WAIT_S")
SEALED_ENV = "PHASELAB_SEALED_ENV"


def _fernet(token: str) -> Any:
    import base64
    import hashlib

    from cryptography.fernet import Fernet

    key = hashlib.sha256(b"phaselab-sealed-env\0" + token.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def seal_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with its credentials (``mlflow_common.is_secret``) replaced by one variable,
    SEALED_ENV, that only a holder of the cluster's token opens. ValueError when there are
    credentials and no token (they would otherwise travel in the clear)."""
    import json

    from phaselab.catalog.tracking.mlflow_common import split_secrets
    from phaselab.orchestrator.engine.ray_local import TOKEN_HELP, find_token

    public, secret = split_secrets(env)
    if not secret:
        return public
    token, where = find_token()
    if token is None:
        raise ValueError(f"{', '.join(sorted(secret))} hold(s) a credential, which a submitted job receives "
                         f"sealed with the cluster's token, and no token was found in {where}: {TOKEN_HELP}")
    return {**public, SEALED_ENV: _fernet(token).encrypt(json.dumps(secret).encode()).decode()}


def unseal_env() -> list[str]:
    """Open SEALED_ENV (set by :func:`seal_env`) into this process's environment and drop it;
    returns the names set. ValueError when it is there and this process's token cannot open it."""
    import json

    from cryptography.fernet import InvalidToken

    from phaselab.orchestrator.engine.ray_local import find_token

    sealed = os.environ.pop(SEALED_ENV, None)
    if not sealed:
        return []
    token, where = find_token()
    try:
        secret = json.loads(_fernet(token or "").decrypt(sealed.encode()))
    except (InvalidToken, ValueError):
        raise ValueError(f"{SEALED_ENV} cannot be opened with the token from {where}: the job was "
                         f"submitted with another cluster's token") from None
    os.environ.update(secret)
    return sorted(secret)


def job_request(address: str, grid: str, catalog_url: str, runs_root: Path | None,
                version: int | None = None) -> dict[str, Any]:
    """``entrypoint`` and ``runtime_env`` of the Ray job that runs ``phaselab resume GRID``
    against this catalog and runs root: the catalog URL only in ``runtime_env.env_vars``, sealed
    with the cluster's token when it holds a password (:func:`seal_env`)."""
    import shlex

    from phaselab.orchestrator.engine.controller import default_runs_root

    root = Path(runs_root or default_runs_root()).resolve()
    # A local cluster runs jobs with this interpreter; a remote one with the image's `python`.
    host = address.split("://", 1)[-1].split(":", 1)[0]
    python = sys.executable if host in ("127.0.0.1", "localhost") else "python"
    entry = " ".join(shlex.quote(a) for a in (python, "-m", "phaselab.orchestrator.cli.main", "resume", grid,
                                              "--runs-root", str(root),
                                              *(("--version", str(version)) if version else ())))
    env = {k: v for k in JOB_ENV if (v := os.environ.get(k))}
    env["PHASELAB_CATALOG_URL"] = catalog_url
    return {"entrypoint": entry, "runtime_env": {"env_vars": seal_env(env)}}


def submit_job(address: str, dag: Any, catalog_url: str, runs_root: Path | None,
                version: int | None = None) -> dict[str, Any]:
    """Launch (or attach to) the grid's controller as a Ray job with a deterministic id
    (DESIGN §5.2); see :func:`job_request`. ClusterAccessError when the Jobs API cannot be
    reached or refuses the token."""
    from ray.exceptions import AuthenticationError

    from phaselab.orchestrator.engine.ray_local import TOKEN_HELP, ClusterAccessError, find_token

    try:
        return _submit_job_to(address, dag, catalog_url, runs_root, version)
    except AuthenticationError:
        token, where = find_token()
        why = f"rejected the token from {where}" if token else f"requires a token and none was found in {where}"
        raise ClusterAccessError(f"the Ray Jobs API at {address} {why}: {TOKEN_HELP}") from None
    except ConnectionError as err:
        raise ClusterAccessError(f"cannot reach the Ray Jobs API at {address} (the head's dashboard, "
                                 f"default port 8265): {err}") from None
    except RuntimeError as err:   # the Jobs API answered with an error (e.g. its agent is not up yet)
        raise ClusterAccessError(f"the Ray Jobs API at {address} refused the job: {err}") from None
    except ValueError as err:   # a credential and no token to seal it with
        raise ClusterAccessError(str(err)) from None


def _submit_job_to(address: str, dag: Any, catalog_url: str, runs_root: Path | None,
                   version: int | None) -> dict[str, Any]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address, headers=_ray_auth_headers())
    k = 1
    while True:   # phaselab-<grid hash>-v<k>: attach to a live or finished job, else the next k
        job_id = f"phaselab-{dag.grid_hash[:16]}-v{k}"
        try:
            status = str(client.get_job_status(job_id))
        except RuntimeError:   # no job with this id yet
            break
        if status.rsplit(".", 1)[-1] not in ("FAILED", "STOPPED"):
            return {"id": job_id, "status": status, "attached": True}
        k += 1
    req = job_request(address, dag.spec.grid, catalog_url, runs_root, version)
    client.submit_job(entrypoint=req["entrypoint"], submission_id=job_id, runtime_env=req["runtime_env"])
    return {"id": job_id, "status": "SUBMITTED", "attached": False, "entrypoint": req["entrypoint"]}
