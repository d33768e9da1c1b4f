"""Placement without a cluster: what a stage of a real grid asks of one node against nodes'
resources as ``ray.nodes()`` reports them, the resource-wait setting, and the cluster-address
checks that need no Ray (where the token comes from, an address nobody answers, a server that is
not a Ray GCS)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from phaselab.orchestrator.engine.ray_local import ClusterAccessError, check_cluster, find_token, is_loopback
from phaselab.orchestrator.plan.dag import build_dag, load_grid
from phaselab.orchestrator.plan.placement import demands, resource_wait, unschedulable

GRID = """\
grid: place
seeds: [0]
axes:
  product:
    pe: [rope]
defaults:
  model: {preset: tiny, block_size: 32, pe: {kind: "${pe}"}}
  data: {kind: text, block_size: 32}
  train: {steps: 2, batch_size: 2, eval_every: 0, device: cpu}
stages:
  # resources and launcher are not part of a stage's key: other step counts keep three stages
  plain: {kind: pretrain, launcher: ray_task, resources: {cpus: 2, memory_gb: 1}}
  accel: {kind: pretrain, launcher: ray_task, train: {steps: 3}, resources: {cpus: 1, memory_gb: 1, accelerator: simgpu}}
  train:
    kind: pretrain
    launcher: ray_train
    train: {steps: 4}
    resources: {cpus: 1, gpus: 1, num_workers: 2, accelerator: H200}
