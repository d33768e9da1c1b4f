"""Attention backend registry: lazy targets, no silent fallback, 'auto' records its pick."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from phaselab.kernels import registry
from phaselab.kernels.attention.reference import ReferenceBackend
from phaselab.kernels.attention.sdpa import SdpaBackend
from phaselab.kernels.common.score_mod import ScoreMod


def _call(**over) -> registry.AttnCall:
    base = {"dtype": torch.float32, "device_type": "cpu", "head_dim": 64, "qk_width": 64, "causal": True,
                "q_shorter_than_k": False, "varlen": False, "score_mod": None, "needs_grad": True, "deterministic": False}
    return registry.AttnCall(**{**base, **over})


@pytest.fixture(autouse=True)
def _clean_records():
    registry.reset()
    yield
    registry.reset()


def test_builtin_names_and_lazy_targets():
    targets = registry.registered()
    assert targets["reference"] == "phaselab.kernels.attention.reference:ReferenceBackend"
    assert targets["sdpa"] == "phaselab.kernels.attention.sdpa:SdpaBackend"
    assert targets["triton"] == "phaselab.kernels.attention.function:TritonBackend"


def test_importing_the_registry_does_not_import_torch(tmp_path):
    code = "import sys, phaselab.kernels.registry; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          cwd=tmp_path)  # outside the repository root: the installed package is imported
    assert proc.returncode == 0, proc.stderr


def test_resolve_returns_cached_instances_and_records_by_layer():
    ref = registry.resolve("reference", _call(score_mod="tapa"), layer="h.0.attn")
    assert isinstance(ref, ReferenceBackend) and isinstance(ref, registry.AttentionBackend)
    assert registry.resolve("reference", _call()) is ref
    sdpa = registry.resolve("sdpa", _call(), layer="h.1.attn")
    assert isinstance(sdpa, SdpaBackend)
    assert registry.backends_used() == {"h.0.attn": "reference", "h.1.attn": "sdpa"}
    registry.record_use("h.2.attn", "reference")
    used = registry.backends_used()
    used["h.3.attn"] = "x"  # a copy: callers cannot corrupt the record
    assert registry.backends_used() == {"h.0.attn": "reference", "h.1.attn": "sdpa", "h.2.attn": "reference"}
    registry.reset()
    assert registry.backends_used() == {}


@pytest.mark.parametrize("over,match", [
    ({"score_mod": "tapa"}, "TAPA"),
    ({"score_mod": "alibi", "dtype": torch.bfloat16}, "bfloat16"),
    ({"deterministic": True, "device_type": "cuda"}, "deterministic"),
], ids=["tapa", "alibi-bf16", "deterministic-cuda"])
def test_sdpa_unsupported_raises_with_reason_never_falls_back(over, match):
    with pytest.raises(registry.BackendUnsupported, match=match) as info:
        registry.resolve("sdpa", _call(**over), layer="h.0.attn")
    assert info.value.backend == "sdpa" and match in info.value.reason
    assert registry.backends_used() == {}  # nothing recorded for a refused call


def test_sdpa_accepts_what_it_supports():
    for over in ({}, {"score_mod": "pope", "qk_width": 64}, {"q_shorter_than_k": True}, {"varlen": True},
                 {"score_mod": "alibi"}, {"deterministic": True}, {"deterministic": True, "device_type": "cuda",
                                                                       "needs_grad": False}):
        assert SdpaBackend().unsupported_reason(_call(**over)) is None, over


def test_unknown_name_and_bad_registrations_raise():
    with pytest.raises(ValueError, match="'flash3'"):
        registry.resolve("flash3", _call())
    with pytest.raises(ValueError, match="module:Class"):
        registry.register("mine", "phaselab.kernels.attention.sdpa.SdpaBackend")
    with pytest.raises(ValueError, match="auto"):
        registry.register("auto", "phaselab.kernels.attention.sdpa:SdpaBackend")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("sdpa", "phaselab.kernels.attention.reference:ReferenceBackend")
    registry.register("sdpa", "phaselab.kernels.attention.sdpa:SdpaBackend")  # same target: a no-op


def test_unimportable_target_is_unsupported_not_replaced():
    registry.register("test-missing", "phaselab.kernels.attention.no_such_module:Backend")
    with pytest.raises(registry.BackendUnsupported, match="no_such_module"):
        registry.resolve("test-missing", _call())


def test_auto_picks_in_order_and_records_the_pick():
    assert registry.resolve("auto", _call()).name == "sdpa"
    assert registry.backends_used() == {"auto": "sdpa"}
    assert registry.resolve("auto", _call(score_mod="tapa"), layer="h.4.attn").name == "reference"
    assert registry.backends_used()["h.4.attn"] == "reference"


def test_attn_call_describes_tensors():
    q = torch.zeros(2, 4, 3, 16, requires_grad=True)
    k, v = torch.zeros(2, 2, 9, 16), torch.zeros(2, 2, 9, 8)
    call = registry.AttnCall.describe(q, k, v, causal=True,
                                      score_mod=ScoreMod(kind="tapa", params={}), deterministic=True)
    assert call == registry.AttnCall(dtype=torch.float32, device_type="cpu", head_dim=8, qk_width=16, causal=True,
                                     q_shorter_than_k=True, varlen=False, score_mod="tapa", needs_grad=True,
                                     deterministic=True)
