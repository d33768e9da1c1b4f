"""What ran, reported by the process that ran the model (DESIGN §4): the attention backend of
every call site, the implementation each fused op took and the kernel options it ran with,
determinism, precision, graph mode and the device.

The kernels record what they run as it happens (``kernels.registry.record_use`` per call site,
``record_impl`` per op and implementation, with whether that implementation's backward is
deterministic; ``kernels.common.options.record_options`` per op, the `AttentionOptions`
values that applied to the implementation taken: the PoPE implementation asked for, exp2,
TAPA's series, autotuning); :func:`what_ran` reads those records together with the run's
settings. Training
(``train.session``, rank 0, every launcher) and evaluation (``evals.api.run_eval``) write it to
``provenance.json`` in the stage's folder, where the stage's task reads it into the attempt's
environment fingerprint, whichever process ran the model (a Ray Train worker included).

``deterministic`` is True when every attention implementation that ran has a deterministic
backward and, on CUDA, torch's deterministic algorithms are on (other CUDA kernels, such as the
embedding backward, accumulate with atomics otherwise); False when one of them is not; None when
nothing was recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phaselab.catalog.tracking import run_folder


def reset() -> None:
    """Forget what earlier runs in this process recorded (a Ray worker runs many stages)."""
    from phaselab.kernels.common.options import reset_options
    from phaselab.kernels.registry import reset as reset_registry

    reset_registry()
    reset_options()


def device_name(device: Any) -> str:
    """"cpu", or the CUDA device's name ("NVIDIA H200")."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device)


def what_ran(*, device: Any, precision: str | None, compile: bool = False, cuda_graphs: bool = False,
             deterministic_requested: bool | None = None) -> dict[str, Any]:
    """The provenance dict (module docstring) of what this process ran since :func:`reset`.

    Args:
        device: the torch device the model ran on.
        precision: the resolved compute precision ("bf16", "fp32").
        compile: whether the step ran under ``torch.compile``; cuda_graphs: as captured graphs.
        deterministic_requested: the model's ``attention.deterministic``.
    """
    import torch

    from phaselab.kernels.common.options import options_used
    from phaselab.kernels.registry import backends_used, impls_used

    impls = impls_used()
    flags = [det for per_op in impls.values() for det in per_op.values()]
    on_cuda = torch.device(device).type == "cuda"
    torch_det = bool(torch.are_deterministic_algorithms_enabled())
    deterministic = (all(flags) and (torch_det or not on_cuda)) if flags else None
    return {"attention": {"sites": dict(sorted(backends_used().items())),
                          "impls": {op: sorted(per_op) for op, per_op in sorted(impls.items())},
                          "options": options_used()},
            "deterministic": deterministic, "deterministic_requested": deterministic_requested,
            "torch_deterministic_algorithms": torch_det, "precision": precision,
            "compile": bool(compile), "cuda_graphs": bool(cuda_graphs), "device": device_name(device)}


def write(out_dir: Path, provenance: Mapping[str, Any]) -> Path:
    path = Path(out_dir) / run_folder.PROVENANCE_FILE
    path.write_text(json.dumps(dict(provenance), indent=1, sort_keys=True) + "\n")
    return path


def read(out_dir: Path) -> dict[str, Any] | None:
    """The provenance a run wrote to ``out_dir``, or None (not written, or unreadable)."""
    try:
        out = json.loads((Path(out_dir) / run_folder.PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None