"""
GB = 2**30
HEAD = {"CPU": 1.0, "memory": 8.0 * GB, "node:__internal_head__": 1.0}
WORKER = {"CPU": 1.0, "memory": 8.0 * GB, "accelerator_type:simgpu": 1.0}
GPU_NODE = {"CPU": 8.0, "GPU": 8.0, "memory": 64.0 * GB, "accelerator_type:H200": 8.0}


@pytest.fixture(scope="module")
def nodes_by_name(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("place") / "grid.yaml"
    path.write_text(GRID)
    spec, marks, text, resolved = load_grid(path)
    return {n.name: n for n in build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved).nodes.values()}


def _total(*nodes: dict) -> dict:
    out: dict = {}
    for n in nodes:
        for k, v in n.items():
            out[k] = out.get(k, 0.0) + v
    return out


def test_a_task_must_fit_one_node_not_the_cluster_sum(nodes_by_name) -> None:
    plain = nodes_by_name["plain"]
    assert demands(plain) == [{"CPU": 2.0, "GPU": 0.0, "memory": 1.0 * GB}]
    why = unschedulable(plain, _total(HEAD, WORKER), [HEAD, WORKER])   # 2 CPUs in all, 1 per node
    assert why == "asks for CPU 2, memory 1.0 GB on one node; no node of the cluster (2 live) has that much"
    assert unschedulable(plain, _total(HEAD, GPU_NODE), [HEAD, GPU_NODE]) is None


def test_the_accelerator_is_a_node_resource(nodes_by_name) -> None:
    accel = nodes_by_name["accel"]
    assert demands(accel)[0]["accelerator_type:simgpu"] == 0.001
    assert unschedulable(accel, _total(HEAD, WORKER), [HEAD, WORKER]) is None
    why = unschedulable(accel, _total(HEAD, GPU_NODE), [HEAD, GPU_NODE])
    assert why == ("asks for accelerator 'simgpu', which no node of the cluster has (accelerators: H200; "
                   "a node offers it as the resource accelerator_type:simgpu)")


def test_ray_train_workers_are_placed_too(nodes_by_name) -> None:
    train = nodes_by_name["train"]
    task, worker = demands(train)
    assert task == {"CPU": 0.0, "GPU": 0.0, "memory": 0.0}            # the driver holds nothing
    assert worker == {"CPU": 1.0, "GPU": 1.0, "accelerator_type:H200": 0.001}
    assert unschedulable(train, _total(HEAD, GPU_NODE), [HEAD, GPU_NODE]) is None
    assert "asks for 2 CPUs / 2 GPUs; the cluster has 2 / 0" in unschedulable(train, _total(HEAD, WORKER),
                                                                              [HEAD, WORKER])


def test_the_resource_wait_setting(monkeypatch) -> None:
    monkeypatch.delenv("PHASELAB_RESOURCE_WAIT_S", raising=False)
    assert resource_wait() == 600.0 and resource_wait(0) == 0.0
    monkeypatch.setenv("PHASELAB_RESOURCE_WAIT_S", "12.5")
    assert resource_wait() == 12.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("PHASELAB_RESOURCE_WAIT_S", bad)
        with pytest.raises(ValueError, match=f"PHASELAB_RESOURCE_WAIT_S .* got '{bad}'"):
            resource_wait()


def test_the_token_is_found_where_ray_looks(monkeypatch, tmp_path: Path) -> None:
    home, path = tmp_path / "home", tmp_path / "token"
    (home / ".ray").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    assert find_token() == (None, f"RAY_AUTH_TOKEN and {home / '.ray' / 'auth_token'}")
    (home / ".ray" / "auth_token").write_text("from-home\n")
    assert find_token() == ("from-home", str(home / ".ray" / "auth_token"))
    path.write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert find_token() == ("from-path", f"RAY_AUTH_TOKEN_PATH={path}")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert find_token() == ("from-env", "RAY_AUTH_TOKEN")


def test_addresses_nobody_or_no_gcs_answers_are_named() -> None:
    assert is_loopback("127.0.0.1:6380") and is_loopback("localhost:1") and not is_loopback("10.0.0.5:6380")
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(ClusterAccessError, match=rf"no Ray cluster answers at 127.0.0.1:{closed} .*--port={closed}"):
        check_cluster(f"127.0.0.1:{closed}", timeout_s=2)
    server = socket.create_server(("127.0.0.1", 0))   # answers like Redis does, not like gRPC
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            conn.sendall(b"-ERR unknown command 'PRI'\r\n")
    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    with pytest.raises(ClusterAccessError, match=f"the server at 127.0.0.1:{port} is not a Ray cluster's GCS"):
        check_cluster(f"127.0.0.1:{port}", timeout_s=2)
    thread.join(timeout=5)
    server.close()


def test_plan_names_the_stages_a_cluster_cannot_run_grouped_by_reason(nodes_by_name) -> None:
    from phaselab.orchestrator.plan.placement import plan_warnings

    nodes = list(nodes_by_name.values())
    two_cpus = [{"CPU": 2.0, "memory": 8.0 * GB}]
    lines = plan_warnings(nodes, two_cpus, "the local cluster (2 CPUs)", can_grow=False)
    assert len(lines) == 2, lines   # 'train' wants GPUs, 'accel' an accelerator; 'plain' fits
    assert any(ln.startswith("1 stage(s), e.g. train[pe=rope,seed=0]: asks for 2 CPUs / 2 GPUs")
               and ln.endswith("on the local cluster (2 CPUs); `phaselab run` would fail them") for ln in lines), lines
    assert any("accel[pe=rope,seed=0]: asks for accelerator 'simgpu'" in ln for ln in lines), lines
    grows = plan_warnings(nodes, two_cpus, "the cluster at HEAD", can_grow=True)
    assert all("would wait PHASELAB_RESOURCE_WAIT_S=" in ln for ln in grows)
    assert plan_warnings(nodes, [HEAD, WORKER, {"CPU": 4.0, "GPU": 2.0, "memory": 8.0 * GB, "accelerator_type:H200": 1.0}],
                         "x", can_grow=False) == []


def test_the_local_cluster_is_read_without_starting_it(monkeypatch, tmp_path: Path) -> None:
    """CPUs from the argument, GPUs and their accelerator type from nvidia-smi (Ray's name rule)."""
    from phaselab.orchestrator.plan.placement import local_node

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\necho 'NVIDIA H200'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    node = local_node(3)
    assert (node["CPU"], node["GPU"], node["accelerator_type:H200"]) == (3.0, 2.0, 1.0) and node["memory"] > 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert local_node(3)["GPU"] == 1.0
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert "GPU" not in local_node(3)


def test_plan_warns_before_anything_runs_when_the_local_cluster_has_no_gpu(monkeypatch, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    monkeypatch.setenv("PATH", str(tmp_path))        # no nvidia-smi: a machine without GPUs
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["plan", "pope_jsb", "--json"])
    assert res.exit_code == 0, res.output
    # pope_jsb leaves gpus to the packing rule (resources.gpus: auto): without a GPU it says so
    lines = json.loads(res.output)["warnings"]
    assert any(line.startswith("12 stage(s), e.g. train[pe=rope,seed=0]: resources.gpus auto and no GPU where "
                               "it runs, so they run on the CPU") for line in lines), lines
    res = CliRunner().invoke(app, ["plan", "pope_jsb", "resources.gpus=1", "--json"])
    (line,) = json.loads(res.output)["warnings"]
    assert line.startswith("12 stage(s), e.g. train[pe=rope,seed=0]: asks for 4 CPUs / 1 GPUs; the cluster has ")
    assert "0 GPUs" in line and line.endswith("`phaselab run` would fail them")
    res = CliRunner().invoke(app, ["plan", "quickstart", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["warnings"] == []
