"""phaselab.workloads.data: datasets behind one config and one registry (CONTRACTS §3.3).

`build_dataset(DataConfig(kind=...))` resolves the kind through a lazy "module:Class" registry
(so importing this package pulls in neither torch nor any dataset module) and returns an object
following the `Dataset` protocol:

    ds = build_dataset(DataConfig(kind="indirect_indexing"))
    batch = ds.get_batch("train", index=0, batch_size=64, seed=0)  # pure function of its arguments
    for b in ds.eval_batches("test", batch_size=256): ...            # fixed order, whole split

Every dataset has `name`, `vocab_size`, `block_size`, `splits` and `digest` (sha256 of the source
bytes and the tokenisation config; it goes into stage cache keys). Token-stream datasets also
expose `tokens(split) -> np.ndarray` and `tokenizer` (encode/decode/eot_token_id).

Per-kind settings live in nested configs named as in EXPERIMENTS.md (`ii.*`, `jsb.*`, ...).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch only for annotations: importing this package must stay torch-free
    import numpy as np
    import torch

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
SPLITS = ("train", "valid", "test")
# Distinct integers mixed into every seed so the three splits draw from disjoint streams.
SPLIT_CODES = {"train": 1, "valid": 2, "test": 3}


# --------------------------------------------------------------------------------------------
# Configs (frozen, kw-only; converted from YAML by phaselab.workloads.config.from_dict)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class IndirectIndexingConfig:
    """EXPERIMENTS §2.1. Sizes default to the paper's 1M/10k/10k (examples are generated lazily,
    so a large split costs nothing until read); CI recipes shrink n_valid/n_test."""

    n_min: int = 20
    n_max: int = 40
    max_shift: int = 15
    out_of_range: Literal["resample", "shift_first"] = "resample"  # not specified in the paper
    allow_zero_shift: bool = True  # k = 0 written "+0" (not specified in the paper)
    include_spaces: bool = False  # paper prints ", "; phaselab drops spaces by default
    n_train: int = 1_000_000
    n_valid: int = 10_000
    n_test: int = 10_000


@dataclass(frozen=True, kw_only=True)
class JsbConfig:
    """EXPERIMENTS §2.2: raster order, PAD=0, silence=1, pitch p -> p-19, no BOS."""

    path: str = "Jsb16thSeparated.json"  # relative to assets/, or an explicit absolute path
    long_sequence_policy: Literal["split", "truncate"] = "split"  # split: block_size//4-step windows
    # padded: each training row is one chorale, padded to the batch's longest (EXPERIMENTS §2.2);
    # packed: each row is a random block_size window of the training chorales concatenated in
    # file order (nanoGPT-style, every position scored). Evaluation is per chorale either way.
    train_batches: Literal["padded", "packed"] = "padded"


@dataclass(frozen=True, kw_only=True)
class TextConfig:
    """Text from a file, a folder of .txt files or a glob (default: Tiny Shakespeare), files in
    sorted order, first `train_fraction` of the characters train, the rest valid (text_sources).
    tokenizer: 'char', 'gpt2' (offline) or 'tiktoken:<encoding>'."""

    path: str = "tinyshakespeare.txt"
    tokenizer: str = "char"
    train_fraction: float = 0.9


@dataclass(frozen=True, kw_only=True)
class DnaConfig:
    """DNA stand-in for the genome task (EXPERIMENTS §2.2/§4): phage lambda shipped offline."""

    path: str = "lambda_virus.fa.gz"  # FASTA (.fa/.fa.gz); relative to assets/ or absolute
    tokenizer: Literal["6mer", "char"] = "6mer"  # 6mer: vocab 4107 (Nucleotide Transformer style)
    valid_fraction: float = 0.1  # the last fraction of the sequence is held out


@dataclass(frozen=True, kw_only=True)
class MaestroConfig:
    """MAESTRO v3.0.0 (real scale only): miditok REMI, random 90/5/5 split of pieces."""

    root: str | None = None  # extracted maestro-v3.0.0/ (absolute or under cache_dir); None -> download
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    max_transpose: int = 3  # training pieces shifted by U{-3..+3} semitones


@dataclass(frozen=True, kw_only=True)
class RealScaleConfig:
    """Network-backed corpora (OpenWebText, PG-19, human genome) and pre-tokenised shards
    (real_scale.py). Prepared shards are reused whenever their meta.json matches."""

    # Paths here are absolute or relative to the cache dir (data.cache_dir).
    shards_dir: str | None = None  # nanoGPT-style <split>.bin + meta.json; None -> cache_dir/<kind>-<tok>
    hf_name: str | None = None  # override the Hugging Face dataset id (e.g. a mirror)
    hf_config: str | None = None
    splits: tuple[str, ...] = ()  # () -> the kind's default (pg19: test only)
    fasta: str | None = None  # human genome: an explicit hg38 FASTA instead of Hugging Face
    valid_records: tuple[str, ...] = ("chr21",)  # FASTA records held out (phaselab's choice)
    test_records: tuple[str, ...] = ("chr22",)
    val_fraction: float = 0.0005  # OpenWebText held-out fraction (nanoGPT's prepare.py)
    num_proc: int = 8
    # kind "tokens" over a nanoGPT folder without meta.json (train.bin, val.bin, test.bin): the
    # token dtype (None: uint16 when vocab_size <= 65536, else int32) and the vocabulary size
    dtype: Literal["uint16", "uint32", "int32", "int64"] | None = None
    vocab_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which dataset, its sequence length and its per-kind settings.

    kind: a registered name (see `registered_kinds()`). block_size: None means the kind's
    paper default (ii 48, jsb 2048, text 256, dna 1000, maestro 2048, openwebtext/pg19 1024).
    seed: the *data* seed (generated content, random splits); the training seed passed to
    `get_batch` only orders batches. cache_dir: absolute, or relative to $PHASELAB_CACHE_DIR
    (default ~/.cache/phaselab). num_workers: processes that build the training batches ahead of
    the graph-captured step (``train.cuda_graphs``): -1 chooses (up to 4 on CUDA, none on CPU),
    0 builds them in one background thread. Batches are a pure function of their index, so the
    stream is the same for every value (not part of a cache key).
    """

    kind: str = "indirect_indexing"
    block_size: int | None = None
    seed: int = 0
    cache_dir: str | None = None
    num_workers: int = -1
    ii: IndirectIndexingConfig = field(default_factory=IndirectIndexingConfig)
    jsb: JsbConfig = field(default_factory=JsbConfig)
    text: TextConfig = field(default_factory=TextConfig)
    dna: DnaConfig = field(default_factory=DnaConfig)
    maestro: MaestroConfig = field(default_factory=MaestroConfig)
    real: RealScaleConfig = field(default_factory=RealScaleConfig)

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < -1:
            raise ValueError(f"data.num_workers must be an int >= -1 (-1 = choose), got {self.num_workers!r}")


