"""Screenshots a browser test took: committed under docs/images/ when
``PHASELAB_UPDATE_SCREENSHOTS=1`` (otherwise only checked by the test)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "images"


def keep(shots: Mapping[str, Path]) -> None:
    if os.environ.get("PHASELAB_UPDATE_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        for path in shots.values():
            shutil.copy(path, DOCS / path.name)
