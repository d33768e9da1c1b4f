"""Connecting to Ray: a local cluster started by the controller (every component on 127.0.0.1,
Ray's token file readable by its owner only, a reaper that takes the cluster's helper processes
down with the controller, :mod:`phaselab.orchestrator.engine.reaper`), or an existing cluster by
address, with its authentication token found the way Ray documents it and a clear error when the
cluster cannot be reached or refuses the token.

Ray 2.60 turns token authentication on for a new cluster whenever a token exists, but a process
that joins an existing one (``ray.init(address=...)``, ``ray start --address``) sends the token
only when ``RAY_AUTH_MODE=token`` is set; without it the join fails after ~20 s with a bare
``ConnectionError``. :func:`enable_token_auth` sets the mode whenever a token is found, and
``python -m phaselab.orchestrator.engine.ray_local start ...`` is ``ray start ...`` with the same rule
(and, for ``--node-ip-address=127.0.0.1``, every component of the node on loopback).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from phaselab.orchestrator.engine.reaper import start_reaper

__all__ = ["ClusterAccessError", "DashboardUnavailable", "check_cluster", "dashboard_banner", "dashboard_sign_in", "enable_token_auth",
           "find_token", "init_ray", "loopback_only", "metrics_endpoints", "private_token", "ray_token_path",
           "require_dashboard",
           "start_reaper"]

AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_HELP = ("put the cluster's token (the head's ~/.ray/auth_token) in RAY_AUTH_TOKEN, in a file named by "
              "RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token")


class ClusterAccessError(ConnectionError):
    """The Ray cluster at an address cannot be reached, or it refused our token (the message
    says which, and what to do)."""


class DashboardUnavailable(RuntimeError):
    """The Ray dashboard cannot start here: a package of ``ray[default]`` does not import."""


def require_dashboard() -> None:
    """Raise :class:`DashboardUnavailable` naming the package that fails to import when the
    dashboard's dependencies (``ray[default]``: aiohttp, aiohttp_cors, prometheus_client,
    opencensus, ...) are incomplete. Ray itself would log the import error and raise a bare
    "Cannot include dashboard with missing packages" only after starting the cluster's GCS."""
    from ray._private.utils import get_dashboard_dependency_error

    err = get_dashboard_dependency_error()
    if err is not None:
        raise DashboardUnavailable(
            f"--dashboard needs the Ray dashboard's packages (ray[default]), and one is missing ({err}): "
            f"`pip install -c constraints.txt 'ray[default]'` installs the pinned set (`make install` does too), "
            f"or run without --dashboard")


def dashboard_sign_in() -> str:
    """How a browser gets past the dashboard's token check, without the token itself (the line
    lands in terminals and CI logs). Ray 2.60's dashboard answers 401 to every API call without
    a token: its page asks for one once, POSTs it to ``/api/authenticate`` as
    ``Authorization: Bearer``, and gets it back as an HttpOnly cookie
    (``ray-authentication-token``, 30 days); there is no token query parameter."""
    if os.environ.get(AUTH_MODE_ENV, "").lower() == "disabled":
        return "no sign-in: token authentication is off (RAY_AUTH_MODE=disabled)"
    token, where = find_token()
    if token is None:
        return f"the dashboard asks for the cluster's token; none was found in {where}: {TOKEN_HELP}"
    source = "the value of RAY_AUTH_TOKEN" if where == "RAY_AUTH_TOKEN" else f"the contents of {where}"
    return (f"sign in: paste {source} into the page's token prompt once (the browser keeps it "
            f"as a cookie); scripts send it as 'Authorization: Bearer <token>'")


