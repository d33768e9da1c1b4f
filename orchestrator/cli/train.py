"""CLI verbs that run one workload outside any grid, in this process: ``eval`` (one checkpoint,
``workloads.evals.api.run_eval``, optionally with an inference-time RoPE extension) and ``train``
(one training config, ``run_training``).

Both take the config they run as ``key=value`` overrides of that config, never as flags that
mirror its fields, so a new config field needs no CLI change: ``eval``'s are the eval stage's
suite keys plus its ``extend`` section (``extend.rule=yarn extend.factor=8``), ``train``'s any
key of the training YAML. The options of both commands are pinned by
tests/orchestrator/test_cli_train.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import typer

from phaselab.orchestrator.cli.common import JSON
from phaselab.orchestrator.cli.common import emit as _emit
from phaselab.orchestrator.cli.common import fail as _fail
from phaselab.orchestrator.cli.common import make_console as _console
from phaselab.workloads.paths import PathRefused

CHECKPOINT = typer.Argument(..., help="model.pt, a checkpoint folder (step_N/), a run's checkpoints/ folder or "
                            "its checkpoints/latest pointer, or the run folder itself (its newest checkpoint).")
SUITE = typer.Option(..., "--suite", help="ppl-by-length | niah | lm-eval | task | freq")
SUITE_OPTIONS = typer.Argument(None, help=(
    "key=value overrides of the eval stage's config: suite keys (ppl.lengths=[64,128], device=cpu) and "
    "extend.<field>, the RoPE context extension applied before the suite runs, weights unchanged "
    "(MATH §2; RoPE checkpoints only): extend.rule=pi|ntk|dynamic_ntk|yarn, extend.factor (s >= 1), "
    "extend.original_max_seq_len (the pretraining length L), extend.base, extend.attention_factor "
    "(YaRN), extend.block_size."))
EVAL_OUT = typer.Option(Path(".phaselab/eval"), "--out", help="Output folder.")

TRAIN_KEYS = ("model", "data", "train", "extend", "out_dir", "init_from")
TRAIN_CONFIG = typer.Argument(..., help="Training YAML: model, data, train, extend?, out_dir?, init_from?.")
TRAIN_OVERRIDES = typer.Argument(None, help="Overrides: key=v (any config field), +key=v, ~key.")
ALLOW_OUTSIDE = typer.Option(False, "--allow-outside", help="Allow an out_dir outside the current folder.")


def _train_config(config: Path, overrides: list[str], *, allow_outside: bool = False
                  ) -> tuple[dict[str, Any], Path, Path | None]:
    """(run_training spec, out_dir, init_from) from a training YAML plus overrides. Sections are
    converted strictly as in grids (``model: {preset: tiny, ...}`` allowed); errors are GridErrors
    naming FILE:LINE:COLUMN (or the override) and the key. ``out_dir`` must lie inside the
    current folder (the project) unless ``allow_outside``: a config file is not trusted to
    choose where checkpoints are written."""
    from phaselab.orchestrator.language.overrides import apply_overrides, parse_override
    from phaselab.orchestrator.language.yamlio import GridError, Issue, Mark, load_yaml_file, suggest
    from phaselab.orchestrator.stages import base
    from phaselab.workloads.paths import check_path

    check_path(config, what="training config", expect="file")
    doc, marks = load_yaml_file(config)
    if not isinstance(doc, dict):
        raise GridError([Issue(marks.at(()), "", f"a training config must be a mapping, got {type(doc).__name__}")])
    doc = {k: ({} if v is None and k in ("model", "data", "train") else v) for k, v in doc.items()}
    # key=v may name a field the YAML leaves at its default (Hydra's structured-config rule, as in
    # grid sections): set-or-add; unknown keys are caught below and by the strict conversion.
    forced = {o: f"++{o}" for o in overrides if parse_override(o).op == "set"}
    doc = apply_overrides(doc, marks, [forced.get(o, o) for o in overrides])
    shown = {f"<override {f!r}>": Mark(f"<override {o!r}>", 0, 0) for o, f in forced.items()}
    marks.by_path.update({p: shown[m.file] for p, m in marks.by_path.items() if m.file in shown})
    first = {p[0]: m for p, m in reversed(marks.by_path.items()) if p}   # a key added by `++a.b=v` has only a.b
    issues = [Issue(first.get(k, marks.at(())), str(k), f"unknown key '{k}'; valid keys: {', '.join(TRAIN_KEYS)}",
                    suggest(str(k), TRAIN_KEYS)) for k in doc if k not in TRAIN_KEYS]
    if "data" not in doc:
        issues.append(Issue(marks.at(()), "data", "required section is missing"))
    issues += [Issue(marks.at((k,)), k, f"must be a path string, got {doc[k]!r}")
               for k in ("out_dir", "init_from") if k in doc and not isinstance(doc[k], str)]
    if issues:
        raise GridError(issues)
    try:
        spec = {"data": base.normalize_data(doc["data"]), "train": base.normalize_train(doc.get("train") or {})}
        if doc.get("model") is not None:
            spec["model"] = base.normalize_model(doc["model"])
        if doc.get("extend") is not None:
            spec["extend"] = base.normalize_extend(doc["extend"])
    except base.SectionError as err:
        path = tuple(int(p) if p.isdigit() else p for p in err.key.split("."))
        raise GridError([Issue(marks.at(path), err.key, err.message, err.suggestion)]) from None
    out_dir = _checked(doc.get("out_dir") or str(Path(".phaselab/train") / Path(config).stem), marks, "out_dir",
                       "new_dir")
    project = Path.cwd().resolve()
    if not allow_outside and not out_dir.resolve().is_relative_to(project):
        raise PathRefused(str(Issue(marks.at(("out_dir",)), "out_dir",
                                    f"{str(out_dir)!r} is outside the project folder {str(project)!r}; "
                                    "pass --allow-outside to write checkpoints there")))
    init_from = _checked(doc["init_from"], marks, "init_from", "exists") if doc.get("init_from") else None
    return spec, out_dir, init_from


def _checked(raw: str, marks: Any, key: str, expect: str) -> Path:
    """``paths.check_path`` of a config's path ``key``; its refusal is prefixed with the key's
    FILE:LINE:COLUMN (or override)."""
    from phaselab.orchestrator.language.yamlio import Issue
    from phaselab.workloads.paths import check_path

    try:
        return check_path(raw, what="path", expect=expect)
    except PathRefused as err:
        raise PathRefused(str(Issue(marks.at((key,)), key, str(err)))) from None


def _refuse(as_json: bool, message: str) -> NoReturn:
    """A path or file the user gave cannot be used: ``message`` on one line (``{"ok": false,
    "error"}`` with ``--json``), exit 2, the code click gives a bad argument (its own path checks
    included), so scripts can tell a bad input from a failed run."""
    if as_json:
        _emit(True, {"ok": False, "error": message})
    else:
        from rich.markup import escape

        _console().print(f"[red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    raise typer.Exit(2)


def _eval_extension(raw: Any) -> dict | None:
    """The ``extend`` mapping the ``extend.*`` overrides built (None without any), converted by the
    eval stage's own ``normalize_extend``. A value it rejects is a usage error naming the key
    (click's BadParameter: one line, exit code 2, before anything runs)."""
    from phaselab.orchestrator.stages.base import SectionError, normalize_extend

    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise typer.BadParameter(f"extend must be set field by field (extend.rule=yarn ...), got {raw!r}",
                                 param_hint="'extend'")
    try:
        return normalize_extend(raw)
    except SectionError as err:
        hint = f"; did you mean {err.suggestion!r}?" if err.suggestion else ""
        raise typer.BadParameter(err.message + hint, param_hint=f"'{err.key}'") from None
    except ValueError as err:   # to_dict refuses non-finite floats (a config must be storable)
        raise typer.BadParameter(str(err), param_hint="'extend'") from None


def resolve_checkpoint(path: Path) -> Path:
    """The ``model.pt`` that ``path`` names (see CHECKPOINT); ``paths.PathRefused`` naming the
    path when it is no usable path or holds no checkpoint."""
    from phaselab.catalog.tracking.run_folder import LATEST
    from phaselab.workloads.paths import check_path, shown
    from phaselab.workloads.train.api import resolve_model_file
    from phaselab.workloads.train.checkpoint import CheckpointDir

    path = check_path(path, what="checkpoint", expect="exists")
    if path.name == LATEST and path.is_file():   # the pointer names the newest step folder; read as
        latest = CheckpointDir(path.parent).latest()   # CheckpointDir does (a step name, never a path)
        if latest is None:
            raise PathRefused(f"checkpoint {shown(path)} names no complete step_N/ folder beside it")
        path = latest
    try:
        return resolve_model_file(path, what="checkpoint")
    except PathRefused:
        raise PathRefused(f"checkpoint {shown(path)} holds no model.pt and no complete checkpoint (give model.pt, "
                          "a step_N/ folder, a checkpoints/ folder or a run folder)") from None


def default_ppl_lengths(model_file: Path, extend: Mapping[str, Any] | None) -> list[int]:
    """Perplexity-by-length lengths when none are given: the model's context L (``extend.block_size``
    when an extension sets one, else the training block size) and 2L, 4L, so the extrapolation
    beyond training is visible at once."""
    from phaselab.workloads.models.checkpoint_io import load_config

    length = (extend or {}).get("block_size") or load_config(model_file).block_size
    return [int(length) * k for k in (1, 2, 4)]


# Settings a resumed ``phaselab train`` may change: how long it runs and how it reports, not
# what it computes (raising ``train.steps`` trains further; docs/examples/train_tiny.yaml).
RESUMABLE = frozenset({"train.steps", "train.log_every", "train.eval_every", "train.eval_batches",
                       "train.eval_batch_size", "train.ckpt_every", "train.keep_checkpoints",
                       "train.final_eval_batches", "train.final_eval_splits", "train.device", "train.compile"})


def resume_conflicts(spec: Mapping[str, Any], out_dir: Path) -> list[str]:
    """Dotted keys (``key: stored -> now``) where ``spec`` differs from the spec of the newest
    checkpoint in ``out_dir`` beyond :data:`RESUMABLE`; empty when there is nothing to resume."""
    import json

    from phaselab.catalog.tracking.run_folder import CHECKPOINTS_DIR, SPEC_FILE
    from phaselab.workloads.config import flatten, to_dict
    from phaselab.workloads.train.api import parse_spec, with_eval_splits
    from phaselab.workloads.train.checkpoint import CheckpointDir

    latest = CheckpointDir(out_dir / CHECKPOINTS_DIR).latest()
    if latest is None or not (latest / SPEC_FILE).is_file():
        return []
    try:
        stored = flatten(json.loads((latest / SPEC_FILE).read_text(encoding="utf-8")))
    except (ValueError, AttributeError) as err:   # not JSON, not UTF-8, not a mapping
        raise PathRefused(f"checkpoint spec {str(latest / SPEC_FILE)!r} is damaged ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]}); delete {str(latest)!r} to resume from the one "
                          "before") from None
    now = flatten(json.loads(json.dumps(with_eval_splits(to_dict(parse_spec(spec)), spec))))
    sections = {k.split(".", 1)[0] for k, v in now.items() if v is not None}
    keys = sorted(k for k in set(stored) | set(now) if k.split(".", 1)[0] in sections and k not in RESUMABLE)
    return [f"{k}: {stored.get(k)!r} -> {now.get(k)!r}" for k in keys if stored.get(k) != now.get(k)]


def _refuse_changed_resume(spec: Mapping[str, Any], out_dir: Path, as_json: bool) -> None:
    changed = resume_conflicts(spec, out_dir)
    if changed:
        shown = "\n  ".join(changed[:20]) + (f"\n  ... and {len(changed) - 20} more" if len(changed) > 20 else "")
        _fail(as_json, f"{out_dir} holds a run of a different config; resuming it would mix the two:\n  {shown}\n"
                       f"train it in its own folder (add out_dir={out_dir}-2, any new folder), or delete "
                       f"{out_dir} to start over; only train.steps and logging/evaluation cadence may change "
                       "on a resume")


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_(checkpoint: Path = CHECKPOINT, suite: str = SUITE, options: list[str] = SUITE_OPTIONS,
              out_dir: Path = EVAL_OUT, as_json: bool = JSON) -> None:
        """Evaluate one checkpoint outside any grid (workloads.evals.api.run_eval), e.g.
        `phaselab eval ckpt/ --suite ppl-by-length ppl.lengths=[8192,65536] extend.rule=yarn
        extend.factor=8 extend.original_max_seq_len=8192` (YaRN at inference, no fine-tuning)."""
        from phaselab.catalog.tracking import RecordingTracker
        from phaselab.orchestrator.language.overrides import apply_overrides
        from phaselab.orchestrator.language.yamlio import GridError, Marks

        try:
            spec = apply_overrides({"suite": suite}, Marks("<eval>"), [f"++{o}" for o in options or []])
        except GridError as err:
            _fail(as_json, str(err))
        extend = _eval_extension(spec.pop("extend", None))
        from phaselab.workloads.evals.api import ExtensionNotApplicable, run_eval
        from phaselab.workloads.paths import check_path, check_run_folder

        try:
            model_file = resolve_checkpoint(checkpoint)
            out_dir = check_path(out_dir, what="--out", expect="new_dir")
            check_run_folder(out_dir, what="--out")
            defaulted = None
            if suite == "ppl-by-length" and not (isinstance(spec.get("ppl"), Mapping) and "lengths" in spec["ppl"]):
                defaulted = default_ppl_lengths(model_file, extend)
                spec["ppl"] = {**(spec.get("ppl") if isinstance(spec.get("ppl"), Mapping) else {}),
                               "lengths": defaulted}
                if not as_json:
                    _console().print(f"ppl.lengths not given: {defaulted} (the model's context and 2x, 4x)")
            records = run_eval(spec, checkpoint=model_file, out_dir=out_dir, tracker=RecordingTracker(),
                               extend=extend)
        except PathRefused as err:   # a bad path, or a checkpoint file that is none (UnreadableCheckpoint)
            _refuse(as_json, str(err))
        except ExtensionNotApplicable as err:
            _fail(as_json, f"{err} (drop the extend.* overrides)")
        except ValueError as err:
            _fail(as_json, str(err))
        _emit(as_json, {"ok": True, "checkpoint": str(model_file), "extend": extend, "default_ppl_lengths": defaulted,
                        "records": [r.to_dict() for r in records]})
        if not as_json:
            if extend is not None:
                _console().print("extend " + " ".join(f"{k}={v}" for k, v in extend.items() if v is not None))
            for r in records:
                _console().print(f"{r.key():<40} {r.value:.6g} {r.unit}")

    @app.command()
    def train(config: Path = TRAIN_CONFIG, overrides: list[str] = TRAIN_OVERRIDES, as_json: bool = JSON,
              allow_outside: bool = ALLOW_OUTSIDE) -> None:
        """Run one training stage outside the orchestrator (workloads.train.api.run_training).
        Re-running with the same out_dir (default .phaselab/train/<config name>) resumes from its
        newest checkpoint; a finished run only re-evaluates."""
        from phaselab.orchestrator.language.yamlio import GridError

        try:
            spec, out_dir, init_from = _train_config(config, overrides or [], allow_outside=allow_outside)
        except GridError as err:
            _fail(as_json, "invalid training config:\n  " + "\n  ".join(str(i) for i in err.issues))
        except PathRefused as err:
            _refuse(as_json, str(err))
        from phaselab.catalog.tracking import RecordingTracker, run_folder
        from phaselab.workloads.train.api import run_training
        from phaselab.workloads.train.checkpoint import CheckpointDir

        try:
            _refuse_changed_resume(spec, out_dir, as_json)
        except PathRefused as err:
            _refuse(as_json, str(err))
        console = _console()

        class Echo(RecordingTracker):
            def log_metrics(self, metrics: Any, *, step: int) -> None:
                super().log_metrics(metrics, step=step)
                if not as_json:
                    console.print(f"step {step:>6}  " + "  ".join(f"{k} {v:.5g}" for k, v in metrics.items()),
                                  soft_wrap=True)

        resumed = max(CheckpointDir(out_dir / run_folder.CHECKPOINTS_DIR).steps(), default=0)
        try:
            outcome = run_training(spec, out_dir=out_dir, tracker=Echo(), init_from=init_from)
        except PathRefused as err:   # a symlink out of out_dir, an init_from or checkpoint that is none
            _refuse(as_json, str(err))
        except (ValueError, RuntimeError) as err:   # ConfigError, TrainingDiverged, TrainingPreempted
            _fail(as_json, f"{type(err).__name__}: {err}")
        out = {"ok": True, "out_dir": str(out_dir), "resumed_from_step": resumed,
               "checkpoint": str(outcome.checkpoint), "metrics": outcome.metrics}
        _emit(as_json, out)
        if not as_json:
            console.print(f"trained to step {int(outcome.metrics['step'])} (resumed from step {resumed}); "
                          f"checkpoint {outcome.checkpoint}")
            for k, v in sorted(outcome.metrics.items()):
                console.print(f"  {k:<24} {v:.6g}")
