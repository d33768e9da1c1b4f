"""Orchestrator overhead: N no-op stages through phaselab vs the same N trials through a Ray Tune
grid, on one local Ray cluster (DESIGN §5.1-§5.2; target: phaselab no slower than Tune).

phaselab side: ``benchmarks/overhead_grid.yaml`` with the override ``defaults.noop.tag=range(0,N)``
(N cells of one ``noop`` stage, 1 CPU each), a fresh SQLite catalog in a temp dir, the real
``Controller`` (claim -> Ray task -> runner -> ``finalize_success``), MLflow off. Its wall time
counts catalog creation, planning, submission and the run.

Tune side: ``tune.Tuner`` over a function trainable that reports one metric and returns, with
``tune.grid_search`` over N values, 1 CPU per trial and ``max_concurrent_trials = num_cpus``
(Tune's defaults otherwise, i.e. ``reuse_actors=False``; ``--tune-reuse-actors`` adds a second
Tune run with actor reuse). Its wall time counts ``Tuner(...)`` and ``fit()``.

Launch latency of a phaselab stage = its Ray task start (``running.json`` written first thing by
``runner.execute``) minus its claim (``stage.started_at`` in the catalog). ``--profile`` runs the
phaselab side once more under cProfile and splits the controller's time into catalog
transactions, Ray calls and polling sleeps.

Run (2 cores):  .venv/bin/python benchmarks/orchestrator_overhead.py --stages 200 --write
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "benchmarks" / "overhead_grid.yaml"
RESULTS = ROOT / "benchmarks" / "results"


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def run_phaselab(n: int, workdir: Path, *, sleep_s: float = 0.0) -> dict[str, Any]:
    """Catalog + plan + submit + run of the N-stage noop grid; checks every stage SUCCEEDED."""
    from phaselab.catalog.store.api import CatalogStore
    from phaselab.orchestrator.engine.controller import Controller
    from phaselab.orchestrator.plan.dag import build_dag, load_grid

    t0 = time.perf_counter()
    store = CatalogStore(f"sqlite:///{workdir / 'catalog.db'}")
    store.upgrade()
    t1 = time.perf_counter()
    spec, marks, text, resolved = load_grid(GRID, [f"defaults.noop.tag=range(0,{n})",
                                                   f"defaults.noop.sleep_s={sleep_s}"])
    dag = build_dag(spec, marks, yaml_submitted=text, yaml_resolved=resolved)
    t2 = time.perf_counter()
    controller = Controller(store, dag, runs_root=workdir / "runs", fixed_cluster=True)
    controller.submit()
    t3 = time.perf_counter()
    summary = controller.run(timeout_s=1800)
    t4 = time.perf_counter()
    if len(dag.nodes) != n or not summary.ok:
        raise RuntimeError(f"phaselab run not clean: {len(dag.nodes)} stages, {summary.counts()}, "
                           f"failed {list(summary.failed.values())[:2]}")
    latencies, turnaround = _stage_timings(store, controller, dag)
    store.dispose()
    return {"wall_s": t4 - t0, "catalog_init_s": t1 - t0, "plan_s": t2 - t1, "submit_s": t3 - t2,
            "run_s": t4 - t3, "stages": len(dag.nodes), "states": summary.counts(),
            "launch_latency_s": latencies, "claim_to_succeeded_s": turnaround}


def _stage_timings(store: Any, controller: Any, dag: Any) -> tuple[list[float], list[float]]:
    """Per stage: claim -> Ray task start, and claim -> SUCCEEDED committed (both wall clock)."""
    latencies, turnaround = [], []
    for h in dag.nodes:
        row = store.get_stage(h)
        started = json.loads((controller.out_dir(h) / "running.json").read_text())["started"]
        latencies.append(started - row.started_at.timestamp())
        turnaround.append((row.finished_at - row.started_at).total_seconds())
    return latencies, turnaround


def run_tune(n: int, workdir: Path, num_cpus: int, *, reuse_actors: bool = False) -> dict[str, Any]:
    """The same N trials as a Ray Tune grid; checks every trial TERMINATED with its metric."""
    from ray import tune

    def _noop_trainable(config: dict[str, Any]) -> None:   # nested: pickled by value for the workers
        tune.report({"i": float(config["i"])})

    t0 = time.perf_counter()
    tuner = tune.Tuner(
        tune.with_resources(_noop_trainable, {"cpu": 1}),
        param_space={"i": tune.grid_search(list(range(n)))},
        tune_config=tune.TuneConfig(max_concurrent_trials=num_cpus, reuse_actors=reuse_actors),
        run_config=tune.RunConfig(name="overhead", storage_path=str(workdir / "tune"), verbose=0))
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    got = sorted(int(r.metrics["i"]) for r in grid if r.error is None and "i" in r.metrics)
    if len(grid) != n or got != list(range(n)):
        raise RuntimeError(f"tune run not clean: {len(grid)} trials, {len(got)} with their metric, "
                           f"{grid.num_errors} errors")
    return {"wall_s": wall, "trials": len(grid), "reuse_actors": reuse_actors}


def profile_phaselab(n: int, workdir: Path) -> dict[str, float]:
    """One more phaselab run under cProfile: the controller's seconds (submit + run) by category,
    from the cumulative time of the calls made from orchestrator/engine/controller.py."""
    prof = cProfile.Profile()
    prof.enable()
    res = run_phaselab(n, workdir)
    prof.disable()
    stats = pstats.Stats(prof).stats   # func -> (cc, nc, tt, ct, callers)
    cats = {"catalog_transactions_s": 0.0, "ray_calls_s": 0.0, "poll_sleep_s": 0.0}
    for (file, _, name), (_, _, _, _, callers) in stats.items():
        from_controller = sum(c[3] for (cf, _, _), c in callers.items() if cf.endswith("orchestrator/engine/controller.py"))
        if file.endswith(("catalog/store/api.py", "catalog/store/queries.py")):
            cats["catalog_transactions_s"] += from_controller
        elif "/ray/" in file:   # ray.wait/get/cluster_resources/.remote (through Ray's wrappers)
            cats["ray_calls_s"] += from_controller
        elif name == "<built-in method time.sleep>":
            cats["poll_sleep_s"] += from_controller
    # calls from controller.py happen in submit() and run(); the rest is the controller's own Python
    cats["other_s"] = res["submit_s"] + res["run_s"] - sum(cats.values())
    cats["controller_submit_plus_run_s"] = res["submit_s"] + res["run_s"]
    cats["wall_s_under_profile"] = res["wall_s"]
    return cats


def summarize(ph: list[dict[str, Any]], tu: list[dict[str, Any]], tu_reuse: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats, the ratio, and launch-latency percentiles over all phaselab stages."""
    ph_wall = statistics.median(r["wall_s"] for r in ph)
    lat = [x for r in ph for x in r["launch_latency_s"]]
    turn = [x for r in ph for x in r["claim_to_succeeded_s"]]
    out = {"phaselab_wall_s": ph_wall, "target_ratio": 1.0,
           "phaselab_run_only_s": statistics.median(r["run_s"] for r in ph),
           "launch_latency_p50_s": percentile(lat, 50), "launch_latency_p95_s": percentile(lat, 95),
           "claim_to_succeeded_p50_s": percentile(turn, 50), "claim_to_succeeded_p95_s": percentile(turn, 95)}
    if tu:
        tu_wall = statistics.median(r["wall_s"] for r in tu)
        out |= {"tune_wall_s": tu_wall, "ratio_phaselab_over_tune": ph_wall / tu_wall,
                "meets_target": ph_wall / tu_wall <= 1.0}
    if tu_reuse:
        reuse_wall = statistics.median(r["wall_s"] for r in tu_reuse)
        out |= {"tune_reuse_actors_wall_s": reuse_wall, "ratio_phaselab_over_tune_reuse_actors": ph_wall / reuse_wall}
    return out


