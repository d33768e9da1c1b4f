"""DeepSpeed ZeRO 0-3 behind the loop's Engine interface (loop.py), and its checkpoints.

The DeepSpeed config is generated from TrainConfig, never written by hand:
micro-batch = batch_size / (grad_accum * world), accumulation, clipping, ZeRO stage, bf16 on GPU
and fp32 on CPU. The optimiser is our own torch AdamW with phaselab's parameter groups, passed as
DeepSpeed's *client optimizer* (STACK.md: on CPU this avoids JIT-building ``fused_adam``, ~49 s);
the loop sets each group's lr from the schedule, so no DeepSpeed scheduler is configured.

CPU settings that work (STACK.md, DeepSpeed 0.19.8): ``DS_ACCELERATOR=cpu`` set before deepspeed
is imported, ``deepspeed.init_distributed(dist_backend="gloo")``, ``TORCH_EXTENSIONS_DIR`` inside
the repository's ignored ``.torch_extensions/`` (the first comm init JIT-compiles
``deepspeed_shm_comm``, ~30 s, cached there). ``configure_environment()`` applies them.

PoPE's δ projection under ZeRO: ZeRO 1-3 keep a separate fp32 master copy that the next step
copies back over the working weights, so projecting only the module's parameter (what
``model.after_optimizer_step`` does) would be undone. After the projection we write the projected
entries into the master copy with ``deepspeed.utils.safe_set_full_fp32_param`` (ZeRO-3: inside
``GatheredParameters``). The formula itself stays in the model (one home).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from phaselab.workloads.train.config import TrainConfig
from phaselab.workloads.train.loop import check_finite
from phaselab.workloads.train.optim import build_optimizer, is_delta, set_lr

_REPO_ROOT = Path(__file__).resolve().parents[2]


def configure_environment() -> None:
    """Environment DeepSpeed reads at import time (call before ``import deepspeed``)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if (_REPO_ROOT / "pyproject.toml").is_file():  # a source checkout: keep JIT ops in the repo
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_REPO_ROOT / ".torch_extensions"))


def prebuild_comm_op() -> str:
    """Build the JIT op that DeepSpeed's comm init loads on this machine (``deepspeed_shm_comm`` on
    CPU, ~30 s of C++ compile once) into ``TORCH_EXTENSIONS_DIR``, so that the first fit finds it
    cached; ``make install`` calls it (``python -m phaselab.workloads.train.deepspeed_engine``).
    Returns the op's name, or ``"none"`` where the accelerator's comm init loads none."""
    configure_environment()
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return "none"  # the same test as deepspeed.comm.torch.build_shm_op
    builder.load()
    return builder.absolute_name()


def deepspeed_config(cfg: TrainConfig, *, world: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed JSON config derived from ``cfg`` (``cfg.zero_stage`` must be set)."""
    if cfg.zero_stage is None:
        raise ValueError("deepspeed_config needs train.zero_stage in 0-3, got None")
    return {
        "train_batch_size": cfg.batch_size,
        "train_micro_batch_size_per_gpu": cfg.micro_batch(world),
        "gradient_accumulation_steps": cfg.grad_accum,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,  # torch AdamW as the client optimizer
        "steps_per_print": 2**31 - 1,  # we log through the Tracker
        "wall_clock_breakdown": False,
    }


class DeepSpeedEngine:
    """Loop engine on ``deepspeed.initialize`` (same micro_step/optimizer_step as TorchEngine).

    Args:
        model: the Transformer (on CPU or its device; DeepSpeed moves it).
        cfg: TrainConfig with ``zero_stage`` set.
        world: data-parallel world size.
        device: this rank's device.
    """

    def __init__(self, model: nn.Module, cfg: TrainConfig, *, world: int, device: torch.device) -> None:
        configure_environment()
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
        bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
        optimizer = build_optimizer(model, cfg.optim, allow_fused=False)
        self.ds, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(cfg, world=world, bf16=bf16))
        self.module: nn.Module = self.ds.module
        self.device = device
        self.autocast = contextlib.nullcontext  # DeepSpeed casts the module itself (bf16 config)
        self.zero_stage = cfg.zero_stage
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self._deltas = [p for n, p in self.module.named_parameters() if is_delta(n)]

    def micro_step(self, batch: Any, *, step: int, last: bool) -> float:
        x, y, m = (t.to(self.device) for t in (batch.x_BT, batch.y_BT, batch.mask_BT))
        # loss only (the fused LM-head loss on CUDA), except under ZeRO-3: its partitioned
        # lm_head weight is gathered only inside lm_head's own forward, which the fused loss skips
        _, loss = self.ds(x, targets_BT=y, loss_mask_BT=m, logits=self.zero_stage == 3)
        value = check_finite(loss.detach(), step=step, what="loss")
        self.ds.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself
        if not last:
            self.ds.step()  # DeepSpeed counts micro-steps; it updates only at the boundary
        return value

    def optimizer_step(self, lr: float, losses: list[float], *, step: int) -> tuple[list[float], float]:
        own_norm = None
        if self.zero_stage == 0:  # stage 0 does not record the norm; grads are all-reduced here
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            own_norm = torch.nn.utils.get_total_norm(grads)
        set_lr(self.ds.optimizer, lr)
        self.ds.step()
        norm = own_norm if own_norm is not None else self.ds.get_global_grad_norm()
        grad_norm = check_finite(norm if norm is not None else float("nan"), step=step, what="grad_norm")
        self._project_deltas()
        return [float(v) for v in losses], grad_norm  # micro_step already checked and copied each loss

    def _project_deltas(self) -> None:
        if not self._deltas:
            return
        from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

        gather = contextlib.nullcontext()
        if self.zero_stage == 3:
            import deepspeed
            gather = deepspeed.zero.GatheredParameters(self._deltas, modifier_rank=0)
        with gather:
            before = [p.detach().clone() for p in self._deltas]
            self.module.after_optimizer_step()
            for p, old in zip(self._deltas, before):
                master = safe_get_full_fp32_param(p)  # collective on ZeRO 1-3; None on stage 0
                if master is None:
                    continue
                changed = p.detach() != old
                safe_set_full_fp32_param(p, torch.where(changed, p.detach().float(), master))

    def save(self, directory: Path, *, tag: str, client_state: dict[str, Any]) -> None:
        """Every rank writes its shards (DESIGN §5.7 step 1)."""
        self.ds.save_checkpoint(str(directory), tag=tag, client_state=client_state)

    def load(self, directory: Path) -> dict[str, Any]:
        """Load the checkpoint named by ``directory/latest``; returns the client state."""
        tag = (Path(directory) / "latest").read_text().strip()
        path, client_state = self.ds.load_checkpoint(str(directory), tag=tag)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag!r} from {directory}")
        if self.zero_stage == 3:
            # load_checkpoint leaves gathered parameters behind; ZeRO-3 then records a fetch trace
            # without them and the replay fails ("tracing error at step N"). Re-partition first.
            self.ds.empty_partition_cache()
        return client_state

    @contextlib.contextmanager
    def full_weights(self):
        """Full (un-partitioned) weights on every rank for the duration (ZeRO-3 gathers)."""
        if self.zero_stage == 3:
            import deepspeed
            with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
                yield self.module
        else:
            yield self.module


if __name__ == "__main__":
    print(f"DeepSpeed comm op ready: {prebuild_comm_op()}")
