"""Live progress of a running grid: what each running stage's training loop reports, the live
table ``phaselab run`` shows, and the per-stage progress ``phaselab status`` adds to its rows.

Where progress comes from (no new channel to the controller): the stage's per-step log in its
run folder (``run_folder.STEPS_FILE``, which every training stage writes at each log step under
either launcher), whose last ``train/loss`` line gives the step, loss, tokens/s and steps/s of the
last log window, and the file's modification time its age. The total number of steps always
comes from the stage's config (``train.steps``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import run_folder


def read_progress(out_dir: str | Path | None, total_steps: int | None) -> dict[str, Any] | None:
    """``{"step", "steps", "loss", "tokens_per_s", "steps_per_s", "eta_s", "age_s"}`` of the stage
    whose run folder is ``out_dir``, or None when it has reported no training step yet.
    ``eta_s`` is the remaining steps at the last window's rate (None before a rate is known);
    ``age_s`` the seconds since the report was written."""
    if not out_dir:
        return None
    line = run_folder.last_step(out_dir)
    if line is None:
        return None
    try:
        written = run_folder.steps_path(out_dir).stat().st_mtime
    except OSError:
        return None
    raw = {"step": line.get("step"), "loss": line.get("train/loss"),
           "tokens_per_s": line.get("train/tokens_per_s"), "steps_per_s": line.get("train/steps_per_s")}
    step = int(raw.get("step") or 0)
    steps = int(total_steps or raw.get("steps") or 0) or None
    rate = raw.get("steps_per_s")
    eta = (steps - step) / rate if steps and rate else None
    return {"step": step, "steps": steps, "loss": raw.get("loss"), "tokens_per_s": raw.get("tokens_per_s"),
            "steps_per_s": rate, "eta_s": None if eta is None else max(0.0, eta),
            "age_s": max(0.0, time.time() - written)}


def total_steps(config: Mapping[str, Any]) -> int | None:
    train = config.get("train") if isinstance(config, Mapping) else None
    return int(train["steps"]) if isinstance(train, Mapping) and train.get("steps") else None


def fmt_duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h04m``; empty for None."""
    if seconds is None:
        return ""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


def fmt_step(p: Mapping[str, Any] | None) -> str:
    if not p:
        return ""
    if not p.get("steps"):
        return str(p["step"])
    return f"{p['step']}/{p['steps']} ({100 * p['step'] / p['steps']:.0f}%)"


