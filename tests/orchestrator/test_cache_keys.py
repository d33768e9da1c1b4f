"""Cache keys: canonical JSON, AST code hash, stability and sensitivity of stage keys, Merkle
propagation, ignored keys, and dedup across cells and grids (DESIGN §5.4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _orchestrator_grids import BASE

from phaselab.orchestrator.plan.dag import build_dag, load_grid
from phaselab.orchestrator.plan.hashing import (
    CodeVersion,
    ast_hash,
    canonical_json,
    code_version,
    make_key,
    sha256_hex,
)

CODE = CodeVersion(digest="c" * 64, modules={"phaselab.workloads.train.loop": "1" * 64})


def _dag(tmp_path: Path, text: str = BASE, overrides: tuple[str, ...] = (), code: CodeVersion = CODE,
         name: str = "g.yaml"):
    path = tmp_path / name
    path.write_text(text)
    spec, marks, sub, res = load_grid(path, list(overrides))
    return build_dag(spec, marks, code=code, yaml_submitted=sub, yaml_resolved=res)


def _by_name(dag) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for h, n in dag.nodes.items():
        out.setdefault(n.name, []).append(h)
    return out


def test_canonical_json_normalises() -> None:
    assert canonical_json({"b": 1.0, "a": [1, 2.5, (3,)]}) == '{"a":[1,2.5,[3]],"b":1}'
    assert canonical_json({"x": -0.0}) == canonical_json({"x": 0})
    assert canonical_json({"x": float("nan"), "y": float("-inf")}) == '{"x":"nan","y":"-inf"}'
    assert canonical_json({"x": 0.1 + 0.2}) == '{"x":0.30000000000000004}'
    with pytest.raises(TypeError, match="object"):
        canonical_json({"x": object()})


def test_ast_hash_ignores_comments_docstrings_and_formatting() -> None:
    src = 'def f(x):\n    """Doc."""\n    return x + 1\n'
    same = '# a comment\ndef f( x ):\n    """Another docstring."""\n\n    return (x + 1)  # why\n'
    other = 'def f(x):\n    return x + 2\n'
    assert ast_hash(src) == ast_hash(same)
    assert ast_hash(src) != ast_hash(other)


def test_code_version_names_changed_modules(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Package."""\n')
    (pkg / "sub" / "mod.py").write_text("X = 1\n")
    before = code_version(("phaselab.workloads",), roots={"phaselab.workloads": pkg})
    (pkg / "__init__.py").write_text('"""Changed docstring."""\n# comment\n')
    assert code_version(("phaselab.workloads",), roots={"phaselab.workloads": pkg}) == before
    (pkg / "sub" / "mod.py").write_text("X = 2\n")
    after = code_version(("phaselab.workloads",), roots={"phaselab.workloads": pkg})
    assert after.digest != before.digest
    key_a = make_key(kind="pretrain", config={}, upstream={}, code=before, data={})
    key_b = make_key(kind="pretrain", config={}, upstream={}, code=after, data={})
    assert key_a.digest != key_b.digest
    assert key_b.explain(key_a) == ["code: phaselab.workloads.sub.mod (changed)"]


def test_real_code_version_covers_workloads_and_kernels() -> None:
    cv = code_version()
    assert "phaselab.workloads.train.loop" in cv.modules
    assert "phaselab.kernels.registry" in cv.modules
    assert cv.digest == sha256_hex(canonical_json(dict(cv.modules)))


def test_key_is_stable_and_yaml_key_order_does_not_matter(tmp_path: Path) -> None:
    a = _dag(tmp_path, name="a.yaml")
    reordered = BASE.replace("  data: {kind: text, block_size: 32}\n  train: {steps: 2, batch_size: 2, eval_every: 0, device: cpu}\n",
                             "  train: {device: cpu, eval_every: 0, batch_size: 2, steps: 2}\n  data: {block_size: 32, kind: text}\n")
    assert reordered != BASE
    b = _dag(tmp_path, reordered, name="b.yaml")
    assert list(a.nodes) == list(b.nodes)
    assert len(a.nodes) == 4 and all(len(h) == 64 for h in a.nodes)


@pytest.mark.parametrize("override,changes_pretrain", [
    ("defaults.train.lr=0.01", True),                  # a training field
    ("defaults.model.n_layer=3", True),                # a model field over the preset
    ("defaults.data.text.train_fraction=0.8", True),   # the data (config and digest)
    ("+salt=v2", True),                                # manual invalidation
    ("stages.ppl.eval.ppl.lengths=[16]", False),       # eval-only: the pretrain is reused
])
def test_each_part_changes_the_key(tmp_path: Path, override: str, changes_pretrain: bool) -> None:
    base = _by_name(_dag(tmp_path))
    new = _by_name(_dag(tmp_path, overrides=(override,)))
    assert (set(base["pretrain"]) != set(new["pretrain"])) == changes_pretrain
    assert set(base["ppl"]).isdisjoint(new["ppl"])     # the eval always changes (Merkle or own field)


