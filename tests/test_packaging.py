"""Packaging: every sub-package is listed in pyproject, and the editable install imports from
outside the repository root (DESIGN §1)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed() -> None:
    tool = _pyproject()["tool"]["setuptools"]
    listed = set(tool["packages"])
    dirs = {v: k for k, v in tool["package-dir"].items()}
    found = set()
    for folder, prefix in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([prefix, *rel.parts]) if rel.parts else prefix)
    assert found - listed == set(), f"not listed in pyproject: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but missing: {sorted(listed - found)}"


def test_editable_install_imports_from_outside_the_repo(tmp_path: Path) -> None:
    code = "import phaselab.kernels, phaselab.catalog.tracking, phaselab; print(phaselab.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         check=True)
    assert out.stdout.strip() == _pyproject()["project"]["version"]


def test_console_script_help_is_fast_and_lazy(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("phaselab")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    for verb in ("run", "plan", "resume", "why", "eval", "export"):
        assert verb in out.stdout


def test_constraints_pin_torch_and_triton() -> None:
    # Without these pins pip resolves a CUDA torch (+3 GB of nvidia wheels) on CPU machines.
    pins = {line.split("==")[0].strip().lower(): line.split("==")[1].strip()
            for line in (ROOT / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.lstrip().startswith("#")}
    assert pins["torch"].startswith("2.") and pins["triton"].startswith("3.")
