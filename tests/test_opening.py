"""The one way sweep, grid and compare get their model (eval/opening.py `opened`): a backend the caller gave is never
closed; one opened from a spec is closed exactly once, on leaving and on an error."""

from __future__ import annotations

import pytest

from posbias.backends import Backend, Capabilities
from posbias.eval.opening import opened
from posbias.eval.sweep import SweepConfig


SERVED = Capabilities(prompt_logprobs=False, token_prompts=False, methods=False, prefix_sharing=False, batching="requests")


class Counting(Backend):
    """A backend that only counts how often it is closed."""

    name, description = "counting", "counts close()"
    caps, tokenizer, info = SERVED, None, {"name": "counting"}

    def __init__(self):
        self.closed = 0

    @classmethod
    def capabilities(cls, args: dict) -> Capabilities:
        return SERVED

    @classmethod
    def open(cls, args, dtype, device, progress, device_map) -> "Counting":
        return cls()

    def decoding(self) -> dict:
        return {}

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def spec_opens(monkeypatch):
    """Every spec `opened` opens: a new Counting backend, kept in the list returned."""
    made: list[Counting] = []
    monkeypatch.setattr("posbias.eval.opening.open_backend", lambda *a, **k: made.append(Counting()) or made[-1])
    return made


def test_a_given_backend_is_used_as_it_is_and_left_open(spec_opens):
    given = Counting()
    with opened(given, SweepConfig()) as backend:
        assert backend is given
    with pytest.raises(RuntimeError), opened(given, SweepConfig()):
        raise RuntimeError("a failing run")
    assert given.closed == 0 and spec_opens == []


def test_a_backend_opened_from_a_spec_is_closed_once(spec_opens):
    with opened("smollm2-135m", SweepConfig()) as backend:
        assert spec_opens == [backend] and backend.closed == 0
    assert backend.closed == 1
    with pytest.raises(RuntimeError), opened("smollm2-135m", SweepConfig()):
        raise RuntimeError("a failing run")
    assert [b.closed for b in spec_opens] == [1, 1]


def test_the_spec_opens_with_the_choice_of_dtype_device_and_map(monkeypatch):
    seen = []
    monkeypatch.setattr("posbias.eval.opening.open_backend", lambda *a: seen.append(a) or Counting())
    with opened("smollm2-135m", SweepConfig(dtype="fp32", device="cpu"), progress=False):
        pass
    assert seen == [("smollm2-135m", "fp32", "cpu", False, None)]