# --------------------------------------------------------------------------------------------
# Batch and the Dataset protocol
# --------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """One batch: inputs x_BT (int64), next-token targets y_BT (int64) and the loss mask mask_BT
    (float32, 1 where the target is scored). Padding positions carry PAD in x and y and 0 in mask."""

    x_BT: torch.Tensor
    y_BT: torch.Tensor
    mask_BT: torch.Tensor

    @property
    def n_scored(self) -> int:
        """Number of scored target tokens (the denominator of a token-weighted mean)."""
        return int(self.mask_BT.sum().item())

    def to(self, device: Any, *, non_blocking: bool = False) -> Batch:
        return Batch(
            x_BT=self.x_BT.to(device, non_blocking=non_blocking),
            y_BT=self.y_BT.to(device, non_blocking=non_blocking),
            mask_BT=self.mask_BT.to(device, non_blocking=non_blocking),
        )


def make_batch(x_BT: np.ndarray, y_BT: np.ndarray, mask_BT: np.ndarray) -> Batch:
    """numpy int arrays [B, T] (and a 0/1 mask) -> Batch of torch tensors (int64, int64, float32)."""
    import numpy as np
    import torch

    if not (x_BT.shape == y_BT.shape == mask_BT.shape) or x_BT.ndim != 2:
        raise ValueError(f"batch arrays must share one [B, T] shape, got {x_BT.shape}, {y_BT.shape}, "
                         f"{mask_BT.shape}")
    return Batch(
        x_BT=torch.from_numpy(np.ascontiguousarray(x_BT, dtype=np.int64)),
        y_BT=torch.from_numpy(np.ascontiguousarray(y_BT, dtype=np.int64)),
        mask_BT=torch.from_numpy(np.ascontiguousarray(mask_BT, dtype=np.float32)),
    )


@runtime_checkable
class Dataset(Protocol):
    name: str
    vocab_size: int
    block_size: int
    digest: str
    splits: tuple[str, ...]

    def get_batch(self, split: str, index: int, batch_size: int, *, seed: int) -> Batch: ...

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]: ...


# --------------------------------------------------------------------------------------------
# Registry: kind -> lazy "module:Class" (the class has `from_config(cfg: DataConfig)`)
# --------------------------------------------------------------------------------------------
_REGISTRY: dict[str, str] = {
    "indirect_indexing": "phaselab.workloads.data.indirect_indexing:IndirectIndexing",
    "jsb": "phaselab.workloads.data.jsb:JsbChorales",
    "text": "phaselab.workloads.data.text:TextDataset",
    "dna": "phaselab.workloads.data.dna:DnaDataset",
    "maestro": "phaselab.workloads.data.music:Maestro",
    "openwebtext": "phaselab.workloads.data.real_scale:OpenWebText",
    "pg19": "phaselab.workloads.data.real_scale:PG19",
    "human_genome": "phaselab.workloads.data.real_scale:HumanGenome",
    "tokens": "phaselab.workloads.data.real_scale:MemmapTokens",
}


def register(kind: str, target: str) -> None:
    """Register a dataset kind as a lazy "package.module:Class" string."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"register target must be 'module:Class', got {target!r}")
    _REGISTRY[kind] = target


