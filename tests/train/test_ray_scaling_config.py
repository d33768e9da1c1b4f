"""``fit``'s Ray Train ScalingConfig honours ``resources_per_worker``.

The config is built by ``ray_entry.scaling_config``, the function ``fit`` calls, and checked as
Ray itself reads it (per-worker CPU/GPU and the cluster total it will reserve); no Ray cluster is
started. Bad values are ValueErrors naming the key, raised by ``fit`` before Ray starts.
"""

from __future__ import annotations

import pytest

from phaselab.workloads.config import to_dict
from phaselab.workloads.models.presets import preset

ray = pytest.importorskip("ray")
from phaselab.workloads.train.ray_entry import fit, scaling_config


def test_resources_per_worker_reach_the_scaling_config():
    sc = scaling_config(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 2, "GPU": 1})
    assert isinstance(sc, ray.train.ScalingConfig)
    assert sc.num_workers == 2 and sc.use_gpu
    assert sc.resources_per_worker == {"CPU": 2, "GPU": 1}
    assert (sc.num_cpus_per_worker, sc.num_gpus_per_worker) == (2, 1)
    assert sc.total_resources == {"CPU": 4, "GPU": 2}  # what Ray reserves for the 2 workers


def test_cpu_only_and_custom_resources():
    sc = scaling_config(num_workers=3, use_gpu=False, resources_per_worker={"CPU": 0.5, "memory": 2e9})
    assert (sc.num_cpus_per_worker, sc.num_gpus_per_worker) == (0.5, 0)
    assert sc.total_resources == {"CPU": 1.5, "memory": 6e9}


def test_default_is_rays_and_cpu_key_alone_keeps_one_gpu_per_worker():
    assert scaling_config(num_workers=2, use_gpu=False).total_resources == {"CPU": 2}
    assert scaling_config(num_workers=2, use_gpu=False, resources_per_worker={}).total_resources == {"CPU": 2}
    sc = scaling_config(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 4})
    assert (sc.num_cpus_per_worker, sc.num_gpus_per_worker) == (4, 1)


@pytest.mark.parametrize(("resources", "use_gpu", "match"), [
    ({"CPU": -1}, False, r"resources_per_worker\['CPU'\] must be a finite number >= 0, got -1"),
    ({"CPU": float("nan")}, False, r"resources_per_worker\['CPU'\] .* got nan"),
    ({"CPU": "2"}, False, r"resources_per_worker\['CPU'\] .* got '2'"),
    ({"GPU": True}, True, r"resources_per_worker\['GPU'\] .* got True"),
    ({"gpu": 1}, True, r"resources_per_worker\['gpu'\]: .*case-sensitive; did you mean 'GPU'"),
    ({"Memory": 1e9}, False, r"resources_per_worker\['Memory'\]: .*did you mean 'memory'"),
    ({"GPU": 1}, False, r"resources_per_worker\['GPU'\]=1 needs use_gpu=True"),
    ({"GPU": 0}, True, r"resources_per_worker\['GPU'\]=0 contradicts use_gpu=True"),
])
def test_bad_resources_raise_naming_the_key(resources, use_gpu, match):
    with pytest.raises(ValueError, match=match):
        scaling_config(num_workers=1, use_gpu=use_gpu, resources_per_worker=resources)


def test_bad_num_workers_and_non_mapping():
    with pytest.raises(ValueError, match="num_workers must be an int >= 1, got 0"):
        scaling_config(num_workers=0, use_gpu=False)
    with pytest.raises(TypeError, match="must be a mapping"):
        scaling_config(num_workers=1, use_gpu=False, resources_per_worker=[("CPU", 2)])


def test_fit_rejects_bad_resources_before_ray_starts(tmp_path):
    spec = {"model": to_dict(preset("tiny", n_layer=1, d_model=32, n_head=2, block_size=32)),
            "data": {"kind": "text", "block_size": 32, "text": {"tokenizer": "char"}},
            "train": {"steps": 2, "batch_size": 8, "zero_stage": 2}}
    was_running = ray.is_initialized()
    with pytest.raises(ValueError, match=r"resources_per_worker\['CPU'\]"):
        fit(spec, out_dir=tmp_path / "out", run_name="bad", storage_path=tmp_path / "ray",
            num_workers=2, resources_per_worker={"CPU": -2})
    assert ray.is_initialized() == was_running and not (tmp_path / "out").exists()
