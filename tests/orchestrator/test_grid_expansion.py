"""Grid expansion (product / zip / exclude / seeds), interpolation, ``when``, and the Hydra-style
override grammar, on golden cases."""

from __future__ import annotations

import pytest

from phaselab.orchestrator.language.expand import expand_cells, resolve_cell
from phaselab.orchestrator.language.overrides import apply_overrides, parse_override
from phaselab.orchestrator.language.spec import validate_spec
from phaselab.orchestrator.language.yamlio import GridError, load_yaml

GRID = """\
grid: g
seeds: [0, 1]
axes:
  product:
    size: [s, m]
    pe: [rope, pope, tapa]
  zip:
    - {lr: [1.0e-3, 5.0e-4], wd: [0.1, 0.0]}
  exclude:
    - {size: m, pe: tapa}
    - {pe: pope, lr: 5.0e-4, seed: 1}
defaults:
  train: {lr: "${lr}", weight_decay: "${wd}"}
  model: {preset: "owt-${size}", pe: {kind: "${pe}"}}
stages:
  pretrain: {kind: pretrain}
  yarn: {kind: finetune, needs: [pretrain], when: {pe: rope}, extend: {rule: yarn}}
"""


def _spec(text: str = GRID, overrides: list[str] | None = None):
    doc, marks = load_yaml(text, file="g.yaml")
    if overrides:
        doc = apply_overrides(doc, marks, overrides)
    return validate_spec(doc, marks), marks


def test_product_zip_exclude_seeds_golden() -> None:
    spec, _ = _spec()
    keys = [c.key for c in expand_cells(spec)]
    # 2 sizes x 3 pe x 2 zip rows x 2 seeds = 24; minus m/tapa (2 x 2 = 4) and pope/5e-4/seed 1 (2 sizes)
    assert len(keys) == 24 - 4 - 2
    assert keys[:4] == ["size=s,pe=rope,lr=0.001,wd=0.1,seed=0", "size=s,pe=rope,lr=0.001,wd=0.1,seed=1",
                        "size=s,pe=rope,lr=0.0005,wd=0.0,seed=0", "size=s,pe=rope,lr=0.0005,wd=0.0,seed=1"]
    assert not any("size=m,pe=tapa" in k for k in keys)
    assert "size=s,pe=pope,lr=0.0005,wd=0.0,seed=0" in keys
    assert "size=s,pe=pope,lr=0.0005,wd=0.0,seed=1" not in keys
    assert len(set(keys)) == len(keys)


def test_interpolation_keeps_types_and_formats_strings() -> None:
    spec, marks = _spec()
    cell = expand_cells(spec)[2]
    stages = {rs.name: rs for rs in resolve_cell(spec, cell, marks)}
    train = stages["pretrain"].sections["train"]
    assert train["lr"] == 5.0e-4 and isinstance(train["lr"], float)
    assert train["weight_decay"] == 0.0
    assert train["seed"] == 0          # the seed axis drives train.seed
    assert stages["pretrain"].sections["model"] == {"preset": "owt-s", "pe": {"kind": "rope"}}
    assert stages["pretrain"].origins["train.lr"] == ("defaults", "train", "lr")


def test_when_selects_stages_per_cell() -> None:
    spec, marks = _spec()
    by_pe = {c.axes["pe"]: [rs.name for rs in resolve_cell(spec, c, marks)] for c in expand_cells(spec)}
    assert by_pe == {"rope": ["pretrain", "yarn"], "pope": ["pretrain"], "tapa": ["pretrain"]}


def test_stage_sections_merge_over_defaults() -> None:
    text = GRID.replace("pretrain: {kind: pretrain}", "pretrain: {kind: pretrain, train: {lr: 0.5, steps: 7}}")
    spec, marks = _spec(text)
    rs = resolve_cell(spec, expand_cells(spec)[0], marks)[0]
    assert rs.sections["train"] == {"lr": 0.5, "weight_decay": 0.1, "steps": 7, "seed": 0}
    assert rs.origins["train.lr"] == ("stages", "pretrain", "train", "lr")
    assert rs.origins["train.weight_decay"] == ("defaults", "train", "weight_decay")


@pytest.mark.parametrize("text,op,path,value,sweep", [
    ("defaults.train.lr=3e-4", "set", ("defaults", "train", "lr"), 3e-4, None),
    ("+defaults.train.steps=10", "add", ("defaults", "train", "steps"), 10, None),
    ("++defaults.train.steps=10", "force", ("defaults", "train", "steps"), 10, None),
    ("~defaults.model", "delete", ("defaults", "model"), None, None),
    ("seeds=[0,1,2]", "set", ("seeds",), [0, 1, 2], None),
    ("defaults.train.lr=1e-3,3e-3", "set", ("defaults", "train", "lr"), None, (1e-3, 3e-3)),
    ("defaults.train.steps=range(0,3)", "set", ("defaults", "train", "steps"), None, (0, 1, 2)),
    ("defaults.train.steps=range(10,40,10)", "set", ("defaults", "train", "steps"), None, (10, 20, 30)),
    ("defaults.data.kind=choice(text,jsb)", "set", ("defaults", "data", "kind"), None, ("text", "jsb")),
    ("stages.pretrain.kind=pretrain", "set", ("stages", "pretrain", "kind"), "pretrain", None),
    ("defaults.model.pe={kind: rope, rope: {base: 500000}}", "set", ("defaults", "model", "pe"),
     {"kind": "rope", "rope": {"base": 500000}}, None),
])
def test_override_grammar(text, op, path, value, sweep) -> None:
    ov = parse_override(text)
    assert (ov.op, ov.path, ov.value, ov.sweep) == (op, path, value, sweep)


def test_overrides_apply_set_add_delete_and_sweep() -> None:
    spec, _ = _spec(overrides=["defaults.train.lr=0.25", "+defaults.train.steps=9", "seeds=[5]",
                               "~axes.exclude", "defaults.train.weight_decay=0.0,0.5"])
    assert spec.defaults.train == {"lr": 0.25, "weight_decay": "${defaults.train.weight_decay}", "steps": 9}
    assert spec.axes.product["defaults.train.weight_decay"] == [0.0, 0.5]
    cells = expand_cells(spec)
    assert len(cells) == 2 * 3 * 2 * 1 * 2          # no exclude, one seed, a new 2-value axis
    assert {c.axes["seed"] for c in cells} == {5}


@pytest.mark.parametrize("text,fragment", [
    ("defaults.trian.lr=1", "not in the grid"),
    ("axes.product.pee=[1]", "not in the grid"),
    ("+defaults.train.lr=1", "already exists"),
    ("~defaults.nothing", "not in the grid"),
    ("defaults.train.lr", "expected key=value"),
    ("grid=a,b", "sweeps are allowed only"),
    ("defaults.train.steps=range(a)", "range() takes"),
    ("defaults..x=1", "invalid key"),
])
def test_override_errors(text: str, fragment: str) -> None:
    with pytest.raises(GridError) as info:
        _spec(overrides=[text])
    assert fragment in str(info.value)
    assert f"<override {text!r}>" in str(info.value)