def registered_kinds() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def build_dataset(cfg: DataConfig) -> Dataset:
    """Build the dataset named by `cfg.kind` (imports its module only now)."""
    if not isinstance(cfg, DataConfig):
        raise TypeError(f"build_dataset expects a DataConfig, got {type(cfg).__name__}")
    if cfg.kind not in _REGISTRY:
        raise ValueError(f"unknown data kind {cfg.kind!r}; registered: {', '.join(registered_kinds())}")
    if cfg.block_size is not None and (not isinstance(cfg.block_size, int) or cfg.block_size < 2):
        raise ValueError(f"data.block_size must be an int >= 2, got {cfg.block_size!r}")
    if not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ValueError(f"data.seed must be a non-negative int, got {cfg.seed!r}")
    module_name, cls_name = _REGISTRY[cfg.kind].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls.from_config(cfg)


# --------------------------------------------------------------------------------------------
# Small shared helpers (paths, digests, deterministic orders, optional extras)
# --------------------------------------------------------------------------------------------
class MissingExtraError(ImportError):
    """An optional dependency is absent; the message names the pip extra that provides it."""


def require(module: str, *, extra: str, purpose: str) -> Any:
    """Import an optional module or raise MissingExtraError naming `pip install phaselab[extra]`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{purpose} needs the optional package {module!r}, which is not installed; "
            f"install it with `pip install phaselab[{extra}]`"
        ) from exc


def resolve_path(value: str, *, root: Path, what: str) -> Path:
    """A config path -> an existing Path. Relative paths are taken under `root` and may not
    escape it ('..' or symlinks out); absolute paths are an explicit user choice and allowed."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty path string, got {value!r}")
    p = Path(value).expanduser()
    if p.is_absolute():
        out = p.resolve()
    else:
        base = root.resolve()
        out = (base / p).resolve()
        if not out.is_relative_to(base):
            raise ValueError(f"{what}={value!r} escapes its allowed root {base}; pass an absolute path")
    return out


def cache_root(cache_dir: str | None) -> Path:
    """The cache directory for downloads and prepared shards (created on demand)."""
    base = Path(os.environ.get("PHASELAB_CACHE_DIR", Path.home() / ".cache" / "phaselab"))
    out = resolve_path(cache_dir, root=base, what="data.cache_dir") if cache_dir else base.resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (memoised on path, size and mtime)."""
    st = Path(path).stat()
    return _file_sha256(str(path), st.st_size, st.st_mtime_ns)


def make_digest(source_sha256: str, config: Mapping[str, Any] | Any) -> str:
    """sha256 over the source bytes' digest and the canonical JSON of the tokenisation config."""
    if hasattr(config, "__dataclass_fields__"):
        config = asdict(config)
    payload = json.dumps({"source": source_sha256, "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def check_split(split: str, splits: tuple[str, ...]) -> None:
    if split not in splits:
        raise ValueError(f"unknown split {split!r}; this dataset has {splits}")


def check_batch_args(index: int, batch_size: int, seed: int) -> None:
    for name, v, lo in (("index", index, 0), ("batch_size", batch_size, 1), ("seed", seed, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


def batch_rng(*key: int) -> np.random.Generator:
    """A numpy Generator that is a pure function of the integer key (SeedSequence entropy)."""
    import numpy as np

    return np.random.default_rng([int(k) for k in key])


@functools.lru_cache(maxsize=4)
def _permutation(n: int, *key: int) -> np.ndarray:
    return batch_rng(*key).permutation(n)


def epoch_order(n: int, index: int, batch_size: int, *key: int) -> np.ndarray:
    """Example ids of batch `index` when a split of n examples is read in epochs, each epoch a
    fresh permutation seeded by (key, epoch): every example once per epoch, and the ids are a
    pure function of (n, index, batch_size, key), so a resumed run reads the same batches."""
    import numpy as np

    pos = np.arange(index * batch_size, (index + 1) * batch_size, dtype=np.int64)
    epochs, within = np.divmod(pos, n)
    out = np.empty(batch_size, dtype=np.int64)
    for e in np.unique(epochs):
        sel = epochs == e
        out[sel] = _permutation(n, *key, int(e))[within[sel]]
    return out


def token_dtype(vocab_size: int) -> Any:
    """uint16 for vocabularies that fit (GPT-2, nanoGPT's shards), else int32."""
    import numpy as np

    return np.uint16 if vocab_size <= 65536 else np.int32


__all__ = [
    "ASSETS_DIR", "SPLITS", "Batch", "DataConfig", "Dataset", "DnaConfig", "IndirectIndexingConfig",
    "JsbConfig", "MaestroConfig", "MissingExtraError", "RealScaleConfig", "TextConfig",
    "build_dataset", "make_batch", "register", "registered_kinds",
]
