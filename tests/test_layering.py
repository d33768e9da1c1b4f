"""The one-way import rule of DESIGN §2, checked mechanically over the source tree.

kernels imports nothing of ours; catalog imports nothing of ours (and never torch);
workloads may import phaselab.kernels and phaselab.catalog.tracking only; orchestrator anything;
phaselab.cli imports the orchestrator lazily. Code imports only through ``phaselab.*``. No
module imports ``phaselab.orchestrator.cli.main`` but the entry point: the command modules share
``orchestrator.cli.common``, so cli.py can import them at top level without a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kernels": "phaselab.kernels", "catalog": "phaselab.catalog",
            "workloads": "phaselab.workloads", "orchestrator": "phaselab.orchestrator",
            "phaselab": "phaselab"}
# What workloads may import of the catalog: the tracker interface and the run folder's names.
_TRACKER = ("phaselab.catalog.tracking", "phaselab.catalog.tracking.interface", "phaselab.catalog.tracking.run_folder")
ALLOWED = {
    "phaselab.kernels": ("phaselab.kernels",),
    "phaselab.catalog": ("phaselab.catalog",),
    "phaselab.workloads": ("phaselab.workloads", "phaselab.kernels", *_TRACKER),
    "phaselab.orchestrator": ("phaselab",),
    "phaselab": ("phaselab",),
}
BARE_TOP_LEVEL = {"kernels", "catalog", "workloads", "orchestrator"}
_K_COMMON = "phaselab.kernels.common"
# room -> the rooms of its own package it may import (itself always); any other package follows ALLOWED.
ROOMS = {
    "phaselab.catalog.tracking.interface": (),
    "phaselab.catalog.tracking.run_folder": (),
    "phaselab.orchestrator.stages": (),
    "phaselab.orchestrator.language": ("phaselab.orchestrator.stages",),
    "phaselab.orchestrator.plan": ("phaselab.orchestrator.stages", "phaselab.orchestrator.language"),
    "phaselab.orchestrator.engine": ("phaselab.orchestrator.stages", "phaselab.orchestrator.language",
                                     "phaselab.orchestrator.plan"),
    "phaselab.orchestrator.cli": ("phaselab.orchestrator",),
    "phaselab.catalog.store": _TRACKER,
    "phaselab.catalog.reports": (*_TRACKER, "phaselab.catalog.store"),
    "phaselab.catalog.tracking": ("phaselab.catalog",),
    # kernels: common is the floor; each operator folder imports common and the cores it runs on
    # (pope, relbias and TAPA's Gluon forward run on flash); attention, the front door, routes to them. flash's backward carries PoPE's chain
    # rule in its epilogues, so flash may import that one module of pope (and pope runs on flash).
    "phaselab.kernels.common": (),
    "phaselab.kernels.rotary": (),
    "phaselab.kernels.registry": (_K_COMMON,),
    "phaselab.kernels.testing": (_K_COMMON,),
    "phaselab.kernels.loss": (_K_COMMON,),
    "phaselab.kernels.tapa": (_K_COMMON, "phaselab.kernels.registry", "phaselab.kernels.flash"),
    "phaselab.kernels.flash": (_K_COMMON, "phaselab.kernels.pope.triton_expand_bwd"),
    "phaselab.kernels.pope": (_K_COMMON, "phaselab.kernels.registry", "phaselab.kernels.flash"),
    "phaselab.kernels.relbias": (_K_COMMON, "phaselab.kernels.flash"),
    "phaselab.kernels.attention": (_K_COMMON, "phaselab.kernels.registry", "phaselab.kernels.flash",
                                   "phaselab.kernels.pope", "phaselab.kernels.tapa", "phaselab.kernels.relbias"),
}


def _room(module: str) -> str | None:
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def _room_violation(module: str, name: str) -> str | None:
    """The rule between rooms of one package; None when ``name`` is in another package or allowed."""
    room = _room(module)
    package = ".".join(module.split(".")[:2])
    if room is None or not name.startswith(package + ".") or name == package:
        return None
    target = _room(name)
    if target == room:
        return None
    # the tracker modules are allowed as themselves, never as a prefix (tracking's MLflow side)
    if target is None or not any(name == a or (a not in _TRACKER and name.startswith(a + "."))
                                 for a in ROOMS[room]):
        return f"{room} may not import {name}"
    return None


def _module_name(path: Path, root: Path = ROOT) -> tuple[str, str]:
    folder = path.relative_to(root).parts[0]
    rel = path.relative_to(root / folder).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return PACKAGES[folder], ".".join([PACKAGES[folder], *parts])


def _imports(path: Path, module: str, root: Path = ROOT) -> list[tuple[int, str, bool]]:
    """(line, imported module, at top level?) for every import in the file; ``from pkg import
    mod`` counts as importing ``pkg.mod`` where that is a module of ours."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[int, str, bool]] = []
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            subs = [f"{name}.{a.name}" for a in node.names if _is_module(f"{name}.{a.name}", root)]
            out += [(node.lineno, n, id(node) in top) for n in (subs or [name])]
    return out


def _is_module(name: str, root: Path) -> bool:
    parts = name.split(".")
    if parts[0] != "phaselab" or len(parts) < 3:
        return False
    folder = root / parts[1] / Path(*parts[2:])
    return folder.with_suffix(".py").is_file() or (folder / "__init__.py").is_file()


def _sources(root: Path = ROOT) -> list[Path]:
    """Every .py file of the packages, Alembic migrations included (they are catalog code)."""
    files: list[Path] = []
    for folder in PACKAGES:
        files += sorted((root / folder).rglob("*.py"))
    return files


