"""How far the encoding travels: ``pe`` from ``experiments/pope_jsb.yaml`` to the PoPE kernel,
measured by running it (no GPU, no Ray, no catalog).

The run: the grid is planned by the real loader (``plan_grid``: YAML, overrides, validation,
expansion, typed stage configs, keys), with overrides that keep only the ``pe=pope`` cell of seed
0 and make the model tiny (1 layer, d 32, 2 heads, block 32, batch 2, 1 step, 1 evaluation
batch), ``launcher`` forced to ``ray_task`` (the one-process path). The worker's payload is built
as ``Controller._payload`` builds it (without catalog, MLflow or upstream), sent through a pickle
round trip (what Ray does to it) and run by the worker's own entry, ``runner.execute``: stage,
``run_training``, session, model, one forward+backward, the final evaluation. The attention
backend is the grid's (``auto``: what the stage picks on this machine) unless ``--backend`` names
one; ``triton`` on CPU needs ``TRITON_INTERPRET=1``.

Counted with ``sys.settrace``, over frames of our files only (under the tree's ``kernels/``,
``catalog/``, ``workloads/``, ``orchestrator/``, ``phaselab/``):

- hops: our frames on the stack at the first call, under a ``forward``, into a PoPE kernel
  function (a ``kernels/`` file or function whose name holds ``pope``, ``score_mod.py`` aside),
  outermost first; frames, distinct functions and
  distinct files. Config side: the functions of ours that are handed the encoding (an argument
  that is the ``pope`` kind string or holds ``kind: pope`` within 4 levels of mappings, lists,
  dataclass / pydantic fields or ``pe``/``config``/``spec``/``model`` attributes) between the
  start of planning and the worker's entry, and the deepest stack of ours among them.
- conversions: constructions of config types (a class of ours whose name ends in Config, Spec or
  Options: dataclass ``__init__`` and pydantic ``__init__``/``model_validate``; pydantic's nested
  models are built in its core and not seen), calls of our converters (names like ``from_dict``,
  ``to_dict``, ``asdict``, ``normalize``, ``parse_spec``, ``model_dump``), and the chain of
  types in which the encoding appears (the object whose ``kind`` is ``pope``), first seen order.
- dispatches: calls of our functions handed the kind string itself (``"pope"``), and calls handed
  an object of kind ``pope`` that return a class, a function or a module (an implementation
  looked up); plus the executed lines of ours that test a kind (``kind ==``, ``kind in``,
  ``["kind"]``, a ``"pope"`` literal) while a local holds the encoding.

Phases: ``config`` (planning to the worker's entry), ``worker`` (to the kernel entry),
``kernel`` (after it). Usage, at any commit whose tree has the grid (PYTHONPATH may point at
another tree's import layout, see the results file):

    python benchmarks/encoding_walk.py --out /tmp/walk            # /tmp/walk.json, /tmp/walk.md
    python benchmarks/encoding_walk.py --combine old.json new.json --out benchmarks/results/encoding-walk
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

OURS = ("kernels", "catalog", "workloads", "orchestrator", "phaselab")
KIND = "pope"
CONFIG_NAME = re.compile(r"(Config|Spec|Options)$")
CONVERTER = re.compile(r"(^|_)(from_dict|to_dict|from_mapping|as_dict|asdict|normalize|parse_spec|"
                       r"model_dump|model_validate|to_json|from_json)($|_)")
KIND_TEST = re.compile(r"""(\bkind\b\s*(==|!=|\bin\b|\bnot in\b))|(\[\s*["']kind["']\s*\])|(["']pope["'])""")
ATTRS = ("pe", "config", "cfg", "spec", "model", "score_mod", "encoding", "positional", "defaults")
TINY = ["axes.product.pe=[pope]", "seeds=[0]", "+defaults.model.n_layer=1", "+defaults.model.n_head=2",
        "+defaults.model.d_model=32", "+defaults.model.block_size=32", "defaults.data.block_size=32",
        "defaults.train.steps=1", "defaults.train.eval_every=0", "defaults.train.batch_size=2",
        "defaults.train.eval_splits=[valid]", "defaults.train.final_eval_splits=[valid]",
        "defaults.train.cuda_graphs=false", "++defaults.train.eval_batches=1",
        "++defaults.train.final_eval_batches=1", "++defaults.launcher=ray_task"]
STAGE_KIND = "pretrain"
IMPLS = ("function", "module", "builtin_function_or_method")   # what a lookup returns, besides classes
TABLES = ("constructions", "carrying", "converters", "converters_pe", "kind_calls", "lookups", "kind_lines")


def package_root() -> Path:
    """The tree ``phaselab`` is imported from (its ``kernels/`` etc. beside ``phaselab/``)."""
    import phaselab
    import phaselab.kernels

    kernels = Path(os.path.realpath(phaselab.kernels.__file__)).parent
    assert Path(os.path.realpath(phaselab.__file__)).parent.parent == kernels.parent, "unexpected layout"
    return kernels.parent


def _ours_type(obj: Any) -> bool:
    return type(obj).__module__.startswith("phaselab.")


def find_pe(obj: Any, depth: int = 4) -> Any:
    """The object of kind ``pope`` inside ``obj`` (itself included), or None (also for an object
    half built: the probe runs at constructors' entry)."""
    try:
        return _find(obj, depth)
    except Exception:  # noqa: BLE001
        return None


def _find(obj: Any, depth: int) -> Any:
    if depth < 0 or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return None
    if isinstance(obj, Mapping):
        if obj.get("kind") == KIND:
            return obj
        items = list(obj.values())[:64]
    elif isinstance(obj, (list, tuple)):
        items = list(obj[:16])
    elif _ours_type(obj):
        if not isinstance(obj, type) and KIND in (getattr(obj, "kind", None), getattr(obj, "name", None)):
            return obj
        items = _children(obj)
    else:
        return None
    for child in items:
        hit = _find(child, depth - 1)
        if hit is not None:
            return hit
    return None


def _children(obj: Any) -> list[Any]:
    names: list[str] = []
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
    elif hasattr(type(obj), "model_fields"):
        names = list(type(obj).model_fields)
    names += [a for a in ATTRS if a not in names]
    out = []
    for name in names:
        try:
            out.append(getattr(obj, name))
        except Exception:  # noqa: BLE001, S110 - a property that needs more than the object has
            pass
    return out


def _under(frame: Any, code: Any) -> bool:
    """Whether ``frame`` or a caller of it runs ``code`` (a code object, or a function name)."""
    while frame is not None:
        if frame.f_code is code or frame.f_code.co_name == code:
            return True
        frame = frame.f_back
    return False


@dataclasses.dataclass
class Walk:
    """What the tracer saw; ``phase`` moves config -> worker -> kernel."""

    root: Path
    phase: str = "config"
    entry_chain: list[str] = dataclasses.field(default_factory=list)
    entry_call: str = ""
    kernel_calls: int = 0
    backend: str | None = None
    config_fns: Counter = dataclasses.field(default_factory=Counter)
    config_depth: list[str] = dataclasses.field(default_factory=list)
    worker_fns: Counter = dataclasses.field(default_factory=Counter)
    constructions: dict[str, Counter] = dataclasses.field(default_factory=dict)
    carrying: dict[str, Counter] = dataclasses.field(default_factory=dict)
    converters: dict[str, Counter] = dataclasses.field(default_factory=dict)
    converters_pe: dict[str, Counter] = dataclasses.field(default_factory=dict)
    chain: list[str] = dataclasses.field(default_factory=list)
    kind_calls: dict[str, Counter] = dataclasses.field(default_factory=dict)
    lookups: dict[str, Counter] = dataclasses.field(default_factory=dict)
    kind_lines: dict[str, Counter] = dataclasses.field(default_factory=dict)
    _rel: dict[str, str | None] = dataclasses.field(default_factory=dict)
    _src: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    _pending: dict[int, str] = dataclasses.field(default_factory=dict)

    def rel(self, filename: str) -> str | None:
        if filename not in self._rel:
            path = os.path.realpath(filename)
            rel = os.path.relpath(path, self.root) if path.startswith(str(self.root) + os.sep) else None
            self._rel[filename] = rel if rel and rel.split(os.sep, 1)[0] in OURS else None
        return self._rel[filename]

    def name(self, frame: Any) -> str:
        code = frame.f_code
        return f"{self.rel(code.co_filename)}:{getattr(code, 'co_qualname', code.co_name)}"

    def count(self, table: dict[str, Counter], key: str) -> None:
        table.setdefault(self.phase, Counter())[key] += 1

    def ours_stack(self, frame: Any) -> list[str]:
        out = []
        while frame is not None:
            if self.rel(frame.f_code.co_filename):
                out.append(f"{self.name(frame)}:{frame.f_lineno}")
            frame = frame.f_back
        return out[::-1]

    def is_kernel(self, rel: str, func: str) -> bool:
        """PoPE kernel code: not the encoding's description (``score_mod.py``: its checks and
        frequencies run when the model builds a ScoreMod)."""
        return rel.startswith("kernels" + os.sep) and not rel.endswith("score_mod.py") and \
            (KIND in rel or KIND in func.lower())

    def note_type(self, obj: Any, where: str) -> None:
        label = f"{type(obj).__module__}.{type(obj).__qualname__}"
        if not any(c.split(" @ ")[0] == label for c in self.chain):
            self.chain.append(f"{label} @ {where} [{self.phase}]")

    def construction(self, frame: Any) -> None:
        self_obj = frame.f_locals.get("self")
        cls = type(self_obj)
        if frame.f_code.co_name == "model_validate":
            cls = frame.f_locals.get("cls", cls)
        if not isinstance(cls, type) or not cls.__module__.startswith("phaselab.") or \
                not CONFIG_NAME.search(cls.__name__):
            return
        label = f"{cls.__module__}.{cls.__qualname__}"
        self.count(self.constructions, label)
        args = {k: v for k, v in frame.f_locals.items() if k not in ("self", "cls", "__class__")}
        if find_pe(args) is not None or KIND in args.values():
            self.count(self.carrying, label)

    def call(self, frame: Any) -> Any:
        code = frame.f_code
        if code.co_name in ("__init__", "model_validate"):
            self.construction(frame)
        rel = self.rel(code.co_filename)
        if rel is None:
            return None
        func = self.name(frame)
        if code.co_name == "<module>" or _under(frame.f_back, "_call_with_frames_removed"):
            return None   # an import (importlib runs every module body through that function)
        if self.phase == "worker" and self.is_kernel(rel, code.co_name) and _under(frame, "forward"):
            self.phase = "kernel"
            self.entry_chain, self.entry_call = self.ours_stack(frame), func
        if self.is_kernel(rel, code.co_name) and not self.is_kernel(self.rel(frame.f_back.f_code.co_filename)
                                                                    or "", frame.f_back.f_code.co_name):
            self.kernel_calls += 1
        self.args(frame, func)
        return self.local

    def args(self, frame: Any, func: str) -> None:
        code = frame.f_code
        outer = not _under(frame.f_back, code)   # not a recursion step
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        values = [frame.f_locals[n] for n in names if n in frame.f_locals]
        by_kind = any(isinstance(v, str) and v == KIND for v in values)
        hit = next((h for v in values if (h := find_pe(v)) is not None), None)
        if outer and CONVERTER.search(code.co_name):
            self.count(self.converters, func)
            if hit is not None or by_kind:
                self.count(self.converters_pe, func)
        if outer and by_kind:
            self.count(self.kind_calls, func)
        if outer and (by_kind or hit is not None):
            self._pending[id(frame)] = func
        if hit is None:
            return
        self.note_type(hit, func)
        if self.phase == "config":
            self.config_fns[func] += 1
            stack = self.ours_stack(frame)
            if len(stack) > len(self.config_depth):
                self.config_depth = stack
        elif self.phase == "worker":
            self.worker_fns[func] += 1

    def local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.line(frame)
        elif event == "return" and id(frame) in self._pending:
            func = self._pending.pop(id(frame))
            if isinstance(arg, type) or type(arg).__name__ in (IMPLS):
                self.count(self.lookups, func)
        return self.local

    def line(self, frame: Any) -> None:
        filename = frame.f_code.co_filename
        if filename not in self._src:
            try:
                self._src[filename] = Path(filename).read_text().splitlines()
            except OSError:
                self._src[filename] = []
        src = self._src[filename]
        text = src[frame.f_lineno - 1] if 0 < frame.f_lineno <= len(src) else ""
        if not KIND_TEST.search(text.split("#", 1)[0]):
            return
        if any(find_pe(v, 3) is not None or v == KIND for v in list(frame.f_locals.values())
               if isinstance(v, (str, Mapping)) or _ours_type(v)):
            self.count(self.kind_lines, f"{self.rel(filename)}:{frame.f_lineno}")

    def tracer(self, frame: Any, event: str, arg: Any) -> Any:
        return self.call(frame) if event == "call" else None


def _entries() -> tuple[Any, Any]:
    """The planner and the worker's entry of this tree (the older tree's layout as fallback)."""
    try:
        from phaselab.orchestrator.engine.runner import execute
        from phaselab.orchestrator.plan.dag import plan_grid
    except ImportError:
        from phaselab.orchestrator.dag import plan_grid
        from phaselab.orchestrator.runner import execute
    return plan_grid, execute


def _payload(node: Any, work: Path) -> dict[str, Any]:
    """Controller._payload's mapping for ``node`` with no catalog, MLflow or upstream."""
    r = node.resources
    return {"stage_hash": node.hash, "kind": node.kind, "name": node.name, "config": dict(node.config),
            "launcher": node.launcher, "ray_name": None, "out_dir": str(work / node.hash),
            "runs_root": str(work), "upstream": {}, "catalog_url": None, "heartbeat_s": None,
            "resources": {"cpus": r.cpus, "gpus": r.gpus, "memory_gb": r.memory_gb,
                          "accelerator": r.accelerator, "num_workers": r.num_workers},
            "mlflow": None, "attempt": 1}


def walk(grid: Path, backend: str | None) -> tuple[Walk, dict[str, Any]]:
    """Plan, hand over and run the stage under the tracer; (what it saw, the stage's outcome)."""
    seen = Walk(root=package_root())
    plan_grid, execute = _entries()
    overrides = TINY + ([f"defaults.model.attention.backend={backend}"] if backend else [])
    with tempfile.TemporaryDirectory(prefix="encoding-walk-") as tmp:
        sys.settrace(seen.tracer)
        try:
            nodes = [n for n in plan_grid(grid, overrides).nodes.values() if n.kind == STAGE_KIND]
            assert len(nodes) == 1, f"expected one training stage, got {[n.name for n in nodes]}"
            node = nodes[0]
            payload = pickle.loads(pickle.dumps(_payload(node, Path(tmp))))   # Ray's hand-over
            seen.phase = "worker"
            out = execute(payload)
        finally:
            sys.settrace(None)
    seen.backend = out.get("backend")
    outcome = {"ok": out.get("ok"), "backend": out.get("backend"), "launcher": node.launcher,
               "message": out.get("message"), "traceback": None if out.get("ok") else out.get("traceback")}
    return seen, outcome


def _distinct(chain: list[str]) -> tuple[list[str], list[str]]:
    funcs = list(dict.fromkeys(c.rsplit(":", 1)[0] for c in chain))
    files = list(dict.fromkeys(c.split(":", 1)[0] for c in chain))
    return funcs, files


def _sum(table: dict[str, Counter], phases: tuple[str, ...] = ("config", "worker", "kernel")) -> Counter:
    out: Counter = Counter()
    for p in phases:
        out.update(table.get(p, Counter()))
    return out


def summarise(seen: Walk) -> dict[str, Any]:
    funcs, files = _distinct(seen.entry_chain)
    before = ("config", "worker")
    cfg_files = sorted({f.split(":", 1)[0] for f in seen.config_fns})
    m = {
        "backend": seen.backend, "kernel_entry_reached": bool(seen.entry_call),
        "kernel_entry": seen.entry_call,
        "kernel_calls": seen.kernel_calls,
        "hops_frames": len(seen.entry_chain), "hops_functions": len(funcs), "hops_files": len(files),
        "hops_chain": seen.entry_chain, "hops_file_list": files,
        "config_functions_handed_pe": len(seen.config_fns), "config_files_handed_pe": len(cfg_files),
        "config_functions": sorted(seen.config_fns), "config_deepest_stack": len(seen.config_depth),
        "config_deepest_chain": seen.config_depth,
        "worker_functions_handed_pe": len(seen.worker_fns), "worker_functions": sorted(seen.worker_fns),
        "pe_representations": len(seen.chain), "pe_representation_chain": seen.chain,
        "config_constructions": sum(_sum(seen.constructions, before).values()),
        "config_constructions_carrying_pe": sum(_sum(seen.carrying, before).values()),
        "converter_calls": sum(_sum(seen.converters, before).values()),
        "converter_calls_carrying_pe": sum(_sum(seen.converters_pe, before).values()),
        "kind_string_calls": sum(_sum(seen.kind_calls, before).values()),
        "kind_lookups_returning_impl": sum(_sum(seen.lookups, before).values()),
        "kind_test_lines": len(_sum(seen.kind_lines, before)),
        "kind_test_executions": sum(_sum(seen.kind_lines, before).values()),
    }
    for key in TABLES:
        m[f"by_phase_{key}"] = {p: dict(sorted(c.items())) for p, c in getattr(seen, key).items()}
    return m


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def header(root: Path, argv: list[str]) -> dict[str, Any]:
    import torch

    return {"card": "cpu", "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": _git(root, "rev-parse", "--short", "HEAD"), "tree": str(root),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "env": {k: os.environ[k] for k in ("TRITON_INTERPRET",) if k in os.environ},
            "command": " ".join(["python", "benchmarks/encoding_walk.py", *argv])}


# (metric key, label) of the printed table and the results file, in order
ROWS = [("backend", "attention backend that ran"), ("kernel_entry", "PoPE kernel entry (first call)"),
        ("kernel_calls", "calls into PoPE kernel code from outside it (Triton interpreter: one a program)"),
        ("hops_frames", "hops: our frames on the stack at the kernel entry"),
        ("hops_functions", "hops: distinct functions"), ("hops_files", "hops: distinct files"),
        ("config_functions_handed_pe", "config side: functions handed the encoding"),
        ("config_files_handed_pe", "config side: files of those functions"),
        ("config_deepest_stack", "config side: deepest stack of ours handling it"),
        ("worker_functions_handed_pe", "worker side (to the kernel): functions handed the encoding"),
        ("pe_representations", "representations of the encoding (distinct types)"),
        ("config_constructions", "config-type constructions before the kernel"),
        ("config_constructions_carrying_pe", "  of which carrying the encoding"),
        ("converter_calls", "converter calls before the kernel (outermost of a recursion)"),
        ("converter_calls_carrying_pe", "  of which handed the encoding"),
        ("kind_string_calls", "dispatch: calls handed the kind string"),
        ("kind_lookups_returning_impl", ("dispatch: of the calls handed the kind or the encoding, those "
                                         "returning a class / function / module")),
        ("kind_test_lines", "dispatch: distinct kind-test lines executed"),
        ("kind_test_executions", "dispatch: kind-test line executions")]
LISTS = {"hops_frames": "hops_chain", "hops_files": "hops_file_list",
         "config_functions_handed_pe": "config_functions",
         "config_deepest_stack": "config_deepest_chain", "worker_functions_handed_pe": "worker_functions",
         "pe_representations": "pe_representation_chain"}


def _short(items: Any, limit: int = 6) -> str:
    if isinstance(items, Mapping):
        items = [f"{k} x{v}" for k, v in items.items()]
    items = list(items)
    return ", ".join(map(str, items[:limit])) + (f", ... ({len(items)})" if len(items) > limit else "")


def table(results: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: metric, one value column per result, and the first result's list."""
    heads = [r["meta"].get("label") or r["meta"]["commit"] for r in results]
    lines = ["| metric | " + " | ".join(f"`{h}`" for h in heads) + " | list (last column) |",
             "|---|" + "---:|" * len(heads) + "---|"]
    for key, label in ROWS:
        vals = [str(r["metrics"].get(key, "n/a")) for r in results]
        listed = results[-1]["metrics"].get(LISTS.get(key, ""), "")
        lines.append(f"| {label} | " + " | ".join(vals) + f" | {_short(listed) if listed else ''} |")
    return lines


def _details(result: dict[str, Any]) -> list[str]:
    m, head = result["metrics"], result["meta"].get("label") or result["meta"]["commit"]
    out = [f"### `{head}`", "", f"Stage outcome: {result['outcome']}.", "",
           "Stack at the kernel entry (outermost first):", ""]
    out += [f"{i + 1}. `{c}`" for i, c in enumerate(m["hops_chain"])]
    out += ["", "The encoding's representations, first seen:", ""]
    out += [f"- `{c}`" for c in m["pe_representation_chain"]]
    out += ["", "Config-side functions handed the encoding:", ""]
    out += [f"- `{c}`" for c in m["config_functions"]]
    out += ["", "By phase (config / worker / kernel):", ""]
    for key in TABLES:
        for phase, counts in m[f"by_phase_{key}"].items():
            out.append(f"- {key}, {phase}: " + ", ".join(f"`{k}` x{v}" for k, v in counts.items()))
    return out + [""]


def write(results: list[dict[str, Any]], out: Path, command: str) -> None:
    metas = [r["meta"] for r in results]
    doc = {"meta": {**metas[-1], "command": command, "columns": metas}, "results": results}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    md = ["# Encoding walk: `pe` from experiments/pope_jsb.yaml to the PoPE kernel", "",
          f"Card: CPU (no accelerator). Date: {metas[-1]['date']}. Command: `{command}`.", ""]
    md += [f"- `{m.get('label') or m['commit']}`: commit {m['commit']}, python {m['python']}, torch "
           f"{m['torch']}, env {m['env'] or '{}'}; `{m['command']}`" for m in metas]
    md += ["", "Method: the module docstring of `benchmarks/encoding_walk.py`.", ""] + table(results) + [""]
    for r in results:
        md += _details(r)
    out.with_suffix(".md").write_text("\n".join(md))


def measure(argv: list[str], grid: Path, backend: str | None, label: str | None) -> dict[str, Any]:
    root = package_root()
    start = time.monotonic()
    seen, outcome = walk(grid, backend)
    meta = header(root, argv) | {"label": label, "seconds": round(time.monotonic() - start, 1)}
    return {"meta": meta, "outcome": outcome, "metrics": summarise(seen)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--grid", type=Path, default=Path("experiments/pope_jsb.yaml"))
    ap.add_argument("--backend", choices=["reference", "sdpa", "triton", "auto"], default=None,
                    help="model.attention.backend (default: the grid's)")
    ap.add_argument("--label", default=None, help="the column's name (default: the commit)")
    ap.add_argument("--combine", nargs="+", type=Path, help="JSON files of earlier runs: one column each")
    ap.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    if args.combine:
        results = [r for p in args.combine for r in json.loads(p.read_text())["results"]]
    else:
        results = [measure(argv, args.grid, args.backend, args.label)]
    print("\n".join(table(results)))
    if not args.combine and not results[0]["outcome"]["ok"]:
        print(results[0]["outcome"]["traceback"], file=sys.stderr)
    if args.out:
        write(results, args.out, " ".join(["python", "benchmarks/encoding_walk.py", *argv]))
    return 0 if all(r["outcome"]["ok"] and r["metrics"]["kernel_entry_reached"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
