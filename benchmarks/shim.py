"""Make `phaselab.kernels` importable from a plain checkout (the GPU machine has no install).

Maps the package names onto the repository folders exactly as pyproject's package-dir does
("phaselab.kernels" = "kernels", likewise workloads, catalog, orchestrator), without installing
anything. Used by benchmarks/attention.py and,
on the H200, as `python benchmarks/shim.py -m gpu tests/kernels` (runs pytest with the mapping).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


PACKAGES = {"kernels": "kernels", "workloads": "workloads", "catalog": "catalog", "orchestrator": "orchestrator"}


def install() -> None:
    """Register phaselab and its four sub-packages in sys.modules unless phaselab imports already.

    Sub-packages load lazily through their own __path__, so a missing optional dependency (ray,
    mlflow on the GPU image) only matters to code that imports it.
    """
    try:
        import phaselab.kernels  # noqa: F401
        return
    except ImportError:
        pass
    pkg = types.ModuleType("phaselab")
    pkg.__path__ = [str(ROOT / "phaselab")]
    sys.modules["phaselab"] = pkg
    for name, folder in PACKAGES.items():
        spec = importlib.util.spec_from_file_location(f"phaselab.{name}", ROOT / folder / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"phaselab.{name}"] = module
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:  # e.g. a package needing mlflow, absent on the GPU image
            del sys.modules[f"phaselab.{name}"]
            if name == "kernels":
                raise
            print(f"shim: phaselab.{name} not importable here ({exc})", file=sys.stderr)
            continue
        setattr(pkg, name, module)


if __name__ == "__main__":
    import pytest

    install()
    sys.exit(pytest.main(sys.argv[1:]))
