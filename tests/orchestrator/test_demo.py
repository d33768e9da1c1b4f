"""The offline demo at a drastically reduced step count: the table lists RoPE, PoPE and TAPA with
accuracies measured from real argmax predictions on the whole test split."""

import re

import pytest
from rich.console import Console

from phaselab.orchestrator.cli.demo import demo_spec, main, render, run_demo


def test_demo_table_reports_measured_accuracies(tmp_path):
    console = Console(record=True, width=120)
    rows = run_demo(steps=3, out_dir=tmp_path / "runs", console=console)
    assert [r.pe for r in rows] == ["rope", "pope", "tapa"]
    for r in rows:
        assert r.n_test == 2000  # the demo's test split, every example scored once
        assert 0.0 <= r.test_acc <= 1.0 and 0.0 <= r.valid_acc <= 1.0
        correct = r.test_acc * r.n_test  # a count of correct argmax predictions
        assert abs(correct - round(correct)) < 1e-6
        assert r.seconds > 0 and r.train_loss > 0
    console.print(render(rows, steps=3))
    out = console.export_text()
    assert re.search(r"\b3\s+steps", out) and "3/3" in out  # the table and the finished progress bars
    for r in rows:
        line = next(line for line in out.splitlines() if re.search(rf"\b{r.pe}\b.*%", line))
        test_pct, valid_pct = (float(v) for v in re.findall(r"(\d+\.\d) %", line))
        assert test_pct == pytest.approx(round(100 * r.test_acc, 1))
        assert valid_pct == pytest.approx(round(100 * r.valid_acc, 1))


def test_demo_cli_rejects_bad_steps():
    with pytest.raises(SystemExit):
        main(["--steps", "0"])


def test_demo_runs_the_grids_configuration_with_its_stated_changes():
    """The demo's spec is the shipped grid's training config plus DEMO: the grid's optimiser
    settings reach it, and the changes are the documented ones."""
    spec = demo_spec("tapa", steps=40)
    model, train, data = spec["model"], spec["train"], spec["data"]
    assert (model["n_layer"], model["d_model"], model["n_head"], model["pe"]["kind"]) == (2, 64, 4, "tapa")
    assert (train["steps"], train["decay_steps"], train["warmup"], train["batch_size"]) == (40, 40, 2, 64)
    assert (train["beta2"], train["weight_decay"], train["lr"]) == (0.99, 0.01, 3e-3)
    assert (data["block_size"], model["block_size"], data["ii"]["n_max"]) == (24, 24, 12)
    assert demo_spec("rope", short=False)["data"]["block_size"] == 48
