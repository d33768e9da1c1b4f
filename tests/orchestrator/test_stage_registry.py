"""Adding a stage kind touches its own module and the registry only.

``WaitStage`` below is a complete new kind, defined here and nowhere else: its own config section
(``wait``), a required section, an output name its downstream stages receive it under, and its
own Ray options. Registered for the duration of a test (``stages.registered``), it goes through
the grid schema and its per-kind rules, the DAG (keys, inputs, edges), the plan view, ``verify``
and a real run on a local Ray cluster, with no other file changed. The built-in kinds' keys are
pinned separately (test_cache_keys.py); here, that the registry's declarations are what those
layers read.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import local_ray
import pytest

from phaselab.catalog.tracking import MetricRecord
from phaselab.orchestrator.cli.views import plan_rows
from phaselab.orchestrator.engine.controller import Controller
from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import build_dag, load_grid
from phaselab.orchestrator.stages import (
    STAGES,
    Resources,
    Stage,
    StageContext,
    StageResult,
    child_kinds,
    registered,
    section_names,
)
from phaselab.orchestrator.stages.base import convert_section


@dataclass(frozen=True, kw_only=True)
class WaitConfig:
    seconds: float = 0.0
    label: str = "w"

    def __post_init__(self) -> None:
        if not math.isfinite(self.seconds) or self.seconds < 0:
            raise ValueError(f"seconds must be a finite number >= 0, got {self.seconds!r}")


class WaitStage(Stage):
    """Waits ``wait.seconds``, then writes a note naming its label and its upstream's note."""

    kind = "wait"
    sections = ("wait",)
    required = ("wait",)
    output = "waited"

    def normalize(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        return {"wait": convert_section(WaitConfig, sections.get("wait") or {}, "wait")}

    def ray_options(self, res: Resources, launcher: str) -> dict[str, Any]:
        return {"num_cpus": 0.5, "num_gpus": 0}

    def demand(self, res: Resources, config: Mapping[str, Any]) -> tuple[float, float]:
        return 0.5, 0.0

    def run(self, ctx: StageContext) -> StageResult:
        time.sleep(ctx.config["wait"]["seconds"])
        before = ctx.upstream_artifact("waited", "note", required=False)
        chain = (json.loads(before.read_text())["chain"] if before else []) + [ctx.config["wait"]["label"]]
        note = ctx.out_dir / "note.json"
        note.write_text(json.dumps({"chain": chain}))
        return StageResult(status="succeeded", metrics={"links": float(len(chain))}, artifacts={"note": note},
                           records=[MetricRecord(name="links", value=float(len(chain)))])


GRID = """\
grid: waits
axes:
  product: {label: [a, b]}
stages:
  first: {kind: wait, wait: {label: "${label}", seconds: 0.1}}
  second: {kind: wait, needs: [first], wait: {label: "${label}2"}}
  after: {kind: noop, needs: [second], noop: {tag: "${label}"}}
"""


def _plan(tmp_path: Path, text: str = GRID):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    spec, marks, sub, resolved = load_grid(path)
    return build_dag(spec, marks, yaml_submitted=sub, yaml_resolved=resolved)


def test_a_kind_exists_only_while_registered(tmp_path: Path) -> None:
    with registered(WaitStage()) as stage:
        assert STAGES["wait"] is stage and section_names()[-1] == "wait"
    assert "wait" not in STAGES and "wait" not in section_names()
    with pytest.raises(GridError) as info:
        _plan(tmp_path)
    assert "unknown stage kind 'wait'" in str(info.value)
    with pytest.raises(ValueError, match="built in"), registered(type("Fake", (WaitStage,), {"kind": "eval"})()):
        pass
    assert type(STAGES["eval"]).__name__ == "EvalStage"


def test_the_toy_kind_plans_from_its_own_declarations(tmp_path: Path) -> None:
    with registered(WaitStage()):
        dag = _plan(tmp_path)
        assert sorted(n.name for n in dag.nodes.values()) == ["after", "after", "first", "first", "second", "second"]
        first = next(n for n in dag.nodes.values() if n.name == "first" and n.config["wait"]["label"] == "a")
        assert first.config == {"wait": {"seconds": 0.1, "label": "a"}}   # defaults filled by its own config
        second = [n for n in dag.nodes.values() if n.name == "second" and first.hash in n.upstream.values()]
        assert len(second) == 1 and second[0].upstream == {"waited": first.hash}   # its ``output`` name
        after = next(n for n in dag.nodes.values() if n.name == "after" and second[0].hash in n.upstream.values())
        assert after.upstream == {"waited": second[0].hash}
        assert (first.hash, second[0].hash, "uses") in dag.edges()
        assert first.launcher == "ray_task" and "uses no GPU" in first.resources.gpus_why   # gpus: auto -> 0
        assert replace(first.resources, gpus_auto=False, gpus_why="") == Resources()
        rows = {r["hash"]: r for r in plan_rows(dag, {})}
        assert rows[first.hash]["training"] is False and rows[first.hash]["gpu_hours_est"] is None
        assert "wait" not in child_kinds()


@pytest.mark.parametrize(("edit", "fragment", "suggestion"), [
    (("seconds: 0.1", "secnds: 0.1"), "unknown key for WaitConfig", "seconds"),
    (("seconds: 0.1", "seconds: -1"), "seconds must be a finite number", None),
    ((', wait: {label: "${label}2"}', ""), "a wait stage needs a 'wait' section", None),
    (('noop: {tag: "${label}"}', 'noop: {tag: "${label}"}, wait: {}'), "a noop stage takes no 'wait' section", None),
])
def test_the_toy_kinds_rules_come_from_its_declarations(tmp_path: Path, edit, fragment, suggestion) -> None:
    assert edit[0] in GRID
    with registered(WaitStage()), pytest.raises(GridError) as info:
        _plan(tmp_path, GRID.replace(*edit, 1))
    issue = next(i for i in info.value.issues if fragment in i.message)
    assert issue.suggestion == suggestion and issue.mark.line > 0


@pytest.fixture
def ray_address():
    from ray import cloudpickle

    # Ray workers cannot import a test module by name (a plugin's installed package they can):
    # ship this module's classes by value with the stage object the controller sends.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield local_ray.shared()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_the_toy_kind_runs_on_a_local_ray_cluster(tmp_path: Path, ray_address) -> None:
    from phaselab.catalog.store.api import CatalogStore
    from phaselab.orchestrator.engine.verify import verify_stage

    store = CatalogStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    store.upgrade()
    with registered(WaitStage()):
        dag = _plan(tmp_path)
        summary = Controller(store, dag, runs_root=tmp_path / "runs", heartbeat_s=1.0).run(timeout_s=120)
        assert summary.ok, summary.failed
        for h, node in dag.nodes.items():
            row = store.get_stage(h)
            assert row.state == "SUCCEEDED" and row.kind == node.kind
        for node in (n for n in dag.nodes.values() if n.name == "second"):
            note = next(a for a in store.reads.artifacts_for_stage(node.hash) if a.name == "note")
            label = node.config["wait"]["label"]
            assert json.loads(Path(note.uri).read_text()) == {"chain": [label[:-1], label]}
        with pytest.raises(ValueError, match="not a SUCCEEDED training stage"):
            verify_stage(store, next(h for h, n in dag.nodes.items() if n.kind == "wait"), steps=1, rtol=0.1)
