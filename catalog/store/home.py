"""The project home: the one place that decides where ``.phaselab/`` (catalog, MLflow store,
stage outputs) lives, so that every command reads the same results from any sub-folder.

Order: ``PHASELAB_HOME`` if set; else the nearest folder, from the working directory up, that
holds a ``.phaselab/`` with a catalog (``catalog.db``) or stage outputs (``runs/``) in it; else
the working directory (where the first ``phaselab run`` creates ``.phaselab/``). A bare
``.phaselab/`` (such as ``~/.phaselab/catalog_url`` on a cluster head) is not a marker.
``PHASELAB_CATALOG_URL`` and ``PHASELAB_RUNS_ROOT`` still override the catalog and the runs root
one by one.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "PHASELAB_HOME"
STATE_DIR = ".phaselab"
_MARKERS = ("catalog.db", "runs")


def find_home(start: Path | None = None) -> Path | None:
    """The nearest folder from ``start`` (default: the working directory) up whose
    ``.phaselab/`` holds a catalog or runs; None when there is none."""
    here = (Path.cwd() if start is None else Path(start)).resolve()
    for folder in (here, *here.parents):
        state = folder / STATE_DIR
        if any((state / m).exists() for m in _MARKERS):
            return folder
    return None


def project_home(start: Path | None = None) -> Path:
    """``PHASELAB_HOME``, else ``find_home(start)``, else ``start`` (default: the working
    directory). Raises ValueError when ``PHASELAB_HOME`` names no folder."""
    env = os.environ.get(HOME_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise ValueError(f"{HOME_ENV}={env!r} is not a folder")
        return path.resolve()
    found = find_home(start)
    return found if found is not None else (Path.cwd() if start is None else Path(start)).resolve()


def state_dir(start: Path | None = None) -> Path:
    """``<project home>/.phaselab``."""
    return project_home(start) / STATE_DIR