def loopback_only() -> None:
    """Make Ray use 127.0.0.1 as this node's address: on Linux it otherwise resolves even an
    explicit 127.0.0.1 to the host's routable IP and binds GCS, raylet, workers and the agents'
    metrics endpoints there or on all interfaces. The environment reaches every process the
    local cluster starts; the constant covers a ``ray`` imported before this call."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def ray_token_path() -> Path:
    """Where Ray reads its authentication token (RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def find_token() -> tuple[str | None, str]:
    """(token, where it came from) in Ray's order: RAY_AUTH_TOKEN, then the file
    RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; (None, the places looked at) when there is none."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    path = ray_token_path()
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    where = f"RAY_AUTH_TOKEN_PATH={path}" if os.environ.get("RAY_AUTH_TOKEN_PATH") else str(path)
    return (token, where) if token else (None, f"RAY_AUTH_TOKEN and {where}")


def enable_token_auth() -> bool:
    """Set RAY_AUTH_MODE=token when it is unset and a token exists (what Ray itself does for a
    new cluster, but not for a process joining one); returns whether token mode is on."""
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is None and find_token()[0] is not None:
        os.environ[AUTH_MODE_ENV] = mode = "token"
        if "ray" in sys.modules:   # Ray caches its config at import: reload it, as Ray does
            from ray._raylet import Config

            Config.initialize("")
    return (mode or "").lower() == "token"


def private_token() -> None:
    """Ray writes a new token with the umask's mode (world-readable under 022). Create it 0600
    ourselves when token auth is on and there is none yet, and narrow an existing one."""
    import secrets

    path = ray_token_path()
    if not path.exists() and not os.environ.get("RAY_AUTH_TOKEN") and \
            os.environ.get(AUTH_MODE_ENV, "token").lower() == "token":
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:   # another process created it first
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))   # Ray's own format: 256 bits as hex
    try:
        if path.is_file() and path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
            path.chmod(0o600)
    except OSError:
        pass


def dashboard_banner(url: str, *, local: bool) -> list[str]:
    """What ``phaselab run`` prints for a running dashboard at ``url`` (``host:port``): its URL
    and how a browser signs in. A remote cluster's URL is the head's address as the head sees it
    (127.0.0.1 when bound to loopback), which another machine reaches through a tunnel."""
    where = "" if local else " (the head's address: from another machine, open it through a tunnel)"
    return [f"Ray dashboard: http://{url}{where}", f"  {dashboard_sign_in()}"]


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a GCS address ``host:port``; None for ``auto``, ``ray://`` (Ray Client)
    and anything else that is not one."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def is_loopback(address: str) -> bool:
    """Whether a GCS address names this machine's loopback interface."""
    hp = _host_port(address)
    return hp is not None and (hp[0] == "localhost" or hp[0].startswith("127.") or hp[0] == "::1")


def _speaks_http2(host_port: tuple[str, int], timeout_s: float) -> bool:
    """Whether the server at ``host_port`` answers the HTTP/2 client preface with a SETTINGS
    frame, as every gRPC server (Ray's GCS) does; OSError when nothing accepts the connection."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])   # + empty SETTINGS
    with socket.create_connection(host_port, timeout=timeout_s) as conn:
        conn.sendall(preface)
        head = b""
        try:
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except TimeoutError:
            pass
    return len(head) == 9 and head[3] == 4   # frame type 0x4: SETTINGS


def check_cluster(address: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`ClusterAccessError` when nothing listens at the GCS ``address`` or the
    cluster refuses this process's token (missing or wrong); return when it answers. Takes about
    a second, where ``ray.init`` would retry for ~20 s and end in a bare ConnectionError."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        speaks_grpc = _speaks_http2(hp, timeout_s)
    except OSError as err:
        raise ClusterAccessError(
            f"no Ray cluster answers at {address} ({err.strerror or err}): start its head with "
            f"`ray start --head --port={hp[1]}` or pass the GCS address `ray start --head` printed") from None
    if not speaks_grpc:   # e.g. Redis, which often holds Ray's default port 6379
        raise ClusterAccessError(f"the server at {address} is not a Ray cluster's GCS (it does not speak gRPC): "
                                 f"pass the --port of `ray start --head`")
    from ray.exceptions import AuthenticationError

    token_on = enable_token_auth()
    token, where = find_token()
    try:
        from ray._raylet import GcsClient

        GcsClient(address=address).internal_kv_get(b"phaselab-probe", None, timeout=timeout_s)
    except AuthenticationError:
        if token is None or not token_on:
            raise ClusterAccessError(f"the Ray cluster at {address} requires token authentication and no "
                                     f"token was found in {where}: {TOKEN_HELP}") from None
        raise ClusterAccessError(f"the Ray cluster at {address} rejected the token from {where}: it is not "
                                 f"the cluster's; {TOKEN_HELP}") from None
    except Exception:  # noqa: BLE001 - the probe is advisory: ray.init reports anything else
        return


def init_ray(*, address: str | None = None, num_cpus: int | None = None, dashboard: bool = False,
             env_vars: Mapping[str, str] | None = None, log_to_driver: bool = True,
             metrics: bool = False) -> str | None:
    """Connect to ``address`` / RAY_ADDRESS (token found as :func:`find_token` says; a loopback
    address on loopback, :func:`loopback_only`), or start a local cluster with every component
    listening on 127.0.0.1 only and Ray's token file readable by its owner only. Returns the
    dashboard URL when one runs. Reuses an initialised Ray (tests, notebooks). Raises
    :class:`ClusterAccessError` for an unreachable cluster or a missing or wrong token, and
    :class:`DashboardUnavailable` for ``dashboard`` without the dashboard's packages.
    ``log_to_driver=False`` keeps worker output off stdout (``--json``). Of ``env_vars`` only
    the variables without a credential reach the job's runtime_env (Ray logs it and serves it
    in its Jobs and State APIs); stage tasks get the others in their arguments. A local
    cluster's metrics endpoints stay off unless ``metrics`` (:func:`metrics_endpoints`)."""
    import ray

    if ray.is_initialized():
        if address:   # an explicit cluster nobody answers at is refused here too, not replaced
            check_cluster(address)
        return None
    if dashboard and not (address or os.environ.get("RAY_ADDRESS")):
        require_dashboard()
        # Ray Train reports runs to the dashboard's Train view only with state tracking on (off
        # by default in 2.60); the cluster's processes inherit this environment.
        os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    address = address or os.environ.get("RAY_ADDRESS") or None
    from phaselab.catalog.tracking.mlflow_common import split_secrets

    public = split_secrets(env_vars or {})[0]
    runtime_env = {"env_vars": public} if public else None
    if not log_to_driver:
        _cluster_errors_to_stderr()
    if address:
        if is_loopback(address):
            loopback_only()
        check_cluster(address)
        if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ:
            # A submitted job's driver (`phaselab submit --address`): runtime_env repeats the
            # job's own variables (the catalog URL), which Ray refuses as a conflict unless told
            # that the driver's settings, a superset with the same values, may win.
            os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        try:
            ctx = ray.init(address=address, runtime_env=runtime_env, log_to_driver=log_to_driver)
        except (ConnectionError, ray.exceptions.AuthenticationError) as err:
            raise ClusterAccessError(f"cannot connect to the Ray cluster at {address}: {err}") from None
    else:
        loopback_only()
        metrics_endpoints(metrics)
        private_token()
        start_reaper()   # the cluster's helpers go when this process goes, however it ends
        ctx = ray.init(num_cpus=num_cpus, include_dashboard=dashboard, dashboard_host="127.0.0.1",
                       _node_ip_address="127.0.0.1", runtime_env=runtime_env, log_to_driver=log_to_driver)
        private_token()
    return getattr(ctx, "dashboard_url", None) or None


