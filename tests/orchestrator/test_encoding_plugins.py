"""Encodings from outside the package at plan time (docs/EXTENDING.md): a "module:Class" kind or
an entry point in a grid, keyed by the plugin's own code, and refused, naming the plugin and the
grid line, when it fails to import, gets a wrong option or returns a wrong shape."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from _orchestrator_grids import BASE, locate

from phaselab.orchestrator.language.yamlio import GridError
from phaselab.orchestrator.plan.dag import plan_grid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "encodings"
XPOS = "phaselab_xpos:XPos"


def _grid(tmp_path: Path, pes: str, pe: str = 'pe: {kind: "${pe}"}') -> Path:
    text = BASE.replace("pe: [rope, pope]", f"pe: [{pes}]").replace('pe: {kind: "${pe}"}', pe)
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch) -> Path:
    """A copy of the examples on sys.path (editable by the test); its modules unloaded after."""
    root = tmp_path / "plugins"
    shutil.copytree(EXAMPLES, root)
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m.startswith(("phaselab_xpos", "phaselab_kerple", "broken_"))]:
        del sys.modules[name]


def test_a_plugin_plans_beside_rope_and_pope_and_only_its_stages_carry_its_code(tmp_path, plugins) -> None:
    dag = plan_grid(_grid(tmp_path, f'rope, pope, "{XPOS}"'))
    kinds = {node.config["model"]["pe"]["kind"] for node in dag.nodes.values() if "model" in node.config}
    assert kinds == {"rope", "pope", XPOS}
    for node in dag.nodes.values():
        plugin = node.key.parts.get("plugin")
        if node.config.get("model", {}).get("pe", {}).get("kind") == XPOS:
            assert plugin["target"] == XPOS and set(plugin["modules"]) == {"phaselab_xpos"}
        elif "model" in node.config:
            assert plugin is None and "options" not in node.key.parts["config"]["model"]["pe"]


def test_editing_the_plugin_rekeys_its_stages_only(tmp_path, plugins) -> None:
    grid = _grid(tmp_path, f'rope, pope, "{XPOS}"')
    before = {n.name + "/" + n.members[0][0]: n.hash for n in plan_grid(grid).nodes.values()}
    source = plugins / "phaselab_xpos.py"
    source.write_text(source.read_text().replace("gamma: float = 0.4", "gamma: float = 0.5"))
    after = {n.name + "/" + n.members[0][0]: n.hash for n in plan_grid(grid).nodes.values()}
    assert before.keys() == after.keys()
    changed = {k for k in before if before[k] != after[k]}
    assert changed and all("XPos" in k or "xpos" in k.lower() for k in changed), changed
    assert len(changed) == 2   # its pretrain and its eval; the rope and pope cells keep their keys


def test_an_entry_point_names_the_plugin_and_its_version_enters_the_key(tmp_path, plugins, monkeypatch) -> None:
    dist = plugins / "phaselab_example_encodings-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: phaselab-example-encodings\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[phaselab.encodings]\nkerple = phaselab_kerple:Kerple\n")
    dag = plan_grid(_grid(tmp_path, "rope, kerple"))
    plugin = [n.key.parts["plugin"] for n in dag.nodes.values() if "plugin" in n.key.parts]
    assert plugin and plugin[0]["target"] == "phaselab_kerple:Kerple"
    assert plugin[0]["dist"] == "phaselab-example-encodings==0.1.0"
    from phaselab.workloads.models import pe_registry

    assert "kerple" in pe_registry.names()


BROKEN = {
    "import": ("broken_import.py", "import not_a_module_anywhere\n",
               "importing 'broken_import' failed: ModuleNotFoundError"),
    "shape": ("broken_shape.py",
              ("from phaselab.workloads.models.positional.base import PositionalEncoding\n"
              "class Enc(PositionalEncoding):\n"
              "    def score(self, score, q_pos, k_pos, head):\n"
              "        return score[..., :1]\n"),
              "score() returned (1, 2, 4, 1), expected the score's shape (1, 2, 4, 4)"),
    "qk_shape": ("broken_qk.py",
                 ("from phaselab.workloads.models.positional.base import PositionalEncoding\n"
                  "class Enc(PositionalEncoding):\n"
                  "    def prepare_qk(self, q, k, pos_q, pos_k):\n"
                  "        return q.transpose(1, 2), k\n"),
                 "prepare_qk returned q of shape (1, 2, 4, 8), expected (1, 4, 2, 8)"),
}


@pytest.mark.parametrize("case", ["import", "shape", "qk_shape", "option"])
def test_a_broken_plugin_fails_at_plan_naming_the_plugin_and_the_grid_line(tmp_path, plugins, case) -> None:
    if case == "option":
        kind, fragment = "phaselab_kerple:Kerple", "options.r1_int: unknown key for KerpleConfig; did you mean 'r1_init'?"
        grid = _grid(tmp_path, f'"{kind}"', 'pe: {kind: "${pe}", options: {r1_int: 2}}')
    else:
        file, source, fragment = BROKEN[case]
        (plugins / file).write_text(source)
        kind = f"{file[:-3]}:{'X' if case == 'import' else 'Enc'}"
        grid = _grid(tmp_path, f'rope, "{kind}"')
    with pytest.raises(GridError) as info:
        plan_grid(grid)
    issues = [i for i in info.value.issues if fragment in i.message]
    assert issues, str(info.value)
    assert repr(kind) in issues[0].message
    line, _ = locate(grid.read_text(), "pe: {kind")
    assert (issues[0].mark.file, issues[0].mark.line) == (str(grid), line)


def test_phaselab_encodings_shows_a_plugins_options_and_a_broken_ones_error(plugins) -> None:
    from typer.testing import CliRunner

    from phaselab.orchestrator.cli.main import app

    res = CliRunner().invoke(app, ["encodings", "rope", "phaselab_kerple:Kerple", "missing_mod:X"])
    assert res.exit_code == 0, res.output
    assert "`phaselab.workloads.models.positional.rope:RoPE` (built-in)" in res.output
    assert "| `pe.options.r1_init` | `float` | `1.0` |" in res.output
    assert "importing 'missing_mod' failed: ModuleNotFoundError" in res.output
