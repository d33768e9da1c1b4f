"""Narrow terminals and logs: at 80 columns a failure reason wraps under the status table instead
of shrinking to "Tr…"; output that is not a terminal keeps its full width."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from phaselab.orchestrator.cli.main import app
from phaselab.orchestrator.cli.views import status_renderable

REASON = ("Traceback (most recent call last): RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB "
          "(GPU 0; 79.15 GiB total capacity; 77.01 GiB already allocated)")


def _row(i: int, state: str, message: str | None) -> dict:
    return {"hash": f"{i:x}" * 64, "kind": "pretrain", "name": "pretrain", "state": state, "failure_class": None,
            "attempts": 1, "seconds": 12.0, "heartbeat_at": None, "cells": [f"pe=rope,seed={i}"],
            "axes": {"pe": "rope", "seed": i, "lr": 0.0006, "size": "124M"}, "progress": None,
            "message": message, "node": None}


def _render(width: int) -> str:
    console = Console(width=width, file=io.StringIO(), highlight=False)
    console.print(status_renderable("g", [_row(1, "FAILED", REASON), _row(2, "SUCCEEDED", None)], width=width))
    return console.file.getvalue()


def test_reasons_wrap_under_the_table_at_80_columns() -> None:
    text = _render(80)
    assert "…" not in text
    assert " ".join(text.split()).count(REASON) == 1            # whole, wrapped over lines
    assert max(len(line) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if "state" in line and "hash" in line)
    assert "reason" not in header
    wide = _render(400)                                          # room enough: the reason column
    assert "reason" in next(line for line in wide.splitlines() if "state" in line and "hash" in line)
    assert REASON in wide


def test_output_that_is_not_a_terminal_is_not_cut_at_80_columns(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "sub"
    deep.mkdir(parents=True)
    url = f"sqlite:///{deep / 'none.db'}"
    res = CliRunner().invoke(app, ["status", "g", "--catalog", url], env={"COLUMNS": None})
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and len(lines[0]) > 120
    assert f"there is no catalog at {deep / 'none.db'}" in lines[0]
