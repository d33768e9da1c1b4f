"""One look for every phaselab figure: labels with units, line styles and markers, fonts.

- matplotlib runs headless (Agg) and PDFs embed TrueType fonts (``pdf.fonttype`` 42, no Type 3:
  publishers and arXiv ask for embedded fonts).
- Lines differ by style and marker as well as colour (:data:`STYLES`), so they stay apart in
  greyscale print and for colour-blind readers.
- Axis labels are words with units (:func:`metric_label`, :func:`field_label`), never raw field
  names.

matplotlib is imported inside :func:`pyplot` only (``import phaselab.catalog`` stays light).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

STYLES: tuple[tuple[str, str], ...] = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ("-", "v"),
                                       ("--", "P"), ("-.", "X"), (":", "*"))
_METRICS = {
    "ppl": "perplexity", "nll": "NLL [nats/token]", "loss": "loss [nats/token]", "acc": "accuracy",
    "niah_acc": "NIAH exact-match accuracy", "train/loss": "training loss [nats/token]",
    "valid/loss": "validation loss [nats/token]", "valid/acc": "validation accuracy",
    "test/loss": "test loss [nats/token]", "bpc": "bits per character",
}
_UNITS = {"nats/token": "nats/token", "fraction": "", "ppl": "", "bits/char": "bits/char"}
_FIELDS = {"context_len": "context length [tokens]", "depth": "needle depth", "step": "optimiser step",
           "axes.pe": "positional encoding", "axes.seed": "seed", "axes.size": "model size",
           "axes.lr": "learning rate", "task": "task", "split": "split", "role": "stage"}
ENCODINGS = {"rope": "RoPE", "pope": "PoPE", "tapa": "TAPA", "alibi": "ALiBi", "none": "NoPE",
             "sinusoidal": "sinusoidal", "learned": "learned absolute"}


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend with TrueType fonts in PDFs."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    matplotlib.rcParams["pdf.fonttype"] = 42
    matplotlib.rcParams["ps.fonttype"] = 42
    import matplotlib.pyplot as plt

    return plt


def metric_label(name: str, unit: str = "") -> str:
    """``ppl`` -> ``perplexity``; an unknown name keeps its name and gets its unit in brackets."""
    if name in _METRICS:
        return _METRICS[name]
    unit = _UNITS.get(unit, unit)
    return f"{name} [{unit}]" if unit else name


def field_label(field: str) -> str:
    """``context_len`` -> ``context length [tokens]``; ``axes.foo`` -> ``foo``."""
    return _FIELDS.get(field, field.removeprefix("axes.").replace("_", " "))


def value_label(field: str, value: Any) -> str:
    """How a value of ``field`` reads in a legend: encodings by their papers' names."""
    if field in ("axes.pe", "pe") and isinstance(value, str):
        return ENCODINGS.get(value, value)
    return str(value)


def log2_lengths(ax: Any, xs: Sequence[float], *, train_len: int | None = None) -> None:
    """A log-2 x axis ticked at the evaluated lengths only, with the training length marked."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs), [f"{int(x):,}" if float(x).is_integer() else f"{x:g}" for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())
    if train_len is not None:
        ax.axvline(train_len, color="grey", linestyle="--", linewidth=1, label=f"training length {train_len:,}")


def save(fig: Any, path_base: Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """``path_base.<fmt>`` for each format (folders created); closes the figure."""
    plt = pyplot()
    paths = []
    for fmt in formats:
        path = Path(f"{path_base}.{fmt}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150)
        paths.append(path)
    plt.close(fig)
    return paths
