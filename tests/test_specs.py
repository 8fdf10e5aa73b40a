"""The one key=value parser (posbias/specs.py) that method, task and model specs share."""

from __future__ import annotations

from pathlib import Path

import pytest

from posbias import PosbiasError
from posbias.specs import Param, bind, convert, guess, is_pairs, parameters, split_pairs


def test_pairs_lists_and_a_head():
    assert split_pairs("a=1, b = x=y ,c=1,2,3", "spec", "fix") == (None, {"a": ["1"], "b": ["x=y"], "c": ["1", "2", "3"]})
    assert split_pairs("DIR,k=v", "spec", "fix", head=True) == ("DIR", {"k": ["v"]})
    assert split_pairs("", "spec", "fix") == (None, {})


@pytest.mark.parametrize("text, head, message", [
    ("1.5,factor=2", False, "'1.5' in spec is not key=value"),
    ("DIR,k=v,other", True, None),  # a bare item after a key continues its list
    ("k=1,k=2", False, "'k' is given twice in spec"),
    ("=3", False, "has no key before its '='"),
    ("a b=3", False, "has no key before its '='"),
])
def test_malformed_pairs_are_refused_in_one_line(text, head, message):
    if message is None:
        assert split_pairs(text, "spec", "fix", head=head)[1] == {"k": ["v", "other"]}
        return
    with pytest.raises(PosbiasError, match=message) as e:
        split_pairs(text, "spec", "write it as x:k=v")
    assert e.value.fix == "write it as x:k=v" or "give each key once" in e.value.fix
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, pairs", [
    ("factor=1.2", True), ("min_ratio=1.2,max_ratio=1.8", True), ("DIR,answers=first", True),
    ("1.2", False), ("1.2-1.8:query", False), ("runs/lr=0.1/factors.json", False), ("10000,20000", False), ("", False),
])
def test_what_reads_as_pairs(text, pairs):
    assert is_pairs(text) is pairs


@pytest.mark.parametrize("raw, annotation, value", [
    (["3"], int, 3), (["3"], float, 3.0), (["1e-4"], float, 1e-4), (["x"], str, "x"), (["007"], str, "007"),
    (["yes"], bool, True), (["off"], bool, False), (["none"], float | None, None), (["2"], float | None, 2.0),
    (["1", "1.5"], list[float], [1.0, 1.5]), (["9-11"], list[int], [9, 10, 11]), (["2", "5-6"], list[int], [2, 5, 6]),
    (["-1"], list[int], [-1]), (["1e4", "2e4"], tuple[float, ...] | str | None, (1e4, 2e4)),
    (["rag"], tuple[float, ...] | str | None, "rag"), (["none"], tuple[float, ...] | str | None, None),
    (["a/b"], str | Path, "a/b"), (["a/b"], Path, Path("a/b")),
    (["3"], None, 3), (["x", "2"], None, ["x", 2]),
])
def test_values_follow_the_annotation(raw, annotation, value):
    assert convert(raw, annotation, "k", "spec") == value


@pytest.mark.parametrize("raw, annotation, message", [
    (["ten"], int, "'k' in spec 'x:k=ten' takes a whole number, got 'ten' -- write k=2"),
    (["1.5"], int, "takes a whole number"),
    (["1", "2"], float, "takes a number, got '1,2' -- write k=1.5"),
    (["maybe"], bool, "takes true or false"),
    (["a", "b"], list[int], "takes a list of whole numbers, got 'a,b' -- write k=1,2,3"),
    (["x"], float | None, "takes none or a number"),
])
def test_a_value_of_the_wrong_type_is_refused(raw, annotation, message):
    with pytest.raises(PosbiasError, match=message.replace("(", r"\(")):
        convert(raw, annotation, "k", "spec 'x:k=" + ",".join(raw) + "'")


def _f(channel: int, scale: float = 1.0, layers: list[int] | None = None):
    return channel, scale, layers


def test_bind_checks_keys_and_converts():
    params = parameters(_f)
    assert params == {"channel": Param(int, True), "scale": Param(float, False), "layers": Param(list[int] | None, False)}
    assert bind({"channel": ["3"], "layers": ["1-2"]}, params, "spec", "f:channel=..") == {"channel": 3, "layers": [1, 2]}
    with pytest.raises(PosbiasError, match="spec has no key 'colour' -- use its keys: channel, scale, layers"):
        bind({"channel": ["3"], "colour": ["red"]}, params, "spec", "f:channel=..")
    with pytest.raises(PosbiasError, match="spec needs 'channel' -- add channel=VALUE"):
        bind({"scale": ["3"]}, params, "spec", "f:channel=..")


def test_untyped_values_are_guessed_as_model_specs_always_were():
    assert [guess(v) for v in ("2", "0.5", "true", "False", "none", "x")] == [2, 0.5, True, False, "none", "x"]
