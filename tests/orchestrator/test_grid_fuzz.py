"""A property-based fuzzer of the grid loader: mutated grid files and hostile overrides are either
refused with a location (FILE:LINE:COLUMN, or the override's text) or accepted as a valid plan;
never a traceback, never a hang.

CI runs a bounded number of examples; ``PHASELAB_FUZZ_EXAMPLES=3000 pytest
tests/orchestrator/test_grid_fuzz.py`` runs a longer campaign (``PHASELAB_FUZZ_REPORT=FILE``
appends one line per case: accepted, refused or the exception).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from _orchestrator_grids import BASE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import build_dag, load_grid
from phaselab.orchestrator.plan.hashing import CodeVersion

EXAMPLES = int(os.environ.get("PHASELAB_FUZZ_EXAMPLES", "200"))   # about 25 ms a case on 2 cores
REPORT = os.environ.get("PHASELAB_FUZZ_REPORT", "")
CODE = CodeVersion(digest="0" * 64, modules={})

PATHS = [("seeds",), ("grid",), ("axes", "product", "pe"), ("axes", "product", "lr"), ("axes", "zip"),
         ("axes", "exclude"), ("defaults", "train", "lr"), ("defaults", "train", "steps"),
         ("defaults", "train", "batch_size"), ("defaults", "model", "n_layer"), ("defaults", "model", "pe"),
         ("defaults", "data", "block_size"), ("defaults", "resources", "cpus"), ("defaults", "launcher"),
         ("stages", "pretrain", "kind"), ("stages", "pretrain", "when"), ("stages", "ppl", "needs"),
         ("stages", "ppl", "eval", "ppl", "lengths"), ("stages", "ppl", "max_retries"), ("x-a",)]
KEYS = ["seeds", "seed", "pe", "lr", "train.lr", "train.steps", "train.batch_size", "model.n_layer",
        "model", "ppl.eval.ppl.lengths", "axes.product.pe", "+axes.product.zz", "defaults.resources.cpus",
        "stages.pretrain.when", "+x-a", "~stages.ppl", "train.final_eval_splits", "grid"]
FRAGMENTS = ["[", "]", "{", "}", ",", ":", "&a", "*a", "!!python/object:os.system", "${pe}", "${", ".nan",
             ".inf", "1e999", "true", "0", "-1", "9" * 40, "range(0,3)", "choice(a,b)", "'", '"', "\n", "\t",
             "\x00", "- ", "? ", "<<: *a", "rope", "pope", "~", "#", "|", "%YAML 1.1", "---"]

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
           | st.sampled_from(["rope", "pope", "tapa", "tiny", "cpu", "${pe}", "${seed}", "pretrain", ""])
           | st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(["kind", "lr", "pe", "steps", "a", "when"]) | st.text(max_size=4),
                                        inner, max_size=3), max_leaves=12)
texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=8).map("".join)
overrides = st.lists(st.tuples(st.sampled_from(KEYS), texts | values.map(lambda v: yaml.safe_dump(
    v, default_flow_style=True, width=10**6).strip().removesuffix("..."))).map(
    lambda kv: kv[0] if kv[0].startswith("~") else f"{kv[0]}={kv[1]}"), max_size=3)


def _set(doc: dict, path: tuple, value: Any) -> None:
    node = doc
    for p in path[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[path[-1]] = value


@st.composite
def grid_texts(draw: st.DrawFn) -> str:
    """BASE with some keys set to arbitrary values, then some text spliced in at random places."""
    doc = yaml.safe_load(BASE)
    for path, value in draw(st.lists(st.tuples(st.sampled_from(PATHS), values), max_size=3)):
        _set(doc, path, value)
    text = yaml.safe_dump(doc, sort_keys=False, width=10**6)
    for at, piece in draw(st.lists(st.tuples(st.integers(0, len(text)), texts), max_size=2)):
        text = text[:at] + piece + text[at:]
    return text


def _check_refusal(err: GridError, path: Path) -> str:
    assert err.issues
    for issue in err.issues:
        if issue.mark.file.startswith("<override "):
            assert issue.mark.line == 0
        else:
            assert issue.mark.file == str(path) and issue.mark.line >= 1 and issue.mark.column >= 1, str(issue)
        assert issue.message
    return "refused"


def _check_plan(dag: Any) -> str:
    """An accepted grid is valid: integer seeds, distinct cells, finite numbers, stages to run."""
    assert dag.nodes and dag.cells
    assert all(type(s) is int for s in dag.spec.seeds)
    assert len({c.key for c in dag.cells}) == len(dag.cells)
    stack = [n.config for n in dag.nodes.values()]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, (list, tuple)):
            stack += item
        else:
            assert not (isinstance(item, float) and not math.isfinite(item)), item
    return "accepted"


def fuzz_one(text: str, ovs: list[str]) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            spec, marks, _, _ = load_grid(path, ovs)
            outcome = _check_plan(build_dag(spec, marks, code=CODE))
        except GridError as err:
            outcome = _check_refusal(err, path)
        except BaseException as err:
            outcome = f"crash {type(err).__name__}: {str(err)[:200]!r}"
            raise
        finally:
            if REPORT:   # a failed check of the outcome counts as a crash
                with open(REPORT, "a", encoding="utf-8") as out:
                    out.write(f"{outcome if 'outcome' in locals() else 'crash (a check failed)'}\n")
        return outcome


@pytest.mark.timeout(max(600, EXAMPLES))
@settings(max_examples=EXAMPLES, deadline=10_000, database=None, derandomize=not REPORT,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=grid_texts(), ovs=overrides)
def test_fuzzed_grids_are_refused_with_a_location_or_valid(text: str, ovs: list[str]) -> None:
    fuzz_one(text, ovs)


def test_the_fuzzer_reaches_both_outcomes() -> None:
    """The property is not vacuous: the unmutated grid is accepted, a broken one refused."""
    assert fuzz_one(BASE, []) == "accepted"
    assert fuzz_one(BASE, ["seeds=[true]"]) == "refused"
    assert fuzz_one(BASE.replace("pe: [rope, pope]", "pe: [rope, pope"), []) == "refused"
    # found by the fuzzer: a key inside a value that is not a mapping, an index past a list's end
    assert fuzz_one(BASE, ["model=", "model.n_layer=2"]) == "refused"
    assert fuzz_one(BASE, ["ppl.eval.ppl.lengths.3=64"]) == "refused"
    assert fuzz_one(BASE, ["seeds=''"]) == "refused"
    assert fuzz_one(BASE.replace("  product:", "  zip: 1.0\n  product:"), ["seeds=[1]"]) == "refused"
    assert fuzz_one(BASE.replace("pe: [rope, pope]", "pe: [rope, pope, {1: a, b: c}, {1: a, b: c}]"), []) == "refused"
    assert fuzz_one(BASE.replace("pe: [rope, pope]", "pe: [rope, pope, !!set {a}]"), []) == "refused"
    assert fuzz_one(BASE + "description: 2001-01-01\n", []) == "accepted"   # a date reads as its text
    assert fuzz_one(BASE.replace("axes:\n  product:\n    pe: [rope, pope]", "axes: 5"), ["train.lr=1,2"]) == "refused"
