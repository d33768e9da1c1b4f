"""``resources.gpus: auto``, the default: how many stages share one GPU.

The rule (docs/GRID_REFERENCE.md, ``resources``; docs/TUTORIAL.md, "Packing stages on a GPU"):

1. An explicit number in the grid always wins (``gpus: 1``, ``gpus: 0.3``, ``gpus: 0``).
2. A stage kind that uses no model (``dataset``, ``noop``) gets 0.
3. A stage that pins its device to the CPU (``train.device: cpu``, ``eval.device: cpu``) gets 0.
4. No GPU where the stages will run (the local cluster's GPUs, ``nvidia-smi``) gets 0.
5. A Ray Train stage (``launcher: ray_train``: several workers or ZeRO) gets 1 GPU per worker.
6. Otherwise the stage's GPU memory is estimated from its model config (:func:`stage_memory`) and
   the stage gets ``1/k`` of a GPU, ``k = min(MAX_PACK, floor(HEADROOM x GPU memory / estimate))``
   and at least 1: 1, 1/2, 1/3 or 1/4. Where nothing can be estimated (no model config) it gets 1.

``MAX_PACK`` is 4 because packing pays through overlap, not through more processes: on the H200,
N processes of a small graph-captured step reach 1.25x (2) and 1.28x (4) one process's
throughput under CUDA MPS and 0.98x at 8 (``benchmarks/results/gpu-sharing-h200.md``); 2-8
packed ``ii-8l512`` stages through ``phaselab run`` reach 1.40-1.43x
(``benchmarks/results/small-models-h200-pack.md``). Without MPS the driver time-slices the
processes' kernels; packed stages then still overlap each other's start-up, data loading,
evaluation and checkpoints, which is what leaves a small stage's GPU idle.

The estimate is deliberately generous (AdamW in fp32: 16 bytes a parameter; the activations of
Korthikanti et al. 2022, "Reducing Activation Recomputation", 34 bytes per token and width a
layer in 16-bit, doubled for fp32, plus the B x H x T x T scores where the attention backend
materialises them; fp32 logits and their gradient; x1.5 for the caching allocator and graph
pools; 2 GiB per process for the CUDA context, kernels and workspaces). Resources are not part
of a stage's cache key, so the rule changes no stage hash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

AUTO = "auto"
NO_GPU = "no GPU where it runs"   # the reason ``phaselab plan`` warns about (plan/placement.py)
MAX_PACK = 4
HEADROOM = 0.8          # of a GPU's memory the packed stages may plan on
MARGIN = 1.5            # caching allocator, CUDA graph pools, fragmentation
PROCESS_BYTES = 2 * 2**30   # CUDA context, loaded kernels, cuBLAS / cuDNN workspaces
GIB = 2**30


def param_count(model: Mapping[str, Any]) -> int:
    """Parameters of a ModelConfig dict (``workloads/models/config.py``), from its shape."""
    d, n_layer, n_head = int(model["d_model"]), int(model["n_layer"]), int(model["n_head"])
    head = d // max(1, n_head)
    kv = int(model.get("n_kv_head") or n_head) * head
    hidden = round(float(model.get("mlp_ratio", 4.0)) * d)
    mlp = (3 if model.get("mlp") == "swiglu" else 2) * d * hidden
    multiple = int(model.get("vocab_multiple") or 1)
    vocab = -(-int(model["vocab_size"]) // multiple) * multiple
    embed = vocab * d * (1 if model.get("tie_embeddings", True) else 2)
    return n_layer * (2 * d * d + 2 * d * kv + mlp + 2 * d) + embed + d


def _materialises_scores(model: Mapping[str, Any]) -> bool:
    return ((model.get("attention") or {}).get("backend") or "auto") == "reference"


def activation_bytes(model: Mapping[str, Any], batch: int, length: int, *, training: bool) -> float:
    """Activations of one batch: every layer's (training) or one layer's (inference) plus the
    logits (and their gradient when training)."""
    d, n_layer, n_head = int(model["d_model"]), int(model["n_layer"]), int(model["n_head"])
    per_token = 2 * 34 * d + (2 * 5 * n_head * length if _materialises_scores(model) else 0)
    layers = n_layer if training else 1
    logits = batch * length * int(model["vocab_size"]) * (8 if training else 4)
    return batch * length * per_token * layers + logits


def training_memory(model: Mapping[str, Any], batch: int, length: int) -> float:
    """Bytes a training stage of ``model`` holds on its GPU at micro-batch ``batch`` x ``length``."""
    state = 16 * param_count(model)
    return MARGIN * (state + activation_bytes(model, batch, length, training=True)) + PROCESS_BYTES


def inference_memory(model: Mapping[str, Any], batch: int, length: int) -> float:
    """Bytes an evaluation of ``model`` holds at ``batch`` x ``length`` (fp32 weights, no grads)."""
    weights = 4 * param_count(model)
    return MARGIN * (weights + activation_bytes(model, batch, length, training=False)) + PROCESS_BYTES


def _eval_shape(config: Mapping[str, Any], model: Mapping[str, Any]) -> tuple[int, int]:
    """(batch, longest length) an eval or analysis stage runs at: the largest ``batch_size`` and
    ``lengths`` / ``max_length`` / block size anywhere in its ``eval`` section."""
    batches, lengths = [1], [int(model.get("block_size") or 1)]

    def walk(obj: Any) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                if k == "batch_size" and isinstance(v, int):
                    batches.append(v)
                elif k in ("lengths", "max_length", "block_size") and v:
                    lengths.extend(int(x) for x in (v if isinstance(v, list) else [v]) if isinstance(x, int))
                else:
                    walk(v)

    walk(config.get("eval") or {})
    ext = config.get("extend") or {}
    if ext.get("block_size"):
        lengths.append(int(ext["block_size"]))
    return max(batches), max(lengths)


def stage_memory(config: Mapping[str, Any], model: Mapping[str, Any] | None) -> float | None:
    """Bytes the stage is expected to hold on its GPU: training at its ``train`` micro-batch and
    block size, else evaluating ``model`` (its own or its upstream's) at its eval shape; None
    without a model config."""
    if not model:
        return None
    train = config.get("train")
    if train:
        block = (config.get("extend") or {}).get("block_size") or (config.get("data") or {}).get("block_size") \
            or model.get("block_size") or 1
        batch = max(1, int(train.get("batch_size") or 1) // max(1, int(train.get("grad_accum") or 1)))
        return training_memory(model, batch, int(block))
    return inference_memory(model, *_eval_shape(config, model))


def pack_fraction(estimate: float, gpu_memory: float) -> tuple[float, int]:
    """(the fraction of a GPU, stages per GPU) for a stage of ``estimate`` bytes on a GPU of
    ``gpu_memory`` bytes: ``1/k``, rounded down to Ray's 4 decimals so ``k`` of them fit."""
    k = max(1, min(MAX_PACK, math.floor(HEADROOM * gpu_memory / max(estimate, 1.0))))
    return math.floor(10_000 / k) / 10_000, k


def pins_cpu(config: Mapping[str, Any]) -> bool:
    """Whether the stage's config runs it on the CPU whatever the cluster offers."""
    return any(((config.get(s) or {}).get("device") or "auto") == "cpu" for s in ("train", "eval"))


def resolve(*, uses_gpu: bool, config: Mapping[str, Any], model: Mapping[str, Any] | None, launcher: str,
            gpu: Mapping[str, Any] | None) -> tuple[float, str]:
    """(gpus, why) for a stage whose grid left ``resources.gpus`` to the rule (module docstring).
    ``gpu``: the GPU the stages will run on, ``{"name", "memory_bytes" (None: unknown), "source"}``,
    or None when there is none."""
    if not uses_gpu:
        return 0.0, "this kind uses no GPU"
    if pins_cpu(config):
        return 0.0, "its device is cpu"
    if gpu is None:
        return 0.0, NO_GPU
    if launcher == "ray_train":
        return 1.0, "Ray Train workers get whole GPUs"
    estimate = stage_memory(config, model)
    if estimate is None:
        return 1.0, "no model config to estimate its memory from"
    if not gpu.get("memory_bytes"):
        return 1.0, f"the memory of {gpu.get('name') or 'the GPU'} is unknown (set PHASELAB_GPU_MEMORY_GB)"
    fraction, k = pack_fraction(estimate, gpu["memory_bytes"])
    return fraction, (f"~{estimate / GIB:.1f} GiB estimated of the {gpu['memory_bytes'] / GIB:.0f} GiB "
                      f"{gpu.get('name') or 'GPU'}: {k} per GPU" + (" (at most)" if k == MAX_PACK else ""))
