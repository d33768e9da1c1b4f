"""What the CLI shows: plan rows and tree, status, the results table and ``why`` explanations.
Plain data first (for ``--json``), rich rendering second."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from phaselab.orchestrator.cli.timing import (
    PHASES,
    Recorded,
    dag_models,
    efficiency,
    efficiency_line,
    model_key,
    packed_seconds,
    stage_tokens,
)
from phaselab.orchestrator.plan.dag import Dag
from phaselab.orchestrator.plan.hashing import explain_parts
from phaselab.orchestrator.stages import STAGES

PLAN_STATUS = {"SUCCEEDED": "cached", "RUNNING": "running", "FAILED": "failed", "BLOCKED": "blocked",
               "CANCELLED": "cancelled", "READY": "will run", "PLANNED": "will run"}
STYLE = {"cached": "green", "succeeded": "green", "running": "yellow", "will run": "cyan",
         "failed": "red", "blocked": "magenta", "cancelled": "dim"}


def one_training_run(kind: str, config: Mapping[str, Any]) -> bool:
    """Whether a stage of ``kind`` is exactly one training run (``Stage.training_spec``): its
    tokens and GPU time describe one model's throughput."""
    stage = STAGES.get(kind)
    return stage is not None and stage.training_spec(config) is not None


def measured_throughput(rows: Iterable[Any]) -> dict[str, float]:
    """model config -> tokens per GPU-second, from SUCCEEDED training stages with GPU time."""
    out: dict[str, list[float]] = {}
    for r in rows:
        tok, key = stage_tokens(r.config), model_key(r.config)
        if r.state == "SUCCEEDED" and one_training_run(r.kind, r.config) and tok and key and r.gpu_seconds:
            out.setdefault(key, []).append(tok / r.gpu_seconds)
    return {k: sum(v) / len(v) for k, v in out.items()}


