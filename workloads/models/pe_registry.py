"""The one registry of positional encodings (docs/EXTENDING.md): built-ins, entry points, "module:Class".

A kind names a `PositionalEncoding` subclass in one of three ways, looked up in this order:

- a built-in name (:data:`BUILTINS`, "module:Class" strings imported lazily);
- an entry point of the ``phaselab.encodings`` group (``pyproject.toml``:
  ``[project.entry-points."phaselab.encodings"] xpos = "my_pkg.xpos:XPos"``);
- a ``"package.module:Class"`` string written in the grid (a module on PYTHONPATH).

This module imports no torch: config validation, planning and docs read the names without
loading the encodings. :func:`load` imports one (a plugin's module imports torch).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Any

GROUP = "phaselab.encodings"

BUILTINS: dict[str, str] = {
    "none": "phaselab.workloads.models.positional.base:NoPE",
    "sinusoidal": "phaselab.workloads.models.positional.absolute:SinusoidalNoPE",
    "learned": "phaselab.workloads.models.positional.absolute:LearnedNoPE",
    "rope": "phaselab.workloads.models.positional.rope:RoPE",
    "pope": "phaselab.workloads.models.positional.pope:PoPE",
    "tapa": "phaselab.workloads.models.positional.tapa:TAPA",
    "alibi": "phaselab.workloads.models.positional.alibi:ALiBi",
}

_TARGET = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


class EncodingError(ValueError):
    """A kind that names no encoding, or a plugin that cannot be imported or is malformed."""


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed ``phaselab.encodings`` entry points by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def names() -> list[str]:
    """Every kind a grid may name without a "module:Class" string: built-ins, then entry points."""
    return [*BUILTINS, *sorted(set(entry_points()) - set(BUILTINS))]


def is_builtin(kind: str) -> bool:
    return kind in BUILTINS


def target(kind: str) -> tuple[str, str | None]:
    """``(\"module:Class\", distribution version or None)`` that ``kind`` names, or EncodingError."""
    if kind in BUILTINS:
        return BUILTINS[kind], None
    eps = entry_points()
    if kind in eps:
        ep = eps[kind]
        dist = getattr(ep, "dist", None)
        return ep.value, (f"{dist.name}=={dist.version}" if dist is not None else None)
    if _TARGET.fullmatch(kind):
        return kind, None
    from phaselab.workloads.config import suggest

    hint = suggest(kind, names())
    raise EncodingError(f"unknown pe.kind {kind!r}" + (f"; did you mean {hint!r}?" if hint else "")
                        + f" (registered: {', '.join(names())}; or \"package.module:Class\")")


def load(kind: str) -> Any:
    """The encoding class ``kind`` names (imports its module); EncodingError naming the plugin."""
    value, _ = target(kind)
    module_name, _, attr = value.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any failure of a plugin's import is reported as such
        raise EncodingError(f"encoding plugin {kind!r}: importing {module_name!r} failed: "
                            f"{type(err).__name__}: {err}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise EncodingError(f"encoding plugin {kind!r}: module {module_name!r} has no {attr!r}")
    from phaselab.workloads.models.positional.base import PositionalEncoding

    if not (isinstance(cls, type) and issubclass(cls, PositionalEncoding)):
        raise EncodingError(f"encoding plugin {kind!r}: {value} is not a PositionalEncoding subclass")
    return cls


def check_plugin(pe_cfg: Any) -> None:
    """Import the plugin ``pe_cfg.kind``, check ``pe_cfg.options`` against its config dataclass and
    run it once at a tiny shape (H=2, D=8, T=4): q/k and the score keep their shapes. Raises
    EncodingError naming the plugin (the grid's location is added by the config converter)."""
    cls = load(pe_cfg.kind)
    cls.parse_options(pe_cfg.options, kind=pe_cfg.kind)
    try:
        _tiny_forward(cls, pe_cfg)
    except EncodingError:
        raise
    except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as the plugin's
        raise EncodingError(f"encoding plugin {pe_cfg.kind!r} failed on a tiny input (H=2, D=8, T=4): "
                            f"{type(err).__name__}: {err}") from None


def _tiny_forward(cls: Any, pe_cfg: Any) -> None:
    import torch

    H, D, T = 2, 8, 4
    pe = cls(pe_cfg, n_head=H, n_kv_head=H, head_dim=D)
    q, k = torch.randn(1, T, H, D), torch.randn(1, T, H, D)
    pos = torch.arange(T)[None]
    q2, k2 = pe.prepare_qk(q, k, pos, pos)
    for name, got, want in (("q", q2, q), ("k", k2, k)):
        width = pe.qk_width(D)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (1, T, H, width):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise EncodingError(f"encoding plugin {pe_cfg.kind!r}: prepare_qk returned {name} of shape "
                                f"{shape}, expected {(1, T, H, width)} (B, T, H, qk_width)")
    mod = pe.score_mod()
    if mod is not None and mod.kind == "custom":
        from phaselab.kernels.common.score_mod import apply_score_fn

        apply_score_fn(mod, torch.randn(1, H, T, T), pos, pos)
    if mod is not None and mod.kind == "relbias":
        _check_table(pe, mod, H, T, pe_cfg.kind)


def _check_table(pe: Any, mod: Any, H: int, T: int, kind: str) -> None:
    """The table has shape [H, N] over signed distances (both signs: non-causal calls) and, when the
    encoding also writes `score`, agrees with it (one definition, two forms)."""
    import torch

    from phaselab.kernels.common.score_mod import ScoreMod, apply_score_fn, bias_table, distance_bias
    from phaselab.workloads.models.positional.base import PositionalEncoding

    bias_table(mod, torch.arange(-T + 1, T), H, torch.float32)   # ValueError naming the encoding
    if type(pe).score is PositionalEncoding.score:   # no `score` of its own to compare
        return
    pos = torch.arange(T)[None]
    zeros = torch.zeros(1, H, T, T, dtype=torch.float64)
    general = apply_score_fn(ScoreMod(kind="custom", params={"fn": pe.score, "name": kind}), zeros, pos, pos)
    table = distance_bias(mod, pos, pos, H, torch.float64)
    if not torch.allclose(general, table, rtol=1e-5, atol=1e-6):
        raise EncodingError(f"encoding plugin {kind!r}: bias_table() and score() disagree on a tiny input "
                            f"(largest difference {float((general - table).abs().max()):.3g})")