def machine() -> dict[str, Any]:
    return {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {p: metadata.version(p) for p in ("ray", "sqlalchemy")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=200)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tune-reuse-actors", action="store_true", help="also time Tune with reuse_actors=True")
    ap.add_argument("--no-tune-default", action="store_true",
                    help="skip Tune with its defaults (a fresh actor per trial: ~10 min for 200 on 2 cores)")
    ap.add_argument("--profile", action="store_true", help="one more phaselab run under cProfile")
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/orchestrator-overhead.{json,md}")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.no_tune_default and not args.tune_reuse_actors:
        raise ValueError("--no-tune-default needs --tune-reuse-actors (nothing to compare with)")
    if args.stages < 1 or args.num_cpus < 1 or args.repeats < 1:
        raise ValueError(f"--stages/--num-cpus/--repeats must be >= 1, got {args.stages}/{args.num_cpus}/{args.repeats}")
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    load_before = os.getloadavg()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        ray.get([ray.remote(lambda: None).remote() for _ in range(2 * args.num_cpus)])   # warm workers
        ph, tu, tu_reuse, prof = [], [], [], None
        with tempfile.TemporaryDirectory(prefix="phaselab-overhead-") as tmp:
            for k in range(args.repeats):   # alternate which side goes first
                sides = [("phaselab", ph)] + ([] if args.no_tune_default else [("tune", tu)])
                sides += [("tune_reuse", tu_reuse)] if args.tune_reuse_actors else []
                for name, acc in (sides if k % 2 == 0 else sides[::-1]):
                    work = Path(tmp) / f"{name}-{k}"
                    work.mkdir()
                    acc.append(run_phaselab(args.stages, work) if name == "phaselab" else
                               run_tune(args.stages, work, args.num_cpus, reuse_actors=name == "tune_reuse"))
                    print(f"[{k}] {name}: {acc[-1]['wall_s']:.2f} s", file=sys.stderr, flush=True)
            if args.profile:
                (Path(tmp) / "profile").mkdir()
                prof = profile_phaselab(args.stages, Path(tmp) / "profile")
    finally:
        ray.shutdown()
    report = {"summary": summarize(ph, tu, tu_reuse), "profile": prof,
              "config": {"stages": args.stages, "num_cpus": args.num_cpus, "repeats": args.repeats,
                         "tune_reuse_actors": args.tune_reuse_actors, "tune_default": not args.no_tune_default},
              "runs": {"phaselab": [_drop_lists(r) for r in ph], "tune": tu, "tune_reuse_actors": tu_reuse},
              "machine": machine(), "versions": _versions(), "load_avg_before": load_before,
              "load_avg_after": os.getloadavg(),
              "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "command": "python " + " ".join(["benchmarks/orchestrator_overhead.py", *(argv or sys.argv[1:])])}
    print_report(report)
    if args.write:
        write_results(report, args.out)
    return report


def _drop_lists(r: dict[str, Any]) -> dict[str, Any]:
    """A phaselab run without its per-stage lists (kept as percentiles in the summary)."""
    out = {k: v for k, v in r.items() if not isinstance(v, list)}
    for key in ("launch_latency_s", "claim_to_succeeded_s"):
        stem = key.removesuffix("_s")
        out[f"{stem}_p50_s"], out[f"{stem}_p95_s"] = percentile(r[key], 50), percentile(r[key], 95)
        out[f"{stem}_max_s"] = max(r[key])
    return out


def print_report(report: dict[str, Any]) -> None:
    s = report["summary"]
    print(f"phaselab: {s['phaselab_wall_s']:.2f} s for {report['config']['stages']} no-op stages "
          f"(controller run {s['phaselab_run_only_s']:.2f} s)")
    if "tune_wall_s" in s:
        print(f"ray tune: {s['tune_wall_s']:.2f} s for the same trials")
        print(f"ratio phaselab/tune: {s['ratio_phaselab_over_tune']:.3f} (target <= 1.0)")
    if "tune_reuse_actors_wall_s" in s:
        print(f"ray tune (reuse_actors): {s['tune_reuse_actors_wall_s']:.2f} s, ratio "
              f"{s['ratio_phaselab_over_tune_reuse_actors']:.3f}")
    print(f"launch latency (claim -> Ray task start): p50 {s['launch_latency_p50_s'] * 1e3:.1f} ms, "
          f"p95 {s['launch_latency_p95_s'] * 1e3:.1f} ms")
    print(f"claim -> SUCCEEDED: p50 {s['claim_to_succeeded_p50_s'] * 1e3:.1f} ms, "
          f"p95 {s['claim_to_succeeded_p95_s'] * 1e3:.1f} ms")
    if report["profile"]:
        print("profile (controller):", json.dumps({k: round(v, 2) for k, v in report["profile"].items()}))
    print(f"load average before/after: {report['load_avg_before']} / {report['load_avg_after']}")


def write_results(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "orchestrator-overhead.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    s = report["summary"]
    lines = ["# Orchestrator overhead: phaselab vs a Ray Tune grid", "",
             f"- date (UTC): {report['date_utc']}", f"- command: `{report['command']}`",
             f"- machine: {report['machine']}", f"- versions: {report['versions']}",
             f"- load average (1/5/15 min) before: {report['load_avg_before']}, after: {report['load_avg_after']}",
             "", "| measure | value |", "|---|---|",
             f"| phaselab wall (catalog + plan + submit + run) | {s['phaselab_wall_s']:.2f} s |",
             f"| phaselab controller run only | {s['phaselab_run_only_s']:.2f} s |"]
    if "tune_wall_s" in s:
        lines += [f"| Ray Tune wall (Tuner + fit) | {s['tune_wall_s']:.2f} s |",
                  f"| ratio phaselab / Tune (target <= 1.0) | {s['ratio_phaselab_over_tune']:.3f} |"]
    if "tune_reuse_actors_wall_s" in s:
        lines += [f"| Ray Tune wall, reuse_actors=True | {s['tune_reuse_actors_wall_s']:.2f} s |",
                  f"| ratio phaselab / Tune (reuse_actors) | {s['ratio_phaselab_over_tune_reuse_actors']:.3f} |"]
    lines += [(f"| launch latency p50 / p95 (claim -> Ray task start) | {s['launch_latency_p50_s'] * 1e3:.1f} / "
               f"{s['launch_latency_p95_s'] * 1e3:.1f} ms |"),
              (f"| claim -> SUCCEEDED p50 / p95 | {s['claim_to_succeeded_p50_s'] * 1e3:.1f} / "
               f"{s['claim_to_succeeded_p95_s'] * 1e3:.1f} ms |")]
    if report["profile"]:
        lines += ["", ("Profile of one more phaselab run (cProfile; cumulative seconds of calls made by the "
                       "controller):"), "", "| part | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in report["profile"].items()]
    (out / "orchestrator-overhead.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
