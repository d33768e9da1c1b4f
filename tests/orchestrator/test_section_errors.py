"""Structured config errors: ``ConfigError`` carries path, message, suggestion and the valid
keys as fields, and the stage layer builds its ``SectionError`` from those fields (no parsing of
the message text)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from phaselab.orchestrator.stages.base import SectionError, normalize_eval, normalize_train, section_error
from phaselab.workloads.config import ConfigError, flatten, from_dict, merge, suggest


@dataclass(frozen=True, kw_only=True)
class Inner:
    lengths: tuple[int, ...] = (1,)


@dataclass(frozen=True, kw_only=True)
class Outer:
    lr: float = 1e-3
    inner: Inner = Inner()


def test_config_error_fields() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(Outer, {"lrr": 1})
    err = info.value
    assert (err.path, err.message, err.suggestion, err.valid) == ("lrr", "unknown key for Outer", "lr", ("lr", "inner"))
    assert str(err) == "lrr: unknown key for Outer; did you mean 'lr'? (valid keys: lr, inner)"
    with pytest.raises(ConfigError) as info:
        from_dict(Outer, {"inner": {"lengths": [1, "x"]}})
    assert (info.value.path, info.value.suggestion) == ("inner.lengths[1]", None)
    assert info.value.message == "expected an int, got str 'x'"
    back = pickle.loads(pickle.dumps(err))   # Ray ships it between processes
    assert (back.path, back.message, back.suggestion, back.valid, str(back)) == \
        (err.path, err.message, err.suggestion, err.valid, str(err))


def test_a_one_string_config_error_still_has_fields() -> None:
    err = ConfigError("train.eval_splits: must name 'valid'")
    assert (err.path, err.message, str(err)) == ("train.eval_splits", "must name 'valid'", str(err))
    assert ConfigError("no path here: x").path == ""


def test_section_errors_come_from_the_fields() -> None:
    err = section_error(ConfigError("ppl.lengths[2]", "expected an int", None), "eval")
    assert isinstance(err, SectionError) and (err.key, err.message) == ("eval.ppl.lengths.2", "expected an int")
    assert section_error(ConfigError("", "invalid X: bad"), "eval.select").key == "eval.select"
    with pytest.raises(SectionError) as info:
        normalize_train({"stepz": 3})
    assert (info.value.key, info.value.suggestion) == ("train.stepz", "steps")
    assert info.value.message.startswith("unknown key for TrainConfig (valid keys: ")
    with pytest.raises(SectionError) as info:
        normalize_eval({"suite": "ppl-by-length", "ppl": {"lengths": [32]}, "data": {"kind": "text", "blok_size": 4}},
                       None)
    assert (info.value.key, info.value.suggestion) == ("eval.data.blok_size", "block_size")


def test_the_shared_helpers() -> None:
    assert merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 3}, "d": {"e": 4}}) == {"a": {"b": 3, "c": 2}, "d": {"e": 4}}
    assert flatten({"train": {"lr": 1, "tags": {}}, "xs": [1, 2]}) == {"train.lr": 1, "train.tags": {}, "xs": [1, 2]}
    assert suggest("presett", ["preset", "pe"]) == "preset" and suggest("zzz", ["preset"]) is None
