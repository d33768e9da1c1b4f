"""The strict config converter (CONTRACTS §3.1) on the model configs and on a generic dataclass."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from phaselab.workloads.config import ConfigError, from_dict, to_dict
from phaselab.workloads.models.config import ContextExtension, ModelConfig, PEConfig

BASE = {"vocab_size": 66, "block_size": 48, "n_layer": 2, "n_head": 4, "d_model": 128}


def _model(**extra) -> dict:
    return {**BASE, **extra}


def test_round_trip_defaults_and_json():
    cfg = from_dict(ModelConfig, _model(pe={"kind": "pope", "pope": {"delta_init": "uniform"}}))
    plain = to_dict(cfg)
    # defaults are included, so the dict is a complete, hashable description
    assert plain["pe"]["rope"]["beta_fast"] == 32.0 and plain["attention"]["backend"] == "reference"
    assert plain["pe"]["pope"]["delta_init"] == "uniform"
    again = from_dict(ModelConfig, json.loads(json.dumps(plain)))
    assert again == cfg
    assert to_dict(again) == plain


def test_explicit_yarn_factor_and_attention_factor_survive_round_trip():
    rope = {"scaling": "yarn", "factor": 4, "original_max_seq_len": 1024, "attention_factor": 1.25,
            "beta_fast": 16, "truncate": False}
    cfg = from_dict(ModelConfig, _model(pe={"kind": "rope", "rope": rope}))
    assert cfg.pe.rope.factor == 4.0 and isinstance(cfg.pe.rope.factor, float)
    again = from_dict(ModelConfig, json.loads(json.dumps(to_dict(cfg))))
    assert again.pe.rope.factor == 4.0
    assert again.pe.rope.attention_factor == 1.25  # never replaced by the default 0.1 ln s + 1
    assert again.pe.rope.original_max_seq_len == 1024 and again.pe.rope.truncate is False
    assert again == cfg


def test_unknown_key_names_dotted_path_and_suggests():
    with pytest.raises(ConfigError) as err:
        from_dict(ModelConfig, _model(pe={"kind": "rope", "rope": {"bsae": 5e5}}))
    msg = str(err.value)
    assert msg.startswith("pe.rope.bsae: unknown key")
    assert "did you mean 'base'?" in msg
    with pytest.raises(ConfigError, match=r"^n_layers: unknown key .*did you mean 'n_layer'\?"):
        from_dict(ModelConfig, {**_model(), "n_layers": 3})
    with pytest.raises(ConfigError, match=r"model\.attention\.backnd: .*did you mean 'backend'"):
        from_dict(ModelConfig, _model(attention={"backnd": "sdpa"}), path="model")


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        from_dict(PEConfig, {"zzzzzz": 1})
    assert "did you mean" not in str(err.value)
    assert "valid keys: kind, rope, pope, tapa, alibi" in str(err.value)


@pytest.mark.parametrize("key,value", [
    ("n_layer", "8"), ("n_layer", True), ("n_layer", 2.0), ("dropout", "0.1"), ("bias", 1),
    ("tie_embeddings", "yes"), ("pe", "rope"), ("n_kv_head", 1.5),
])
def test_wrong_types_are_errors(key, value):
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        from_dict(ModelConfig, {**_model(), key: value})


def test_literals_are_validated():
    with pytest.raises(ConfigError, match=r"pe: invalid PEConfig: unknown pe\.kind 'rotary'"):
        from_dict(ModelConfig, _model(pe={"kind": "rotary"}))
    with pytest.raises(ConfigError, match=r"pe\.pope\.delta_constraint"):
        from_dict(ModelConfig, _model(pe={"pope": {"delta_constraint": "clip"}}))


def test_union_of_literal_and_float():
    scale = lambda v: from_dict(PEConfig, {"pope": {"softmax_scale": v}}).pope.softmax_scale
    assert scale("inv_sqrt_2d") == "inv_sqrt_2d"
    assert scale(0.125) == 0.125
    assert scale(1) == 1.0 and isinstance(scale(1), float)
    with pytest.raises(ConfigError, match="pope.softmax_scale"):
        scale("sqrt_d")
    with pytest.raises(ConfigError, match="pope.softmax_scale"):
        scale(True)


def test_tuple_fields_and_nulls():
    cfg = from_dict(PEConfig, {"kind": "alibi", "alibi": {"slopes": [0.5, 0.25]}})
    assert cfg.alibi.slopes == (0.5, 0.25)
    assert to_dict(cfg)["alibi"]["slopes"] == [0.5, 0.25]
    assert from_dict(ModelConfig, _model(n_kv_head=None)).n_kv_head is None
    with pytest.raises(ConfigError, match=r"alibi\.slopes"):
        from_dict(PEConfig, {"alibi": {"slopes": [0.5, "x"]}})


def test_missing_required_field():
    data = dict(BASE)
    del data["d_model"]
    with pytest.raises(ConfigError, match=r"^d_model: required field of ModelConfig is missing"):
        from_dict(ModelConfig, data)


def test_post_init_errors_carry_the_path():
    with pytest.raises(ConfigError, match=r"^model: invalid ModelConfig: .*divisible by n_head=5"):
        from_dict(ModelConfig, _model(n_head=5), path="model")
    with pytest.raises(ConfigError, match=r"^pe\.rope: invalid RopeConfig: .*original_max_seq_len"):
        from_dict(ModelConfig, _model(pe={"rope": {"scaling": "yarn", "factor": 4}}))


def test_context_extension_validation():
    ext = from_dict(ContextExtension, {"rule": "yarn", "factor": 4, "original_max_seq_len": 1024,
                                       "block_size": 4096})
    assert from_dict(ContextExtension, to_dict(ext)) == ext
    with pytest.raises(ConfigError, match="needs original_max_seq_len"):
        from_dict(ContextExtension, {"rule": "pi", "factor": 8})
    with pytest.raises(ConfigError, match="factor=2.0 has no effect with scaling='none'.*rule is RoPE's scaling"):
        from_dict(ContextExtension, {"factor": 2})
    with pytest.raises(ConfigError, match=r"rotary_fraction=0.5 \* head_dim=2 = 1.0 must be an even integer"):
        from_dict(ModelConfig, _model(n_head=64, d_model=128, pe={"rope": {"rotary_fraction": 0.5}}))
    with pytest.raises(ConfigError, match="attention_factor"):
        from_dict(ContextExtension, {"rule": "pi", "factor": 2, "original_max_seq_len": 8,
                                     "attention_factor": 1.1})


@dataclass(frozen=True, kw_only=True)
class _Inner:
    mode: Literal["a", "b"] = "a"


@dataclass(frozen=True, kw_only=True)
class _Outer:
    name: str
    sizes: list[int] = field(default_factory=list)
    table: dict[str, float] = field(default_factory=dict)
    pair: tuple[int, str] = (1, "x")
    where: Path = Path("out")
    inner: _Inner = field(default_factory=_Inner)


def test_generic_containers():
    cfg = from_dict(_Outer, {"name": "n", "sizes": [1, 2], "table": {"a": 1}, "pair": [3, "y"],
                             "where": "runs/x", "inner": {"mode": "b"}})
    assert cfg == _Outer(name="n", sizes=[1, 2], table={"a": 1.0}, pair=(3, "y"), where=Path("runs/x"),
                         inner=_Inner(mode="b"))
    assert to_dict(cfg) == {"name": "n", "sizes": [1, 2], "table": {"a": 1.0}, "pair": [3, "y"],
                            "where": "runs/x", "inner": {"mode": "b"}}
    with pytest.raises(ConfigError, match=r"^sizes\[1\]: expected an int"):
        from_dict(_Outer, {"name": "n", "sizes": [1, "2"]})
    with pytest.raises(ConfigError, match=r"^pair: expected 2 items"):
        from_dict(_Outer, {"name": "n", "pair": [1]})
    with pytest.raises(ConfigError, match=r"^inner: expected a mapping"):
        from_dict(_Outer, {"name": "n", "inner": "b"})


def test_to_dict_refuses_non_config_data():
    with pytest.raises(ValueError, match="non-finite"):
        to_dict(_Outer(name="n", table={"a": math.inf}))
    with pytest.raises(TypeError, match="not config data"):
        to_dict({"x": object()})


def test_config_modules_do_not_import_torch():
    # the orchestrator parses configs without torch (DESIGN §2); run in a fresh interpreter
    import subprocess

    code = ("import sys; import phaselab.workloads.config, phaselab.workloads.models.config, "
            "phaselab.workloads.models.presets; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
