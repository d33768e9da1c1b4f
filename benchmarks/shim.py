"""Make `phaselab.kernels` importable from a plain checkout (the GPU machine has no install).

Maps the package names onto the repository folders exactly as pyproject's package-dir does
("phaselab.kernels" = "kernels"), without installing anything. Used by benchmarks/attention.py and,
on the H200, as `python benchmarks/shim.py -m gpu tests/kernels` (runs pytest with the mapping).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install() -> None:
    """Register phaselab and phaselab.kernels in sys.modules unless they import already."""
    try:
        import phaselab.kernels  # noqa: F401
        return
    except ImportError:
        pass
    pkg = types.ModuleType("phaselab")
    pkg.__path__ = [str(ROOT / "phaselab")]
    sys.modules["phaselab"] = pkg
    spec = importlib.util.spec_from_file_location("phaselab.kernels", ROOT / "kernels" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "kernels")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["phaselab.kernels"] = module
    spec.loader.exec_module(module)
    pkg.kernels = module


if __name__ == "__main__":
    import pytest

    install()
    sys.exit(pytest.main(sys.argv[1:]))