def test_upstream_change_propagates_and_explain_names_it(tmp_path: Path) -> None:
    a = _dag(tmp_path)
    b = _dag(tmp_path, overrides=("defaults.train.lr=0.01",))
    ev_a = next(n for n in a.nodes.values() if n.name == "ppl" and "pe=rope" in n.members[0][0])
    ev_b = next(n for n in b.nodes.values() if n.name == "ppl" and "pe=rope" in n.members[0][0])
    assert ev_a.config == ev_b.config
    lines = ev_b.key.explain(ev_a.key)
    assert len(lines) == 1 and lines[0].startswith("upstream checkpoint: ")
    pre_a = a.nodes[ev_a.upstream["checkpoint"]]
    pre_b = b.nodes[ev_b.upstream["checkpoint"]]
    assert pre_b.key.explain(pre_a.key) == ["config.train.lr: 0.0006 -> 0.01"]


def test_code_change_changes_every_key(tmp_path: Path) -> None:
    other = CodeVersion(digest="d" * 64, modules={"phaselab.workloads.train.loop": "2" * 64})
    a, b = _dag(tmp_path), _dag(tmp_path, code=other)
    assert set(a.nodes).isdisjoint(b.nodes)
    pre_b = next(n for n in b.nodes.values() if n.kind == "pretrain")
    pre_a = next(n for n in a.nodes.values() if n.kind == "pretrain" and n.config == pre_b.config)
    assert pre_b.key.explain(pre_a.key) == ["code: phaselab.workloads.train.loop (changed)"]


@pytest.mark.parametrize("override", ["defaults.train.log_every=1", "+defaults.train.grad_accum=2",
                                      "+defaults.train.ckpt_every=7", "+defaults.train.keep_checkpoints=5"])
def test_ignored_keys_do_not_change_the_key(tmp_path: Path, override: str) -> None:
    text = BASE.replace("eval_every: 0,", "eval_every: 0, log_every: 10,")
    assert set(_dag(tmp_path, text).nodes) == set(_dag(tmp_path, text, overrides=(override,)).nodes)


def test_dedup_across_cells_and_grids(tmp_path: Path) -> None:
    # An axis used only by the eval: one pretrain per pe serves both eval lengths.
    text = BASE.replace("    pe: [rope, pope]", "    pe: [rope, pope]\n    L: [16, 32]") \
               .replace("ppl: {lengths: [32]}", "ppl: {lengths: [\"${L}\"]}")
    dag = _dag(tmp_path, text)
    names = _by_name(dag)
    assert len(dag.cells) == 4
    assert len(names["pretrain"]) == 2 and len(names["ppl"]) == 4
    shared = dag.nodes[names["pretrain"][0]]
    assert len(shared.members) == 2 and {c for c, _ in shared.members} == {"pe=rope,L=16,seed=0", "pe=rope,L=32,seed=0"}
    # Another grid (other name, other stage names) plans the same pretrain: same node, same key.
    other = BASE.replace("grid: t", "grid: other").replace("  pretrain:\n", "  base:\n").replace("[pretrain]", "[base]")
    assert set(names["pretrain"]) == set(_by_name(_dag(tmp_path, other, name="o.yaml"))["base"])


def test_a_field_added_with_its_default_in_key_defaults_keeps_existing_keys() -> None:
    """The rule for adding a config field (DESIGN §5.4): a stage whose value is the default the
    field was added with keys as before the field existed; any other value changes the key."""
    from phaselab.orchestrator.plan.hashing import make_key

    old = {"train": {"steps": 10, "lr": 1e-3}}
    with_field = {"train": {"steps": 10, "lr": 1e-3, "new_switch": "off"}}
    other_value = {"train": {"steps": 10, "lr": 1e-3, "new_switch": "on"}}

    def key(config: dict, defaults: dict) -> str:
        from phaselab.orchestrator.plan import hashing

        saved = dict(hashing.KEY_DEFAULTS)
        hashing.KEY_DEFAULTS.clear()
        hashing.KEY_DEFAULTS.update(defaults)
        try:
            return make_key(kind="pretrain", config=config, upstream={}, code=CODE, data={}).digest
        finally:
            hashing.KEY_DEFAULTS.clear()
            hashing.KEY_DEFAULTS.update(saved)

    rule = {"train.new_switch": "off"}
    assert key(with_field, rule) == key(old, rule) == key(old, {})
    assert key(other_value, rule) != key(old, rule)
    assert key(with_field, {}) != key(old, {})   # without the entry, the new field re-keys everything
