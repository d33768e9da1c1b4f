"""Scaling study (benchmarks/scaling.py): what one case is (preset, encoding, ZeRO stage, world size), the
settings every case shares, and the training spec ``fit`` gets.

``benchmarks/scaling.py`` is the command line; ``scaling_measure.py`` runs and measures the fits;
``scaling_report.py`` derives efficiencies and writes the JSON and Markdown results.
"""

from __future__ import annotations

import dataclasses

# NVLink multicast stays off on shared multi-GPU hosts: it can take the whole host down (also in Ray workers).
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# rope -> cuDNN/flash SDPA; pope/tapa -> the fused Triton kernels (kernels/attention). CPU: the reference.
CUDA_BACKENDS = {"rope": "sdpa", "pope": "triton", "tapa": "triton"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    preset: str
    encoding: str
    zero_stage: int
    world: int

    @property
    def key(self) -> str:
        return f"{self.preset}-{self.encoding}-z{self.zero_stage}-w{self.world}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bench:
    """Settings shared by every case. ``max_world`` fixes ``grad_accum * world`` (module doc)."""

    device: str
    steps: int
    warmup_steps: int
    batch_size: int
    max_world: int
    block_size: int
    ckpt_at: int
    lr: float

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if not 0 < self.ckpt_at < self.steps - 2:
            raise ValueError(f"need 0 < ckpt_at={self.ckpt_at} < steps-2={self.steps - 2}")
        if self.warmup_steps + 2 >= self.steps:
            raise ValueError(f"--warmup-steps {self.warmup_steps} leaves no measured step of {self.steps}")
        if self.batch_size % self.max_world:
            raise ValueError(f"--batch {self.batch_size} is not divisible by max(--workers)={self.max_world}")

    @property
    def micro_batch(self) -> int:
        return self.batch_size // self.max_world

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size


def build_spec(case: Case, bench: Bench) -> dict:
    """The training spec ``fit`` gets (CONTRACTS §3.4)."""
    from phaselab.workloads.config import to_dict
    from phaselab.workloads.models.presets import preset

    if bench.device == "cuda":
        model = preset(case.preset, block_size=bench.block_size,
                       pe={"kind": case.encoding}, attention={"backend": CUDA_BACKENDS[case.encoding]})
        data = {"kind": "text", "block_size": bench.block_size, "text": {"tokenizer": "gpt2"}}
        precision = "bf16"
    else:
        model = preset(case.preset, block_size=bench.block_size, pe={"kind": case.encoding})
        data = {"kind": "text", "block_size": bench.block_size, "text": {"tokenizer": "char"}}
        precision = "fp32"
    train = {"steps": bench.steps, "batch_size": bench.batch_size,
             "grad_accum": bench.max_world // case.world, "lr": bench.lr, "min_lr": bench.lr / 10,
             "warmup": min(5, bench.steps // 4), "eval_every": 0, "eval_batches": 2,
             "eval_batch_size": bench.micro_batch, "final_eval_batches": 2, "final_eval_splits": ["valid"],
             "ckpt_every": bench.ckpt_at, "keep_checkpoints": 2, "precision": precision, "seed": 0,
             "log_every": 1, "zero_stage": case.zero_stage}
    return {"model": to_dict(model), "data": data, "train": train}
