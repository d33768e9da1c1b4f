"""Kernel-test setup (DESIGN §6, §7 example 8).

1. Without CUDA, Triton kernels run under the interpreter: TRITON_INTERPRET=1 must be set before
   triton decorates any kernel, i.e. before a test module imports phaselab.kernels' Triton files.
   Set here (collected before the modules of this folder); tests that need the interpreter skip
   when it is off (on a GPU machine the `gpu` tests cover the same kernels compiled).
2. NaN poison: every torch.empty* call made *from phaselab.kernels* returns a NaN-filled tensor, so
   an output element a kernel forgets to write fails the comparison instead of passing by luck
   (fla-org/flash-linear-attention tests/conftest.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.utils._device  # the nan_poison fixture clears its cache (imported lazily by torch)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_EMPTY_FNS = ("empty", "empty_like", "empty_strided")


def _poisoned(fn):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("phaselab.kernels") and out.is_floating_point():
            out.fill_(float("nan"))
        return out

    wrapper.__wrapped__ = fn
    return wrapper


@pytest.fixture(autouse=True)
def nan_poison() -> Iterator[None]:
    """Fill torch.empty* results requested by phaselab.kernels with NaN for the test's duration."""
    originals = {name: getattr(torch, name) for name in _EMPTY_FNS}
    for name, fn in originals.items():
        setattr(torch, name, _poisoned(fn))
    yield
    for name, fn in originals.items():
        setattr(torch, name, fn)
    # `with torch.device(...)` redirects the factory functions it collected on first use into an
    # lru_cache (torch/utils/_device.py); a first use during a test (dynamo makes one) would keep
    # the wrappers, so later `torch.device("meta")` blocks would allocate for real.
    torch.utils._device._device_constructors.cache_clear()


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


needs_interpreter = pytest.mark.skipif(
    not interpreter_on(), reason="CPU interpreter tests (TRITON_INTERPRET=1); the gpu tests cover CUDA")


@pytest.fixture
def gluon_importable(monkeypatch):
    """The Gluon kernels' `supported` as on a machine whose Gluon imports and that does not
    interpret (kernels/flash/gluon_common.py)."""
    from phaselab.kernels.flash import gluon_common

    monkeypatch.setattr(gluon_common, "IMPORT_ERROR", None)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
