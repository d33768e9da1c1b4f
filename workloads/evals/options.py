"""The option configs of the evaluation suites that take one (``ppl`` of ``ppl-by-length``,
``niah`` of ``niah``; ``api.SUITE_TABLE``): plain dataclasses without torch, so that planning a
grid validates an eval section without importing it; ``perplexity.py`` and ``niah.py`` run them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class PplConfig:
    """Perplexity-by-length settings (spec keys of the ``ppl-by-length`` suite).

    lengths:    context lengths L to evaluate, e.g. (256, 512, 1024).
    mode:       "nonoverlap" | "sliding" (perplexity.py's docstring).
    stride:     sliding stride s, 1 ≤ s ≤ L (TAPA: 256). Ignored for "nonoverlap".
    batch_size: windows per forward pass.
    max_tokens: stop adding windows (in document order) once this many targets are scored at a
                length; None scores everything. The count actually used is always reported.
    """

    lengths: tuple[int, ...]
    mode: Literal["nonoverlap", "sliding"] = "nonoverlap"
    stride: int = 256
    batch_size: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.lengths or any(int(n) < 1 for n in self.lengths):
            raise ValueError(f"ppl lengths must be positive integers, got {self.lengths!r}")
        if self.mode not in ("nonoverlap", "sliding"):
            raise ValueError(f"ppl mode must be 'nonoverlap' or 'sliding', got {self.mode!r}")
        if self.stride < 1:
            raise ValueError(f"ppl stride must be >= 1, got {self.stride!r}")
        if self.batch_size < 1:
            raise ValueError(f"ppl batch_size must be >= 1, got {self.batch_size!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"ppl max_tokens must be >= 1 or None, got {self.max_tokens!r}")


@dataclass(frozen=True, kw_only=True)
class NiahConfig:
    """NIAH grid (spec key ``niah``). lengths: context lengths L; depths in [0, 1]; trials per
    cell; seed; stop_below: accuracy threshold for marking longer lengths not attempted (None:
    run everything); batch_size: trials decoded together; cache_dir: sample cache (None: the
    data cache folder /niah); answer: "digits" (the papers' 7-digit number) | "letters"."""

    lengths: tuple[int, ...]
    depths: tuple[float, ...] = tuple(i / 10 for i in range(11))
    trials: int = 10
    seed: int = 0
    stop_below: float | None = None
    batch_size: int = 1
    cache_dir: str | None = None
    answer: Literal["digits", "letters"] = "digits"

    def __post_init__(self) -> None:
        if not self.lengths or any(n < 1 for n in self.lengths):
            raise ValueError(f"niah lengths must be positive, got {self.lengths!r}")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"niah depths must lie in [0, 1], got {self.depths!r}")
        if self.trials < 1 or self.batch_size < 1:
            raise ValueError(f"niah trials and batch_size must be >= 1, got {self.trials!r}, {self.batch_size!r}")