def env_differences(stored: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> list[str]:
    """Package and Python versions that differ between a stored fingerprint and ``now`` (the
    code itself is in the key; these are what a cache hit silently carries over, DESIGN §5.4)."""
    if not stored or not now:
        return []
    out = []
    if stored.get("python") != now.get("python"):
        out.append(f"python {stored.get('python')} -> {now.get('python')}")
    old, new = stored.get("packages") or {}, now.get("packages") or {}
    out += [f"{k} {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return out


def plan_rows(dag: Dag, rows: Mapping[str, Any], all_rows: Iterable[Any] = (),
              env_now: Mapping[str, Any] | None = None, recorded: Recorded | None = None) -> list[dict[str, Any]]:
    """One dict per node: status vs the catalog (``rows``: hash -> StageRow of any grid), a
    GPU-hour estimate from measured throughput of the same model config where known, for stages
    still to run the seconds they should take (``seconds_est``: from ``recorded``, what earlier
    stages of the catalog took; None when nothing comparable was recorded), and for cache hits
    the environment differences (``env_now``: this machine's fingerprint)."""
    tput = measured_throughput(all_rows)
    models = dag_models(dag) if recorded is not None else {}
    out = []
    for h, node in dag.nodes.items():
        row = rows.get(h)
        status = PLAN_STATUS[row.state] if row is not None else "will run"
        est: float | None = None
        training = one_training_run(node.kind, node.config)
        if training and node.resources.gpus == 0:
            est = 0.0
        elif training and stage_tokens(node.config) and model_key(node.config) in tput:
            est = stage_tokens(node.config) / tput[model_key(node.config)] / 3600.0
        out.append({"hash": h, "kind": node.kind, "name": node.name, "label": node.label, "status": status,
                    "training": training,
                    "failure_class": row.failure_class if row is not None else None,
                    "cells": [c for c, _ in node.members], "upstream": dict(node.upstream),
                    "gpu_hours_est": est, "launcher": node.launcher,
                    "seconds_est": recorded.estimate(node.kind, node.config, models[h])
                    if recorded is not None and status != "cached" else None,
                    "env_differs": env_differences(row.env, env_now) if status == "cached" else [],
                    "resources": {"cpus": node.resources.cpus, "gpus": node.resources.gpus,
                                  "num_workers": node.resources.num_workers,
                                  "gpus_auto": node.resources.gpus_auto, "gpus_why": node.resources.gpus_why}})
    return out


def render_plan(console: Any, dag: Dag, prow: list[dict[str, Any]],
                time_estimate: Mapping[str, Any] | None = None) -> None:
    from rich.markup import escape
    from rich.tree import Tree

    from phaselab.orchestrator.engine.progress import fmt_duration

    by_hash = {r["hash"]: r for r in prow}
    children: dict[str, list[str]] = {}
    for r in prow:
        for up in r["upstream"].values():
            children.setdefault(up, []).append(r["hash"])
    tree = Tree(f"[bold]{dag.spec.grid}[/] — {len(dag.cells)} cells, {len(prow)} stages "
                f"(code {dag.code.digest[:12]})")

    def label(r: dict[str, Any]) -> str:
        from rich.markup import escape

        est = r["gpu_hours_est"]
        est_s = "" if not r["training"] else (
            " ~? GPU-h" if est is None else " CPU" if r["resources"]["gpus"] == 0 else f" ~{est:.2f} GPU-h")
        if r.get("seconds_est") is not None:
            est_s += f" ~{fmt_duration(r['seconds_est'])}"
        status = r["status"] + (f"({r['failure_class']})" if r["failure_class"] and r["status"] == "failed" else "")
        env = f" [yellow]env differs: {escape(', '.join(r['env_differs']))}[/]" if r["env_differs"] else ""
        return (f"[{STYLE.get(r['status'], 'white')}]{status:<9}[/] {r['kind']:<8} {escape(r['label'])} "
                f"[dim]{r['hash'][:12]}{est_s}[/]{env}")

    def add(node: Any, h: str) -> None:
        branch = node.add(label(by_hash[h]))
        for c in children.get(h, []):
            add(branch, c)

    for r in prow:
        if not r["upstream"]:
            add(tree, r["hash"])
    console.print(tree)
    counts: dict[str, int] = {}
    for r in prow:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    total = [r["gpu_hours_est"] for r in prow if r["training"] and r["status"] != "cached"]
    known = sum(e for e in total if e is not None)
    unknown = sum(1 for e in total if e is None)
    est = f"~{known:.2f} GPU-h" if known or not unknown else "GPU-hours unknown"
    console.print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f"; to run: {est}"
                  + (f" (+ {unknown} training stages with no measured throughput yet)" if unknown else ""))
    for line in auto_gpu_lines(prow):
        console.print(escape(line), highlight=False)
    if time_estimate:
        console.print(escape(time_estimate_line(time_estimate)), highlight=False)


def auto_gpu_lines(prow: list[dict[str, Any]]) -> list[str]:
    """What ``resources.gpus: auto`` gave the stages that get a GPU by it, one line per
    (fraction, reason): ``resources.gpus auto: 6 stage(s) get 0.25 GPU (~3.3 GiB estimated of
    the 140 GiB NVIDIA H200: 4 per GPU (at most))``."""
    groups: dict[tuple[float, str], int] = {}
    for r in prow:
        res = r["resources"]
        if res.get("gpus_auto") and res["gpus"] > 0:
            groups[(res["gpus"], res["gpus_why"])] = groups.get((res["gpus"], res["gpus_why"]), 0) + 1
    return [f"resources.gpus auto: {n} stage(s) get {gpus:g} GPU ({why})" for (gpus, why), n in groups.items()]


def time_estimate(dag: Dag, prow: list[dict[str, Any]], capacity: Mapping[str, float] | None,
                  recorded: Recorded | None) -> dict[str, Any] | None:
    """The grid's time to run from the stages' ``seconds_est``: one at a time (``sequential_s``)
    and as the controller would pack them on ``capacity`` ({"CPU", "GPU"} of the cluster `run`
    would use; ``packed_s`` None when unknown), over the stages with an estimate; how many
    stages still to run have none and how many recorded stages the estimates come from. None
    when nothing is to run."""
    todo = [r for r in prow if r["status"] != "cached"]
    if not todo or recorded is None:
        return None
    est = {r["hash"]: r["seconds_est"] for r in todo if r["seconds_est"] is not None}
    return {"sequential_s": sum(est.values()) if est else None, "stages": len(est),
            "packed_s": packed_seconds(dag.nodes, est, capacity) if est and capacity else None,
            "unknown": len(todo) - len(est), "capacity": dict(capacity) if capacity else None,
            "recorded_from": recorded.sources}


def time_estimate_line(t: Mapping[str, Any]) -> str:
    """``time to run: ~3m05s one stage at a time, ~1m40s on the local cluster (2 CPUs, 0 GPUs)
    (8 stages; from 12 stages this catalog recorded, same kind and model)``."""
    from phaselab.orchestrator.engine.progress import fmt_duration

    if not t["stages"]:
        return (f"time to run: unknown (this catalog has recorded no stage of the same kind and model as the "
                f"{t['unknown']} to run)")
    cap = t["capacity"]
    packed = (f", ~{fmt_duration(t['packed_s'])} on the local cluster ({cap.get('CPU', 0):g} CPUs, "
              f"{cap.get('GPU', 0):g} GPUs)" if t["packed_s"] is not None else "")
    rest = f"; {t['unknown']} stage(s) with nothing comparable recorded, not counted" if t["unknown"] else ""
    return (f"time to run: ~{fmt_duration(t['sequential_s'])} one stage at a time{packed} ({t['stages']} "
            f"stage(s); estimated from {t['recorded_from']} stage(s) this catalog recorded, same kind and "
            f"model){rest}")


def _elapsed(started: Any, finished: Any) -> float | None:
    """Seconds from ``started`` to ``finished`` (now when None); catalog times are UTC."""
    from datetime import UTC, datetime

    if started is None:
        return None
    end = finished or datetime.now(UTC)
    if (started.tzinfo is None) != (end.tzinfo is None):
        started, end = started.replace(tzinfo=UTC), end.replace(tzinfo=UTC)
    return max(0.0, (end - started).total_seconds())


def status_rows(rows: Iterable[Any], cells: Mapping[str, list[Mapping[str, Any]]] | None = None,
                times: Mapping[str, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """One dict per stage row, ordered by cell: state, attempts, seconds (elapsed while RUNNING),
    the Ray node of its latest attempt,
    the cells it belongs to (``cells``: hash -> ``store.cells_for_stage`` rows of this grid) with
    the first one's axis values, training progress while it runs (``progress.read_progress``),
    the first line of its message (the failure reason of FAILED / BLOCKED stages), whether it
    held a GPU and, for a finished training stage, where its time went (``times``: hash -> its
    ``time/*`` metrics, ``store.reads.final_metrics``; ``timing.stage_times``)."""
    from phaselab.orchestrator.cli.timing import stage_times
    from phaselab.orchestrator.engine.controller import owner_is_dead
    from phaselab.orchestrator.engine.progress import read_progress, total_steps

    out = []
    for i, r in enumerate(rows):
        member = sorted((cells or {}).get(r.stage_hash, []), key=lambda c: c["cell_id"])
        running, state, msg = r.state == "RUNNING", r.state, (r.message or "").strip()
        if running and owner_is_dead(getattr(r, "owner", None)):
            # its controller process is gone (killed): not running, though the row says so
            # until a controller reclaims it; the clock stops at its last heartbeat
            running, state = False, "INTERRUPTED"
            msg = f"controller gone ({r.owner}); `phaselab resume` continues it"
        prog = read_progress(r.storage_uri, total_steps(r.config)) if running else None
        out.append({"hash": r.stage_hash, "kind": r.kind, "name": r.name, "state": state,
                    "failure_class": r.failure_class, "attempts": r.attempts,
                    "seconds": _elapsed(r.started_at, r.finished_at or (r.heartbeat_at if state == "INTERRUPTED"
                                                                           else None))
                    if (r.finished_at or running or state == "INTERRUPTED") else None,
                    "heartbeat_at": r.heartbeat_at.isoformat() if r.heartbeat_at else None,
                    "cells": [c["cell_key"] for c in member], "axes": dict(member[0]["axes"]) if member else {},
                    "progress": prog, "message": msg.splitlines()[0][:300] if msg else None,
                    "node": getattr(r, "node_id", None), "gpu": bool(getattr(r, "gpu_seconds", None)),
                    "_order": (member[0]["cell_id"] if member else 1 << 62, i)})
    for row in out:
        done = row["state"] == "SUCCEEDED"
        row["times"] = stage_times(row["seconds"], (times or {}).get(row["hash"])) if done else None
    out.sort(key=lambda r: r.pop("_order"))
    return out


def render_status(console: Any, grid: str, srows: list[dict[str, Any]], *, times: bool = False) -> None:
    console.print(times_renderable(grid, srows) if times else status_renderable(grid, srows, width=console.width))


def _pending(srows: list[dict[str, Any]]) -> bool:
    return any(r["state"] in ("PLANNED", "READY", "RUNNING") for r in srows)


def show_status(console: Any, grid: str, rows: Callable[[], list[dict[str, Any]]], *, watch: bool,
                times: bool = False) -> None:
    """``status`` on ``console``: the table once, or with ``watch`` refreshed (``rows()`` re-read)
    until nothing is pending: live in a terminal, else printed anew when a state or step changed,
    at most every 10 s (a log). ``times``: the time-breakdown table instead (``--times``)."""
    srows = rows()
    if not (watch and _pending(srows)):
        render_status(console, grid, srows, times=times)
        return
    if not console.is_terminal:
        shown = None
        while True:
            key = [(r["state"], (r["progress"] or {}).get("step")) for r in srows]
            if key != shown:
                render_status(console, grid, srows, times=times)
                shown = key
            if not _pending(srows):
                return
            time.sleep(10.0)
            srows = rows()
    from rich.live import Live

    def view(srows: list[dict[str, Any]]) -> Any:
        return times_renderable(grid, srows) if times else status_renderable(grid, srows, width=console.width)

    with Live(view(srows), console=console, refresh_per_second=1) as live:
        while _pending(srows):
            time.sleep(2.0)
            srows = rows()
            live.update(view(srows))


# A reason column narrower than this reads as "Tr…": the reasons go under the table instead.
MIN_REASON_WIDTH = 40


def _below(cols: list[str], cells: list[dict[str, str]], width: int | None) -> bool:
    """Whether the reasons go under the table: the other columns leave them under
    MIN_REASON_WIDTH of a ``width``-column console (None: room enough)."""
    from rich.text import Text

    if width is None or "reason" not in cols:
        return False
    fixed = sum(3 + max([len(c), *(len(Text.from_markup(row[c]).plain) for row in cells)])
                for c in cols if c != "reason")
    return fixed + 4 + MIN_REASON_WIDTH > width


def status_renderable(grid: str, srows: list[dict[str, Any]], width: int | None = None) -> Any:
    """The status table (stage, axis values, state, step progress, loss, time, ETA, hash, reason)
    over a grid progress bar with counts and the grid's ETA. ``width``: the console's columns;
    when the reasons would be squeezed below MIN_REASON_WIDTH they are listed, wrapped, under
    the table (hash and reason), never cut."""
    from rich.console import Group
    from rich.markup import escape
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    from phaselab.orchestrator.engine.progress import fmt_duration, fmt_step

    axes = list(dict.fromkeys(k for r in srows for k in r["axes"]))
    done = sum(1 for r in srows if r["state"] == "SUCCEEDED")
    cells = []
    for r in srows:
        # FAILED(oom); READY(hung): waiting for a retry after that class of failure
        state = r["state"] + (f"({r['failure_class']})" if r["failure_class"] and r["state"] in ("FAILED", "READY")
                              else "") + (f" #{r['attempts']}" if r["attempts"] > 1 else "")
        style = {"SUCCEEDED": "green", "RUNNING": "yellow", "FAILED": "red", "BLOCKED": "magenta"}.get(r["state"], "")
        p = r["progress"] or {}
        name = (r["name"] or "") + (f" (+{len(r['cells']) - 1} cells)" if len(r["cells"]) > 1 else "")
        reason = r["message"] if r["state"] not in ("SUCCEEDED", "RUNNING") else ""
        cells.append({"stage": escape(name), **{a: escape(str(r["axes"].get(a, ""))) for a in axes},
                      "state": f"[{style}]{escape(state)}[/]" if style else escape(state), "step": fmt_step(p or None),
                      "loss": "" if p.get("loss") is None else f"{p['loss']:.4f}", "time": fmt_duration(r["seconds"]),
                      "ETA": fmt_duration(p.get("eta_s")), "train%": _train_share(r.get("times")),
                      "node": (r.get("node") or "")[:12],
                      "hash": r["hash"][:12], "reason": escape(reason or "")})
    table = Table(title=f"{escape(grid)}: {done}/{len(srows)} stages succeeded")
    # columns nobody has a value for (no stage running, none failed) are left out, and the Ray
    # node (of the latest attempt) unless the stages ran on more than one
    multi_node = len({row["node"] for row in cells if row["node"]}) > 1
    cols = [c for c in ("stage", *axes, "state", "step", "loss", "time", "train%", "ETA", "node", "hash", "reason")
            if c in ("stage", "state", "hash") or (c == "node" and multi_node)
            or (c != "node" and any(row[c] for row in cells))]
    below = [(row["hash"], row["reason"]) for row in cells if row["reason"]] if _below(cols, cells, width) else []
    if below:
        cols.remove("reason")
    for col in cols:
        table.add_column(col, justify="right" if col in ("step", "loss", "time", "train%", "ETA") else "left",
                         no_wrap=col != "reason", min_width=None if col == "reason" else
                         max((len(row[col]) for row in cells if "[" not in row[col]), default=0) or None)
    for row in cells:
        table.add_row(*(row[c] for c in cols))
    counts: dict[str, int] = {}
    for r in srows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    line = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
    eta = eta_seconds(srows)
    if eta is not None:
        line += f"; ETA ~{fmt_duration(eta)}"
    foot = Table.grid(padding=(0, 1))
    foot.add_row(ProgressBar(total=max(len(srows), 1), completed=done, width=40), escape(line))
    eff = efficiency_line(efficiency(srows))
    return Group(table, *(f"[dim]{h}[/] {reason}" for h, reason in below), foot,
                 *([escape(eff)] if eff else []))


def _train_share(times: Mapping[str, float] | None) -> str:
    """A finished training stage's training-step time as a share of its wall time."""
    return f"{100 * times['train'] / times['wall']:.0f}%" if times and times["wall"] > 0 else ""


def times_renderable(grid: str, srows: list[dict[str, Any]]) -> Any:
    """``status --times``: where each finished training stage's wall time went (start-up, then
    the loop's phases, in seconds) and its training-step share, over the grid's GPU efficiency.
    Phase columns no stage spent 0.05 s in are left out."""
    from rich import box
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    timed = [r for r in srows if r.get("times")]
    # axes with one value over these stages say nothing here (the title is the grid)
    axes = [a for a in dict.fromkeys(k for r in timed for k in r["axes"])
            if len({str(r["axes"].get(a)) for r in timed}) > 1]
    phases = [p for p in ("wall", "startup", *PHASES) if p == "wall" or any(r["times"][p] >= 0.05 for r in timed)]
    table = Table(title=f"{escape(grid)}: where the time went, seconds ({len(timed)} training stages)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("stage", *axes):
        table.add_column(col, no_wrap=True)
    for p in (*phases, "train%"):
        table.add_column("start" if p == "startup" else p, justify="right", no_wrap=True)
    for r in timed:
        t = r["times"]
        table.add_row(escape(r["name"] or ""), *(escape(str(r["axes"].get(a, ""))) for a in axes),
                      *(f"{t[p]:.1f}" if t[p] < 100 else f"{t[p]:.0f}" for p in phases), _train_share(t))
    eff = efficiency_line(efficiency(srows))
    return Group(table, *([escape(eff)] if eff else ["no finished stage yet"]))


def render_failures(console: Any, grid: str, failures: list[Mapping[str, Any]], total: int) -> None:
    """The closing summary of ``run``/``resume``: every stage that did not succeed, with why."""
    from rich.markup import escape

    if not failures:
        return
    console.print(f"[red]{escape(grid)}: {len(failures)} of {total} stages did not succeed:[/]")
    for f in failures:
        first = (f["message"] or "").strip().splitlines()
        why = f"{f['class']}: {first[0][:300]}" if f["class"] and first else (first[0][:300] if first else f["class"])
        console.print(f"  [red]{f['state']:<9}[/] {escape(f['label'])} [dim]{f['hash'][:12]}[/] {escape(why or '')}",
                      highlight=False)


def eta_seconds(srows: list[dict[str, Any]]) -> float | None:
    """Remaining time: running training stages by their own reported rate, other pending stages
    x the mean duration of finished stages of their kind, spread over the stages running now (at
    least one). None when nothing is known."""
    means: dict[str, list[float]] = {}
    for r in srows:
        if r["state"] == "SUCCEEDED" and r["seconds"] is not None:
            means.setdefault(r["kind"], []).append(r["seconds"])
    pending = [r for r in srows if r["state"] in ("PLANNED", "READY", "RUNNING")]
    own = [r for r in pending if (r.get("progress") or {}).get("eta_s") is not None]
    if not pending or (not means and len(own) < len(pending)):
        return None
    overall = sum(sum(v) for v in means.values()) / sum(len(v) for v in means.values()) if means else 0.0
    work = sum(r["progress"]["eta_s"] for r in own)
    work += sum(sum(means[r["kind"]]) / len(means[r["kind"]]) if r["kind"] in means else overall
                for r in pending if r not in own)
    return work / max(1, sum(1 for r in srows if r["state"] == "RUNNING"))


def results_table(frame: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Pivot the catalog's long metrics into (columns, rows): one row per (cell, stage); columns
    ``ppl@<ctx>`` for evals and ``<split>/<name>`` for training (final values)."""
    cols: list[str] = []
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for m in frame:
        if m["name"] not in ("ppl", "acc", "loss"):
            continue
        stage = STAGES.get(m["stage_kind"])
        if stage is not None and stage.scores:
            col = m["name"] + (f"@{m['context_len']}" if m["context_len"] else "") + (
                f"[{m['task']}]" if m["name"] == "acc" and m["task"] else "")
        else:
            col = f"{m['split']}/{m['name']}" if m["split"] else m["name"]
        if col not in cols:
            cols.append(col)
        row = rows.setdefault((m["cell_key"], m["role"] or m["stage_name"]),
                              {"cell": m["cell_key"], "stage": m["role"] or m["stage_name"],
                               "kind": m["stage_kind"], "hash": m["stage_hash"]})
        row[col] = m["value"]
    ctx_cols = sorted((c for c in cols if "@" in c), key=lambda c: (c.split("@")[0], int(c.split("@")[1].split("[")[0])))
    cols = [c for c in cols if "@" not in c] + ctx_cols
    return cols, list(rows.values())


def render_results(console: Any, grid: str, cols: list[str], rows: list[dict[str, Any]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{grid}: results from the catalog")
    for c in ("cell", "stage", *cols):
        table.add_column(c, justify="right" if c in cols else "left", no_wrap=c == "cell")
    for r in rows:
        table.add_row(escape(r["cell"]), r["stage"], *("" if r.get(c) is None else f"{r[c]:.4g}" for c in cols))
    console.print(table)


def explain(target: Mapping[str, Any], target_modules: Mapping[str, str], candidates: Iterable[Any],
            *, role: str | None = None) -> dict[str, Any]:
    """Compare a stage's key parts with the closest stored stage of the same kind: fewest
    differences first, then same role (stage name), then SUCCEEDED first."""
    best = None
    for r in candidates:
        stored = r.cache_key_parts or {}
        parts, mods = stored.get("parts", stored), stored.get("code_modules", {})
        lines = explain_parts(target, parts, target_modules, mods)
        rank = (len(lines), r.name != role, r.state != "SUCCEEDED")
        if best is None or rank < best[0]:
            best = (rank, r, lines)
    if best is None:
        return {"closest": None, "differences": [], "note": "no stored stage of this kind"}
    _, r, lines = best
    return {"closest": {"hash": r.stage_hash, "name": r.name, "state": r.state}, "differences": lines}


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)