def _violations(root: Path = ROOT) -> list[str]:
    bad: list[str] = []
    for path in _sources(root):
        layer, module = _module_name(path, root)
        for line, name, at_top in _imports(path, module, root):
            where = f"{path.relative_to(root)}:{line}"
            head = name.split(".")[0]
            if head in BARE_TOP_LEVEL:
                bad.append(f"{where}: imports '{name}' (use phaselab.{name})")
            if not name.startswith("phaselab"):
                continue
            if layer == "phaselab" and name.startswith("phaselab.orchestrator") and at_top:
                bad.append(f"{where}: phaselab.cli must import the orchestrator lazily")
            exact = layer == "phaselab.workloads" and name.startswith("phaselab.catalog")
            if not any(name == a or (not exact and name.startswith(a + ".")) for a in ALLOWED[layer]):
                bad.append(f"{where}: {layer} may not import {name}")
            if name == "phaselab.orchestrator.cli.main" and layer != "phaselab":
                bad.append(f"{where}: imports the CLI entry module (shared CLI pieces live in cli.common)")
            room_bad = _room_violation(module, name)
            if room_bad:
                bad.append(f"{where}: {room_bad}")
    return bad


def test_one_way_imports() -> None:
    assert _violations() == []


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    # The rule must be able to fail, in every package folder, migrations included: a probe tree
    # with a kernels module importing workloads, a bare top-level import, a migration importing
    # workloads and a cli importing the orchestrator at top level.
    probes = {
        "kernels/probe.py": "from phaselab.workloads.models import transformer\nimport kernels.registry\n",
        "catalog/store/migrations/versions/0099_probe.py": "import phaselab.workloads.train\n",
        "phaselab/cli.py": "from phaselab.orchestrator.cli.main import app\n",
        "workloads/ok.py": "from phaselab.kernels import registry\nfrom phaselab.catalog.tracking import Tracker\n",
        "orchestrator/cli/probe.py": "def register(app):\n    from phaselab.orchestrator.cli.main import JSON\n",
        "orchestrator/plan/probe.py": "from phaselab.orchestrator.engine import controller\n",
        "catalog/store/probe.py": "from phaselab.catalog.reports import export\n",
    }
    for rel, src in probes.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src)
    bad = _violations(tmp_path)
    assert any("kernels/probe.py:1" in b and "phaselab.workloads" in b for b in bad), bad
    assert any("kernels/probe.py:2" in b and "use phaselab.kernels" in b for b in bad), bad
    assert any("0099_probe.py:1" in b and "phaselab.catalog may not import" in b for b in bad), bad
    assert any("phaselab/cli.py:1" in b and "lazily" in b for b in bad), bad
    assert any("cli/probe.py:2" in b and "cli.common" in b for b in bad), bad
    assert any("plan/probe.py:1" in b and "orchestrator.plan may not import" in b for b in bad), bad
    assert any("store/probe.py:1" in b and "catalog.store may not import" in b for b in bad), bad
    assert not any("workloads/ok.py" in b for b in bad), bad
    assert len(bad) == 7, bad


def test_store_and_reports_get_the_tracker_interface_not_mlflow(tmp_path: Path) -> None:
    probes = {"catalog/store/probe.py": "from phaselab.catalog.tracking import MetricRecord\n"
                                        "from phaselab.catalog.tracking.mlflow_tracker import MlflowTracker\n",
              "catalog/reports/probe.py": "from phaselab.catalog.tracking.run_folder import read_steps\n"}
    for rel, src in probes.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src)
    bad = _violations(tmp_path)
    assert bad == [("catalog/store/probe.py:2: phaselab.catalog.store may not import "
                    "phaselab.catalog.tracking.mlflow_tracker")], bad


def test_kernel_rooms_are_checked(tmp_path: Path) -> None:
    # common is the floor, operators never import the front door, and flash may import only the
    # one module of pope that its backward's PoPE epilogue needs.
    probes = {"kernels/common/probe.py": "from phaselab.kernels.flash import triton_flash\n",
              "kernels/tapa/probe.py": "from phaselab.kernels.attention import function\n",
              "kernels/flash/probe.py": "from phaselab.kernels.pope.triton_expand_bwd import pope_meta\n"
                                        "from phaselab.kernels.pope import cudnn\n",
              "kernels/attention/probe.py": "from phaselab.kernels.tapa import function\n"}
    for rel, src in probes.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src)
    bad = _violations(tmp_path)
    assert bad == ["kernels/common/probe.py:1: phaselab.kernels.common may not import phaselab.kernels.flash",
                   "kernels/flash/probe.py:2: phaselab.kernels.flash may not import phaselab.kernels.pope",
                   "kernels/tapa/probe.py:1: phaselab.kernels.tapa may not import phaselab.kernels.attention"], bad


@pytest.mark.parametrize("package", ["phaselab.orchestrator", "phaselab.catalog"])
def test_orchestrator_and_catalog_import_without_torch(package: str) -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module('{package}')\n"
        "skip = ('phaselab.catalog.store.migrations',)\n"
        "mods = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.')]\n"
        "if pkg.__name__ == 'phaselab.orchestrator':\n"
        "    mods = [m for m in mods if m.endswith(('.cli.main', '.spec', '.expand'))]\n"
        "for m in mods:\n"
        "    if not m.startswith(skip):\n"
        "        importlib.import_module(m)\n"
        "heavy = sorted(n for n in ('torch', 'triton', 'deepspeed') if n in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/tmp",
                         check=True)
    assert out.stdout.strip() == ""