# Ray 2.60 serves Prometheus metrics without authentication on three ports: the dashboard
# agent's exporter (its labels name grid, stage, cell and stage hash: our task names), the
# dashboard head's (44227) and the autoscaler monitor's (44217). RayConfig's
# enable_metrics_collection=0 makes the raylet start the agent with --disable-metrics-collection;
# the other two read their port from these variables and, given one no socket accepts, log the
# failed bind and run on without the endpoint (ray/dashboard/head.py, autoscaler/_private/monitor.py).
METRICS_OFF_ENV = {"RAY_enable_metrics_collection": "0", "DASHBOARD_METRIC_PORT": "-1",
                   "AUTOSCALER_METRIC_PORT": "-1"}


def metrics_endpoints(on: bool) -> None:
    """Turn the metrics endpoints of a cluster started from this process off (the default) or
    leave them on (``--metrics``: still bound to 127.0.0.1, without authentication). The
    environment reaches the raylet, the agents, the dashboard and the autoscaler monitor."""
    for name, value in METRICS_OFF_ENV.items():
        if on:
            if os.environ.get(name) == value:
                del os.environ[name]
        else:
            os.environ[name] = value
    if "ray" in sys.modules:   # Ray caches its config at import: reload it, as Ray does
        from ray._raylet import Config

        Config.initialize("")


def _cluster_errors_to_stderr() -> None:
    """Ray's driver prints the cluster's error messages (a node that died, ...) to stdout even
    with ``log_to_driver=False``; a caller that wants worker output off stdout (``--json``: one
    JSON document there) gets them on stderr."""
    from ray._private import worker

    if getattr(worker.print_to_stdstream, "phaselab_stderr", False):
        return
    plain = worker.print_to_stdstream

    def to_stderr(data: dict, ignore_prefix: bool) -> None:
        plain({**data, "is_err": True}, ignore_prefix)

    to_stderr.phaselab_stderr = True   # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


def ray_start(argv: list[str]) -> None:
    """``ray start ARGV`` with token auth on whenever a token exists (a new head without one
    gets a private one) and, for ``--node-ip-address=127.0.0.1``, the whole node on loopback.
    Ray refuses to add a node to a cluster whose nodes use loopback addresses (its switch for
    that is meant for Windows and macOS); every node on loopback is on this machine, so the
    refusal is lifted for such a node only, while its address stays 127.0.0.1."""
    head = "--head" in argv
    metrics_endpoints("--metrics" in argv)
    argv = [a for a in argv if a != "--metrics"]
    if head and os.environ.get(AUTH_MODE_ENV) is None:
        os.environ[AUTH_MODE_ENV] = "token"
        private_token()
    enable_token_auth()
    if "--node-ip-address=127.0.0.1" in argv or "--node-ip-address 127.0.0.1" in " ".join(argv):
        loopback_only()   # children (raylet, agents, workers) resolve 127.0.0.1 as themselves
        from ray._private import ray_constants, services

        ray_constants.ENABLE_RAY_CLUSTER = True   # `ray start --address` checks it
        resolve = services.resolve_ip_for_localhost
        services.resolve_ip_for_localhost = lambda host: host if host == "127.0.0.1" else resolve(host)
    from ray.scripts.scripts import main

    sys.argv = ["ray", "start", *argv]
    main()


if __name__ == "__main__":   # python -m phaselab.orchestrator.engine.ray_local start [ray start options]
    if sys.argv[1:2] != ["start"]:
        sys.exit("usage: python -m phaselab.orchestrator.engine.ray_local start [ray start options]")
    ray_start(sys.argv[2:])