class RunView:
    """What ``phaselab run`` shows while the controller works: with a terminal, a live table of
    the running stages (axis values, step/total, loss, tokens/s, elapsed, ETA) over a grid progress
    bar, with the stage events printed above it; without one (CI logs, pipes), the event lines and
    every ``plain_every_s`` one progress line per running training stage. ``event`` is the
    controller's ``on_event``; the table is refreshed from another thread, hence the lock."""

    def __init__(self, dag: Any, console: Any, *, live: bool | None = None, plain_every_s: float = 30.0) -> None:
        self.dag, self.console = dag, console
        self.live = console.is_terminal if live is None else live
        self.plain_every_s = plain_every_s
        self.axes = list(dict.fromkeys(k for c in dag.cells for k in c.axes))
        self.states: dict[str, str] = {}
        self.running: dict[str, tuple[float, str]] = {}   # hash -> (started, out_dir)
        self.durations: dict[str, list[float]] = {}       # kind -> seconds of stages finished here
        self._lock = threading.Lock()
        self._live: Any = None
        self._stop = threading.Event()
        self._last_plain = time.monotonic()
        self.started = time.monotonic()

    def start(self, states: Mapping[str, str], runs_root: Path) -> None:
        """Begin showing the grid; ``states``: hash -> catalog state of every node now."""
        self.states = dict(states)
        self.runs_root = Path(runs_root)
        self._stop = threading.Event()
        if not self.live:   # progress lines also while no stage event comes (a long pretrain)
            self._ticker = threading.Thread(target=self._tick_until_stopped, daemon=True, name="phaselab-progress")
            self._ticker.start()
        else:
            from rich.live import Live

            self._live = Live(console=self.console, get_renderable=self.renderable, refresh_per_second=2,
                              transient=False, redirect_stdout=True, redirect_stderr=True)
            self._live.start()

    def _tick_until_stopped(self) -> None:
        while not self._stop.wait(self.plain_every_s):
            self.plain_tick()

    def stop(self) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def event(self, kind: str, node: Any, detail: str) -> None:
        from rich.markup import escape

        now = time.monotonic()
        with self._lock:
            if kind == "started":
                self.running[node.hash] = (now, str(self.runs_root / node.hash))
                self.states[node.hash] = "RUNNING"
            elif kind in ("succeeded", "failed", "retrying", "cancelled", "skipped"):
                began = self.running.pop(node.hash, (None, None))[0]
                if kind == "succeeded" and began is not None:
                    self.durations.setdefault(node.kind, []).append(now - began)
                self.states[node.hash] = {"succeeded": "SUCCEEDED", "failed": "FAILED", "retrying": "READY",
                                          "cancelled": "CANCELLED", "skipped": "CANCELLED"}[kind]
        style = {"succeeded": "green", "failed": "red", "retrying": "yellow"}.get(kind, "cyan")
        self.console.print(f"[{style}]{kind:<9}[/] {node.kind:<8} {escape(node.label)} [dim]{node.hash[:12]}[/] "
                           f"{escape(detail[:300])}", highlight=False, soft_wrap=not self.live)
        self.plain_tick()

    def plain_tick(self) -> None:
        """Without a terminal: progress lines for the running training stages, at most every
        ``plain_every_s`` (called from the controller's events and by :meth:`poll`)."""
        if self.live or time.monotonic() - self._last_plain < self.plain_every_s:
            return
        self._last_plain = time.monotonic()
        for row in self.rows():
            if row["progress"]:
                self.console.print(f"progress  {row['kind']:<8} {row['label']} step {fmt_step(row['progress'])} "
                                   f"loss {row['progress']['loss'] or float('nan'):.4g} "
                                   f"{fmt_rate(row['progress']['tokens_per_s'])} tok/s "
                                   f"ETA {fmt_duration(row['progress']['eta_s']) or '?'}",
                                   markup=False, highlight=False, soft_wrap=True)
        self.console.print(self.summary_line(), markup=False, highlight=False, soft_wrap=True)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per running stage: node fields, axis values, elapsed seconds and progress."""
        now = time.monotonic()
        with self._lock:
            running = dict(self.running)
        out = []
        for h, (began, out_dir) in running.items():
            node = self.dag.nodes[h]
            cell = next(c for c in self.dag.cells if c.key == node.members[0][0])
            out.append({"hash": h, "kind": node.kind, "name": node.name, "label": node.label,
                        "axes": dict(cell.axes), "more_cells": len(node.members) - 1, "elapsed_s": now - began,
                        "progress": read_progress(out_dir, total_steps(node.config))})
        return out

    def counts(self) -> dict[str, int]:
        with self._lock:
            states = list(self.states.values())
        return {s: states.count(s) for s in set(states)}

    def eta_s(self, rows: list[dict[str, Any]]) -> float | None:
        """The grid's remaining time: the running stages' own ETAs plus, for each stage still
        waiting, the mean duration of this run's finished stages of its kind, over the stages
        running at once (at least one). None until some duration is known."""
        with self._lock:
            waiting = [self.dag.nodes[h].kind for h, s in self.states.items() if s in ("PLANNED", "READY")]
            means = {k: sum(v) / len(v) for k, v in self.durations.items()}
        work = 0.0
        for r in rows:
            p = r["progress"]
            if p and p["eta_s"] is not None:
                work += p["eta_s"]
            elif r["kind"] in means:
                work += max(0.0, means[r["kind"]] - r["elapsed_s"])
        if waiting and not means:
            return None
        overall = sum(means.values()) / len(means) if means else 0.0
        work += sum(means.get(k, overall) for k in waiting)
        return work / max(1, len(rows))

    def summary_line(self) -> str:
        counts, total = self.counts(), len(self.dag.nodes)
        done = counts.get("SUCCEEDED", 0)
        eta = self.eta_s(self.rows())
        parts = [f"{self.dag.spec.grid}: {done}/{total} stages done", f"{counts.get('RUNNING', 0)} running"]
        if counts.get("FAILED"):
            parts.append(f"{counts['FAILED']} failed")
        parts.append(f"elapsed {fmt_duration(time.monotonic() - self.started)}")
        if eta is not None:
            parts.append(f"ETA ~{fmt_duration(eta)}")
        return ", ".join(parts)

    def renderable(self) -> Any:
        from rich.console import Group
        from rich.markup import escape
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        rows = self.rows()
        table = Table(title=f"{escape(self.dag.spec.grid)}: running stages", title_justify="left", expand=False)
        for col in ("stage", *self.axes, "step", "loss", "tok/s", "elapsed", "ETA"):
            table.add_column(col, justify="right" if col in ("step", "loss", "tok/s", "elapsed", "ETA") else "left",
                             no_wrap=True)
        for r in rows:
            p = r["progress"] or {}
            name = r["name"] + (f" (+{r['more_cells']} cells)" if r["more_cells"] else "")
            table.add_row(escape(name), *(escape(str(r["axes"].get(a, ""))) for a in self.axes), fmt_step(p or None),
                          "" if p.get("loss") is None else f"{p['loss']:.4f}", fmt_rate(p.get("tokens_per_s")),
                          fmt_duration(r["elapsed_s"]), fmt_duration(p.get("eta_s")))
        counts = self.counts()
        bar = ProgressBar(total=max(1, len(self.dag.nodes)), completed=counts.get("SUCCEEDED", 0), width=50)
        bar_row = Table.grid(padding=(0, 1))
        bar_row.add_row(bar, escape(self.summary_line()))
        return Group(table, bar_row)


def failure_rows(dag: Any, summary: Any) -> list[dict[str, Any]]:
    """Every stage of ``dag`` that did not succeed (``summary``: the controller's Summary): state,
    failure class and reason."""
    return [{"hash": h, "kind": dag.nodes[h].kind, "name": dag.nodes[h].name, "label": dag.nodes[h].label,
             "state": summary.states.get(h, ""), "class": cls, "message": msg}
            for h, (cls, msg) in summary.failed.items()]


class Interrupted(Exception):
    """``phaselab run``/``resume`` stopped by Ctrl-C; ``stages`` are the labels of the stages it
    stopped (back to READY, so ``resume`` relaunches them; finished ones stay cached)."""

    def __init__(self, grid: str, stages: list[str]) -> None:
        super().__init__(f"interrupted: {len(stages)} running stage(s) of {grid} stopped")
        self.grid, self.stages = grid, stages

    def advice(self) -> str:
        return (f"interrupted: stopped {len(self.stages)} running stage(s)"
                + (f" ({', '.join(self.stages)})" if self.stages else "")
                + f"; finished stages are kept. Continue with `phaselab resume {self.grid}`")


def stop_running(controller: Any) -> list[str]:
    """After Ctrl-C: cancel this controller's Ray tasks and move every stage it owns from
    RUNNING back to READY (message: how to continue), so that ``status`` shows none RUNNING
    and ``resume`` relaunches them into the same run folders. Returns their labels."""
    grid = controller.dag.spec.grid
    if getattr(controller, "_inflight", None):
        import ray

        for ref in list(controller._inflight):
            ray.cancel(ref, force=True)
        controller._inflight.clear()
    stopped = []
    for row in controller.store.stages_for_grid(controller.grid_id):
        if (row.state == "RUNNING" and row.owner == controller.owner and row.stage_hash in controller.dag.nodes
                and controller.store.transition(
                    row.stage_hash, "READY", expected={"RUNNING"}, failure_class="preemption",
                    message=f"interrupted (Ctrl-C); `phaselab resume {grid}` continues it")):
            stopped.append(controller.dag.nodes[row.stage_hash].label)
    return stopped


def watch_run(controller: Any, view: RunView, notifier: Any, *, live: bool) -> Any:
    """``controller.run()`` shown by ``view`` (when ``live``), then the grid-done notification;
    returns the controller's Summary. Ctrl-C stops the running stages (``stop_running``; a
    second Ctrl-C meanwhile is ignored) and raises :class:`Interrupted`."""
    import signal

    if live:
        rows = controller.store.stages_for_grid(controller.grid_id)
        view.start({r.stage_hash: r.state for r in rows if r.stage_hash in controller.dag.nodes}, controller.runs_root)
    try:
        summary = controller.run()
    except KeyboardInterrupt:
        view.stop()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            raise Interrupted(controller.dag.spec.grid, stop_running(controller)) from None
        finally:
            signal.signal(signal.SIGINT, previous)
    finally:
        view.stop()
    notifier.grid_done(summary.ok, summary.counts(), failure_rows(controller.dag, summary), summary.seconds)
    notifier.close()
    return summary
