"""benchmarks/results/ holds one current result per benchmark, card and configuration, and the
table "Results and the code they describe" of benchmarks/README.md lists exactly its files.

The naming rule (benchmarks/README.md, "Adding a benchmark or a result"):
`results/BENCH-CARD[-CONFIG].{md,json}`, figures `BENCH-CARD[-CONFIG]-*.png`, Nsight Compute
exports under `results/ncu/`. A result's configuration is read from its JSON header: the runner,
the card, the command's flags other than those that only set how long or where it ran, and the
environment variables that change the code path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "benchmarks" / "README.md"
SECTION = "## Results and the code they describe"

# BENCH of a result name -> the runner in benchmarks/ whose command line its header carries
RUNNERS = {"attention": "attention.py", "ablation": "attention_ablation.py",
           "pope-backward-tuning": "pope_backward_tuning.py", "train": "train_throughput.py",
           "small-models": "small_models.py", "ensemble": "ensemble.py", "gpu-sharing": "gpu_sharing.py",
           "scaling": "scaling.py", "orchestrator-overhead": "orchestrator_overhead.py",
           "grid-efficiency": "grid_efficiency.py", "encoding-walk": "encoding_walk.py",
           "gluon-tapa-tiles": "gluon_tapa_tiles.py",
           "gpu-tests": None,   # the GPU test suite through run_on_gpu.sh: a .md only
           "gluon-fwd": None,   # gluon_compile.py --time: its printed table, a .md only
           "gluon-bwd": None,   # gluon_compile_bwd.py --time: likewise
           "gluon-tapa-fwd": None,   # gluon_compile_tapa.py --time: likewise
           "gluon-tapa-bwd": None}   # gluon_compile_tapa_bwd.py --time: likewise
CARDS = ("h200", "h100", "cpu")
CARDLESS = {"orchestrator-overhead", "encoding-walk"}   # measure our code on the CPU machine, no card
# flags that set how long, where or against what a run is written, not what it measures
NOT_CONFIG = {"--out", "--versus", "--warmup", "--iters", "--steps", "--budget-s", "--pack-steps",
              "--seconds", "--work-dir"}
VALUE_IGNORED = {"--profile"}   # profiling on or off is the configuration; the step count is not
ENV_NOT_CONFIG = {"PHASELAB_CACHE_DIR", "PHASELAB_GIT_COMMIT"}


def listed_files(readme: str) -> list[str]:
    """The paths (relative to results/) of the first column of the README's results table, with
    `{a,b}` expanded; a glob stays a glob."""
    if SECTION not in readme:
        raise AssertionError(f"benchmarks/README.md has no section {SECTION!r}")
    body = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out: list[str] = []
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        for name in re.findall(r"`([^`]+)`", line.split(" | ", 1)[0]):
            m = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", name)
            out += [f"{m[1]}{alt}{m[3]}" for alt in m[2].split(",")] if m else [name]
    return out


def parse_name(stem: str) -> tuple[str, str, str]:
    """(bench, card, config) of a result's file name without extension; ValueError when it
    breaks the naming rule."""
    for bench in sorted(RUNNERS, key=len, reverse=True):
        if stem == bench and bench in CARDLESS:
            return bench, "", ""
        if not stem.startswith(bench + "-"):
            continue
        rest = stem[len(bench) + 1:]
        if bench in CARDLESS:
            return bench, "", rest
        card, sep, config = rest.partition("-")
        if card in CARDS and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*" if sep else "", config):
            return bench, card, config
    raise ValueError(f"{stem!r} is not BENCH-CARD[-CONFIG] with BENCH in {sorted(RUNNERS)}, CARD in {CARDS}")


def configuration(bench: str, card: str, command: str, env: dict | None) -> tuple:
    """What a run measured, from its header: two results with one key cover one configuration."""
    tokens = [t.strip("'\"`,()") for t in command.split()]
    kept: list[str] = []
    skip = False
    for tok in tokens:
        if skip and not tok.startswith("--"):
            continue
        skip = tok in NOT_CONFIG or tok in VALUE_IGNORED
        if tok in NOT_CONFIG:
            continue
        kept.append(tok)
    env_kept = tuple(sorted((k, str(v)) for k, v in (env or {}).items() if k not in ENV_NOT_CONFIG))
    return bench, card, tuple(kept), env_kept


def _header(path: Path) -> dict:
    data = json.loads(path.read_text())
    meta = data.get("meta", data) if isinstance(data, dict) else None
    assert isinstance(meta, dict) and isinstance(meta.get("command"), str), \
        f"{path.relative_to(ROOT)}: no header with a 'command'"
    return meta


def test_table_lists_exactly_the_result_files():
    present = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()}
    covered: set[str] = set()
    for entry in listed_files(README.read_text()):
        hits = {p.relative_to(RESULTS).as_posix() for p in RESULTS.glob(entry) if p.is_file()}
        assert hits, f"benchmarks/README.md lists results/{entry}, which does not exist"
        assert not hits & covered, f"benchmarks/README.md lists results/{entry} twice"
        covered |= hits
    assert present - covered == set(), f"results/ files missing from the README's table: {sorted(present - covered)}"


def test_names_follow_the_rule_and_configurations_are_unique():
    seen: dict[tuple, str] = {}
    for path in sorted(RESULTS.glob("*")):
        if path.is_dir():
            assert path.name == "ncu", f"unexpected folder results/{path.name}"
            continue
        stem = path.name.rsplit(".", 1)[0]
        if path.suffix == ".png":
            assert any(path.name.startswith(p.stem + "-") for p in RESULTS.glob("*.json")), path.name
            continue
        assert path.suffix in (".md", ".json"), path.name
        bench, card, _ = parse_name(stem)
        assert path.with_suffix(".md").exists(), f"results/{stem}.json has no .md"
        if path.suffix == ".md":
            assert RUNNERS[bench] is None or path.with_suffix(".json").exists(), f"results/{path.name} has no .json"
            continue
        meta = _header(path)
        assert f"benchmarks/{RUNNERS[bench]}" in meta["command"], f"{path.name}: not a run of {RUNNERS[bench]}"
        key = configuration(bench, card, meta["command"], meta.get("env"))
        assert key not in seen, f"results/{path.name} and results/{seen[key]} cover one configuration"
        seen[key] = path.name


def test_rule_checks_reject_what_they_should():
    assert parse_name("attention-h200-pope-tuned") == ("attention", "h200", "pope-tuned")
    assert parse_name("small-models-h200") == ("small-models", "h200", "")
    assert parse_name("orchestrator-overhead") == ("orchestrator-overhead", "", "")
    for bad in ("attention-a100x-d64", "attn-h200", "attention", "attention-h200-D64", "attention-h200-"):
        with pytest.raises(ValueError):
            parse_name(bad)
    a = configuration("train", "h200", "python benchmarks/train_throughput.py --compile --warmup 8 "
                      "--steps 20 --profile 3 --out /o/a", {"PHASELAB_CACHE_DIR": "/tmp/x"})
    b = configuration("train", "h200", "python benchmarks/train_throughput.py --compile --steps 60 "
                      "--profile 5 --out /o/b", {})
    assert a == b
    c = configuration("train", "h200", "python benchmarks/train_throughput.py --compile --out /o/c",
                      {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps"})
    assert c != b
    assert listed_files(f"x\n{SECTION}\n\n| file | y |\n|---|---|\n| `a-h200.{{md,json}}`, `b.png` | z |\n"
                        "\n## Next\n| `c.md` | w |\n") == ["a-h200.md", "a-h200.json", "b.png"]
