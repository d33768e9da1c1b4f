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

import pytest
import torch

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
def nan_poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fill torch.empty* results requested by phaselab.kernels with NaN for the test's duration."""
    for name in _EMPTY_FNS:
        monkeypatch.setattr(torch, name, _poisoned(getattr(torch, name)))


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


needs_interpreter = pytest.mark.skipif(
    not interpreter_on(), reason="CPU interpreter tests (TRITON_INTERPRET=1); the gpu tests cover CUDA")
