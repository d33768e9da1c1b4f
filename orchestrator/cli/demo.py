"""The offline demo: tiny RoPE, PoPE and TAPA models on Indirect Indexing.

    python -m phaselab.orchestrator.cli.demo                 # < 5 min on 2 CPU cores (1200 steps each)
    python -m phaselab.orchestrator.cli.demo --steps 300     # quicker
    python -m phaselab.orchestrator.cli.demo --paper-task    # EXPERIMENTS §2.1 generator (20-40 letters)

Each encoding trains the same tiny transformer: the configuration of the shipped
``pope_indirect_indexing`` grid's training stage with the changes in ``DEMO`` (2 layers, width 64,
4 heads, batch 64, lr 3e-3 → 3e-4), through the one training path (``train.api.run_training``);
the table reports exact-match target accuracy measured on a 2000-example held-out test split
(argmax of the model's logits on the target token, EXPERIMENTS §2.1) — nothing in it is fixed.

Task size: by default the generator is shortened (8-12 letters, shifts ±4, block 24) because at
this model size and budget the paper's generator (20-40 letters, ±15) leaves every encoding at
chance (~2.5 %, measured for 1000 steps of RoPE and PoPE); on the short task all three learn.
Budget: with the default single torch thread the three runs took 247 s in total (73/83/91 s for
RoPE/PoPE/TAPA, 1200 steps each) on the shared 2-core development machine under load ~7, so they
fit in 5 minutes on 2 cores. The paper's
ordering (PoPE 95 % ≫ RoPE 11 %) is a 100k-step, 8-layer result; the tiny table need not match it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import NullTracker

ENCODINGS = ("rope", "pope", "tapa")
DEFAULT_STEPS = 1200
GRID, STAGE = "pope_indirect_indexing", "train"
# What the demo changes in the grid's training config, besides the step count: a 2-layer,
# 64-wide model, a short warm-up and a higher peak lr (tiny models tolerate it; the paper's 2e-4
# needs its 100k steps), evaluation on the test split only, at the end
DEMO = {"model": {"n_layer": 2, "d_model": 64, "n_head": 4},
        "data": {"ii": {"n_valid": 500, "n_test": 2000}},
        "train": {"lr": 3e-3, "min_lr": 3e-4, "eval_every": 0, "eval_batches": 2, "eval_batch_size": 250,
                  "final_eval_splits": ["test"], "cuda_graphs": False}}
# the default short task: 8-12 letters, shifts of +-4, and the block that holds its longest
# example (12 + ",c," + "+4" + ",t" = 19 tokens)
SHORT = {"ii": {"n_min": 8, "n_max": 12, "max_shift": 4}, "block_size": 24}


@dataclass(frozen=True)
class DemoRow:
    pe: str
    test_acc: float
    valid_acc: float
    n_test: int
    train_loss: float
    seconds: float


class ProgressTracker(NullTracker):
    """A Tracker that advances a rich progress task by the steps it is told about."""

    def __init__(self, progress: Any, task: Any) -> None:
        self.progress, self.task, self.last_step = progress, task, 0

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        if step > self.last_step:
            loss = metrics.get("train/loss")
            extra = f"loss {loss:.3f}" if loss is not None else ""
            self.progress.update(self.task, advance=step - self.last_step, info=extra)
            self.last_step = step


def demo_spec(pe: str, *, seed: int = 0, steps: int = DEFAULT_STEPS, short: bool = True) -> dict[str, Any]:
    """The training spec of one demo run: the grid's config with ``DEMO`` (and ``SHORT``)."""
    from phaselab.orchestrator.plan.dag import stage_config
    from phaselab.workloads.config import merge

    config = stage_config(GRID, STAGE, variant="pope", seed=seed)
    spec = merge({k: config[k] for k in ("model", "data", "train")}, DEMO)
    spec["model"]["pe"] = {**spec["model"]["pe"], "kind": pe}
    spec["train"] |= {"steps": steps, "decay_steps": steps, "warmup": max(1, steps // 20),
                      "ckpt_every": steps, "log_every": max(1, steps // 50)}
    if short:
        spec["data"] = merge(spec["data"], SHORT)
        spec["model"]["block_size"] = SHORT["block_size"]
    return spec


def run_demo(*, steps: int = DEFAULT_STEPS, encodings: Sequence[str] = ENCODINGS, seed: int = 0,
             out_dir: Path, console: Any = None, paper_task: bool = False) -> list[DemoRow]:
    """Train one tiny model per encoding and return its measured accuracies."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from phaselab.workloads.train.api import run_training

    rows = []
    columns = (TextColumn("{task.description:>5}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        for pe in encodings:
            task = progress.add_task(pe, total=steps, info="")
            # Evaluation kept cheap (DEMO): valid on 2 x 250 examples at the end of training only,
            # then the reported number on the whole 2000-example test split.
            spec = demo_spec(pe, seed=seed, steps=steps, short=not paper_task)
            t0 = time.perf_counter()
            outcome = run_training(spec, out_dir=Path(out_dir) / pe,
                                   tracker=ProgressTracker(progress, task))
            seconds = time.perf_counter() - t0
            test = next(r for r in outcome.records if r.split == "test" and r.name == "acc")
            rows.append(DemoRow(pe=pe, test_acc=test.value, valid_acc=outcome.metrics["valid/acc"],
                                n_test=int(test.n or 0), train_loss=outcome.metrics["train/loss"],
                                seconds=seconds))
    return rows


def render(rows: Sequence[DemoRow], *, steps: int, paper_task: bool = False) -> Any:
    from rich.table import Table

    task = "paper generator, 20-40 letters" if paper_task else "short, 8-12 letters, shift ±4"
    table = Table(title=f"Indirect Indexing ({task}), 2 layers x 64, {steps} steps (CPU)")
    for name, justify in (("encoding", "left"), ("test acc", "right"), ("valid acc", "right"),
                          ("test n", "right"), ("final train loss", "right"), ("time", "right")):
        table.add_column(name, justify=justify)
    best = max(r.test_acc for r in rows)
    for r in rows:
        acc = f"{100 * r.test_acc:.1f} %"
        table.add_row(r.pe, f"[bold]{acc}[/bold]" if r.test_acc == best else acc,
                      f"{100 * r.valid_acc:.1f} %", str(r.n_test), f"{r.train_loss:.3f}",
                      f"{r.seconds:.0f} s")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    from rich.console import Console

    parser = argparse.ArgumentParser(prog="python -m phaselab.orchestrator.cli.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="optimiser steps per encoding")
    parser.add_argument("--pe", nargs="+", default=list(ENCODINGS), choices=ENCODINGS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paper-task", action="store_true",
                        help="use the EXPERIMENTS §2.1 generator (20-40 letters, shifts ±15)")
    # One intra-op thread by default: the matrices are tiny (width 64), so a second OpenMP thread
    # gains little, and on a busy 2-core machine spinning OpenMP threads made the run >3x slower
    # (measured: 247 s with 1 thread vs. >17 min with 2 under load ~8).
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: a temp folder)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="phaselab-demo-") as tmp:
        rows = run_demo(steps=args.steps, encodings=args.pe, seed=args.seed,
                        out_dir=args.out or Path(tmp), console=console, paper_task=args.paper_task)
    console.print(render(rows, steps=args.steps, paper_task=args.paper_task))
    console.print(f"total {time.perf_counter() - t0:.0f} s; accuracy = argmax on the target token "
                  "over the whole test split")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
