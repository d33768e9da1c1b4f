"""Every deployment manifest parsed and checked without a network: the image pins equal the lock
(constraints.txt), the images run as a non-root user from pinned bases, the compose services are
bound to 127.0.0.1 (and `docker compose config` accepts the file where Docker Compose exists), the
KubeRay RayCluster / RayJob use only fields of the KubeRay v1 CRDs and have the required ones
(CPU head that never trains, H200 workers with autoscaling bounds, token auth, dashboard not
public, the catalog URL from a Secret, a deterministic job id, backoff limit, deadline), the
`ray up` file has the same split, and the Ray version is the lock's everywhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = {"cuda": DEPLOY / "docker" / "Dockerfile", "cpu": DEPLOY / "docker" / "Dockerfile.cpu"}
IMAGE_PINS = {"TORCH_VERSION": "torch", "TRITON_VERSION": "triton", "RAY_VERSION": "ray",
              "DEEPSPEED_VERSION": "deepspeed"}
# Fields of the KubeRay ray.io/v1 CRDs (KubeRay v1.6 API reference) that these manifests may use:
# a misspelt field is silently dropped by the API server, so unknown keys fail here.
RAYCLUSTER_SPEC = {"rayVersion", "authOptions", "enableInTreeAutoscaling", "autoscalerOptions", "headGroupSpec",
                   "workerGroupSpecs", "headServiceAnnotations", "suspend", "managedBy", "gcsFaultToleranceOptions"}
HEAD_GROUP = {"serviceType", "headService", "enableIngress", "rayStartParams", "template"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template",
                "numOfHosts", "idleTimeoutSeconds", "scaleStrategy", "suspend"}
RAYJOB_SPEC = {"entrypoint", "jobId", "clusterSelector", "rayClusterSpec", "submissionMode", "backoffLimit",
               "activeDeadlineSeconds", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "runtimeEnvYAML",
               "entrypointNumCpus", "entrypointNumGpus", "entrypointResources", "metadata", "suspend",
               "submitterPodTemplate", "submitterConfig", "deletionStrategy"}


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-\[\],]+)==([^\s;#]+)", line)
        if m:
            pins[m.group(1).split("[")[0].lower()] = m.group(2)
    return pins


def docker_args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)", path.read_text(), flags=re.MULTILINE))


def manifests() -> dict[str, list[dict]]:
    out = {}
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        out[str(path.relative_to(ROOT))] = docs
    return out


def kind(k: str) -> dict:
    found = [d for docs in manifests().values() for d in docs if isinstance(d, dict) and d.get("kind") == k]
    assert len(found) == 1, f"expected one {k} manifest, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_image_pins_equal_the_lock_and_run_as_a_non_root_user(variant: str) -> None:
    path, pins = DOCKERFILES[variant], lock()
    args = docker_args(path)
    assert {a: args.get(a) for a in IMAGE_PINS} == {a: pins[p] for a, p in IMAGE_PINS.items()}
    text = path.read_text()
    (base,) = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    name, _, tag = base.partition(":")
    assert tag and tag != "latest" and re.search(r"\d", tag), f"{path.name}: base {base!r} is not pinned"
    assert tag.endswith("24.04"), f"{path.name}: both images must be Ubuntu 24.04 (one Python for every node)"
    if variant == "cuda":
        assert name == "nvidia/cuda" and "cudnn" in tag and "/whl/cu" in args["TORCH_INDEX"]
    else:
        assert name == "ubuntu" and args["TORCH_INDEX"].endswith("/whl/cpu")
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), f"{path.name} runs as root"
    assert "useradd --create-home --uid 1000" in text
    # the package is installed under the full lock, so every other pin is the lock's too
    assert re.search(r'pip install --no-cache-dir -c constraints.txt "\.\[eval,postgres\]"', text)
    for copied in re.findall(r"^COPY --chown=\S+ (\S+) ", text, flags=re.MULTILINE):
        assert (ROOT / copied).exists(), f"{path.name} copies {copied}, which the repository lacks"


def test_compose_services_are_bound_to_localhost_and_use_the_lock() -> None:
    path = DEPLOY / "services" / "compose.yaml"
    doc = yaml.safe_load(path.read_text())
    services = doc["services"]
    assert set(services) == {"postgres", "mlflow", "ray-head"}
    ports = [p for s in services.values() for p in s.get("ports", [])]
    assert ports and all(str(p).startswith("127.0.0.1:") for p in ports), ports
    for name in ("mlflow", "ray-head"):   # one network namespace: the same 127.0.0.1 URLs everywhere
        assert services[name]["network_mode"] == "service:postgres"
        assert services[name]["build"]["dockerfile"] == "deploy/docker/Dockerfile.cpu"
        assert services[name]["build"]["args"]["RAY_VERSION"] == lock()["ray"]
    mlflow = " ".join(services["mlflow"]["command"])
    assert "--backend-store-uri postgresql+psycopg://phaselab@127.0.0.1:5432/mlflow" in mlflow
    assert services["mlflow"]["image"].split(":")[-1] == services["ray-head"]["image"].split(":")[-1]
    head = " ".join(services["ray-head"]["command"])
    assert "--port=6380" in head and services["ray-head"]["environment"]["RAY_AUTH_MODE"] == "token"
    secrets = {k: v["file"] for k, v in doc["secrets"].items()}
    assert secrets == {"pg_password": "./pg_password.txt", "ray_token": "./ray_token.txt"}
    ignored = (DEPLOY / "services" / ".gitignore").read_text().split()
    assert all(f.lstrip("./") in ignored for f in secrets.values())
    assert not re.search(r"postgres(ql)?(\+\w+)?://[^@\s]*:[^@\s]*@", path.read_text()), "a password in a URL"


def _docker_compose() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run([*cmd, "version"], capture_output=True, check=False).returncode == 0:
            return cmd
    return None


def test_docker_compose_accepts_the_services_file(tmp_path: Path) -> None:
    cmd = _docker_compose()
    if cmd is None:
        pytest.skip("Docker Compose is not installed here (the file is still parsed by the test above)")
    work = tmp_path / "services"
    shutil.copytree(DEPLOY / "services", work)
    for secret in ("pg_password.txt", "ray_token.txt"):
        (work / secret).write_text("x")
    out = subprocess.run([*cmd, "-f", str(work / "compose.yaml"), "config", "--format", "json"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)["services"]
    published = [p.get("host_ip") for s in resolved.values() for p in s.get("ports", [])]
    assert published and set(published) == {"127.0.0.1"}


def test_raycluster_has_a_cpu_head_that_never_trains_and_autoscaled_h200_workers() -> None:
    rc = kind("RayCluster")
    assert rc["apiVersion"] == "ray.io/v1" and rc["metadata"]["name"] == "phaselab"
    spec = rc["spec"]
    assert set(spec) <= RAYCLUSTER_SPEC, set(spec) - RAYCLUSTER_SPEC
    assert spec["rayVersion"] == lock()["ray"]
    assert spec["authOptions"] == {"mode": "token"} and spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_GROUP and head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert not head.get("enableIngress", False)                       # the dashboard is not public
    params = head["rayStartParams"]
    assert (params["num-cpus"], params["num-gpus"]) == ("0", "0")     # no task ever runs on the head
    assert json.loads(json.loads(params["resources"])) == {"phaselab_safe": 1}
    (hc,) = head["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in hc["resources"]["limits"] and hc["image"].endswith("-cpu")
    (group,) = spec["workerGroupSpecs"]
    assert set(group) <= WORKER_GROUP
    assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"] and group["maxReplicas"] >= 1
    (wc,) = group["template"]["spec"]["containers"]
    assert wc["resources"]["limits"]["nvidia.com/gpu"] == group["rayStartParams"]["num-gpus"] == "8"
    assert group["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert wc["image"].endswith("-cuda")
    for pod in (head["template"]["spec"], group["template"]["spec"]):
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["terminationGracePeriodSeconds"] > 30                # beyond Ray's drain timeout
        (c,) = pod["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert env["PHASELAB_CATALOG_URL"]["valueFrom"]["secretKeyRef"] == {"name": "phaselab-db", "key": "url"}
        assert all("value" not in e or "://" not in e["value"] or "@" not in e["value"] for e in c["env"])
        assert env["PHASELAB_RUNS_ROOT"]["value"] == "/data/runs"
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
        assert claims["runs"] == "phaselab-runs"                          # one folder every node sees
    policy = kind("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": "phaselab", "ray.io/node-type": "head"}
    assert not [d for docs in manifests().values() for d in docs if d.get("kind") in ("Ingress", "Service")]


def test_rayjob_runs_a_shipped_grid_on_the_head_with_a_deterministic_id() -> None:
    from phaselab.orchestrator.language.library import resolve_grid_path

    job = kind("RayJob")
    spec = job["spec"]
    assert job["apiVersion"] == "ray.io/v1" and set(spec) <= RAYJOB_SPEC, set(spec) - RAYJOB_SPEC
    assert spec["clusterSelector"] == {"ray.io/cluster": kind("RayCluster")["metadata"]["name"]}
    assert re.fullmatch(r"phaselab-[a-z0-9-]+-v\d+", spec["jobId"])
    assert spec["backoffLimit"] >= 1 and spec["activeDeadlineSeconds"] > 0
    assert spec["submissionMode"] in ("K8sJobMode", "HTTPMode", "SidecarMode")
    words = spec["entrypoint"].split()
    assert words[:2] == ["phaselab", "run"] and resolve_grid_path(words[2]).is_file()
    assert json.loads(spec["entrypointResources"]) == {"phaselab_safe": 1} and spec["entrypointNumCpus"] == 0


def test_ray_up_has_the_same_split_and_token_auth_on_every_node() -> None:
    doc = yaml.safe_load((DEPLOY / "ray-up" / "cluster.yaml").read_text())
    types = doc["available_node_types"]
    head, workers = types[doc["head_node_type"]], [t for n, t in types.items() if n != doc["head_node_type"]]
    assert head["resources"] == {"CPU": 0, "GPU": 0, "phaselab_safe": 1}
    (h200,) = workers
    assert h200["resources"]["GPU"] == 8 and "accelerator_type:H200" in h200["resources"]
    assert 0 <= h200["min_workers"] <= h200["max_workers"] <= doc["max_workers"]
    starts = [c for c in doc["head_start_ray_commands"] + doc["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=token ray start") for c in starts)
    head_start = next(c for c in starts if "--head" in c)
    assert "--port=6380" in head_start and "--dashboard-host=127.0.0.1" in head_start
    assert "--num-cpus=0" in head_start and "--num-gpus=0" in head_start
    assert doc["docker"]["head_image"].endswith("-cpu") and doc["docker"]["worker_image"].endswith("-cuda")
    assert f"ray.__version__ == '{lock()['ray']}'" in doc["setup_commands"][0]
    assert set(doc["file_mounts"].values()) == {"~/.ray/auth_token", "~/.phaselab/catalog_url"}


def test_the_ray_version_is_the_locks_everywhere() -> None:
    want = lock()["ray"]
    found = []
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix not in (".pyc",)):
        text = path.read_text(errors="replace")
        for pattern in (r"rayVersion:\s*\"?([\d.]+)", r"RAY_VERSION[=:]\s*\"?([\d.]+)", r"\bray(?:\[[^\]]*\])?==([\d.]+)",
                        r"ray\.__version__ == '([\d.]+)'", r"rayproject/ray:([\d.]+)"):
            found += [(str(path.relative_to(ROOT)), v) for v in re.findall(pattern, text)]
    files = {f for f, _ in found}
    assert {"deploy/docker/Dockerfile", "deploy/docker/Dockerfile.cpu", "deploy/services/compose.yaml",
            "deploy/kuberay/ray-cluster.h200x8.yaml", "deploy/ray-up/cluster.yaml"} <= files
    assert [(f, v) for f, v in found if v != want] == []
