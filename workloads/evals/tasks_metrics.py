"""Task metrics over a whole dataset split (EXPERIMENTS §2.1, §2.2).

- ``target_accuracy``: Indirect Indexing exact-match (argmax) accuracy on the single scored target
  token of each example (the data package's ``indirect_indexing.target_accuracy`` per batch).
- ``split_nll``: test NLL per token for JSB / DNA / any masked dataset, the paper's definition: the
  mean over scored tokens of −log p(target), nats/token. Which tokens are scored is the dataset's
  loss mask: for JSB (no BOS) the first token of every chorale is never a target, padding is
  unscored; for DNA every next 6-mer of a window.

Both read ``dataset.eval_batches(split, batch_size)`` (fixed order, whole split) and accept
``max_batches`` to cap the work (recorded in ``n``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from phaselab.workloads.evals.perplexity import autocast, model_device, token_logprobs


@dataclass(frozen=True)
class TaskResult:
    name: str  # "acc" | "nll"
    value: float
    unit: str
    n: int  # examples (acc) or scored tokens (nll)


def _batches(dataset, split: str, batch_size: int, max_batches: int | None):
    for i, batch in enumerate(dataset.eval_batches(split, batch_size)):
        if max_batches is not None and i >= max_batches:
            return
        yield batch


@torch.no_grad()
def target_accuracy(model: torch.nn.Module, dataset, split: str, *, batch_size: int = 256,
                    max_batches: int | None = None, precision: str = "auto") -> TaskResult:
    """Indirect Indexing target accuracy over ``split`` (fraction of examples)."""
    from phaselab.workloads.data.indirect_indexing import target_accuracy as batch_accuracy

    device = model_device(model)
    model.eval()
    correct = n = 0
    for batch in _batches(dataset, split, batch_size, max_batches):
        batch = batch.to(device)
        with autocast(device, precision):
            logits_BTV, _ = model(batch.x_BT)
        c, k = batch_accuracy(logits_BTV, batch)
        correct, n = correct + c, n + k
    if n == 0:
        raise ValueError(f"split {split!r} has no scored targets")
    return TaskResult("acc", correct / n, "fraction", n)


@torch.no_grad()
def split_nll(model: torch.nn.Module, dataset, split: str, *, batch_size: int = 8,
              max_batches: int | None = None, precision: str = "auto") -> TaskResult:
    """Mean NLL per scored token over ``split`` (nats/token), token-weighted across batches."""
    device = model_device(model)
    model.eval()
    total, n = 0.0, 0
    for batch in _batches(dataset, split, batch_size, max_batches):
        batch = batch.to(device)
        with autocast(device, precision):
            logits_BTV, _ = model(batch.x_BT)
        lp_BT = token_logprobs(logits_BTV, batch.y_BT)
        total -= float((lp_BT.double() * batch.mask_BT.double()).sum())
        n += int(batch.mask_BT.sum().item())
    if n == 0:
        raise ValueError(f"split {split!r} has no scored tokens")
    return TaskResult("nll", total / n, "nats/token", n)
