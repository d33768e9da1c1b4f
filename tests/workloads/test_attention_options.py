"""The attention kernels' options as config fields (model.attention: pope_impl, tapa_series,
exp2, autotune): validated like every other key, converted once into the kernels'
`AttentionOptions`, and left out of cache keys at their defaults (KEY_DEFAULTS, DESIGN §5.4)."""

from __future__ import annotations

import dataclasses

import pytest

from phaselab.kernels.common.options import DEFAULT_OPTIONS, AttentionOptions
from phaselab.orchestrator.plan.hashing import KEY_DEFAULTS, strip_ignored
from phaselab.workloads.config import ConfigError, flatten, from_dict, to_dict
from phaselab.workloads.models.config import AttentionConfig, ModelConfig

BASE = {"vocab_size": 66, "block_size": 16, "n_layer": 1, "n_head": 2, "d_model": 32}
OPTION_KEYS = ("pope_impl", "tapa_series", "exp2", "autotune", "flash_impl")


def test_the_config_fields_are_the_kernels_options_with_the_same_defaults():
    cfg = from_dict(ModelConfig, BASE)
    assert cfg.attention.options == DEFAULT_OPTIONS == AttentionOptions()
    assert [f.name for f in dataclasses.fields(AttentionOptions)] == list(OPTION_KEYS)
    cfg = from_dict(ModelConfig, {**BASE, "attention": {"pope_impl": "fused", "tapa_series": False, "exp2": "split",
                                                        "autotune": True}})
    assert cfg.attention.options == AttentionOptions(pope_impl="fused", tapa_series=False, exp2="split",
                                                     autotune=True)
    assert from_dict(ModelConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize("attention, path, text", [
    ({"pope_imp": "fused"}, "attention.pope_imp", "did you mean 'pope_impl'"),
    ({"pope_impl": "triton"}, "attention.pope_impl", "'triton' is not one of ['auto', 'fused', 'expand', 'cudnn']"),
    ({"exp2": "fast"}, "attention.exp2", "'fast' is not one of ['mufu', 'poly', 'split']"),
    ({"autotune": 1}, "attention.autotune", "expected a bool"),
    ({"tapa_series": "no"}, "attention.tapa_series", "expected a bool"),
])
def test_a_bad_option_is_a_config_error_naming_its_key(attention, path, text):
    with pytest.raises(ConfigError) as err:
        from_dict(ModelConfig, {**BASE, "attention": attention}, path="model")
    assert err.value.path == f"model.{path}" and text in str(err.value)


def test_the_kernels_refuse_bad_options_given_directly():
    with pytest.raises(ValueError, match="exp2='fast'"):
        AttentionOptions(exp2="fast")
    with pytest.raises(TypeError, match="autotune=1 must be a bool"):
        AttentionOptions(autotune=1)


def test_options_at_their_defaults_leave_cache_keys_as_they_were():
    """KEY_DEFAULTS holds each option with its default, so a model section written before the
    options existed and the same section with them at their defaults hash alike; any other value
    stays in the key."""
    defaults = to_dict(AttentionConfig())
    assert {k: KEY_DEFAULTS[f"model.attention.{k}"] for k in OPTION_KEYS} == {k: defaults[k] for k in OPTION_KEYS}
    section = {"model": to_dict(from_dict(ModelConfig, BASE))}
    before = {"model": {**section["model"], "attention": {k: v for k, v in section["model"]["attention"].items()
                                                           if k not in OPTION_KEYS}}}
    assert strip_ignored(section) == strip_ignored(before)
    changed = {"model": {**section["model"], "attention": {**section["model"]["attention"], "exp2": "poly"}}}
    assert flatten(strip_ignored(changed))["model.attention.exp2"] == "poly"
