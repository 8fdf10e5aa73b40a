"""benchmarks/long_context_speed.py's tensor peak: the most torch CPU memory live at once while a function runs,
read from the profiler's allocation events (not their sum, and not what the C allocator keeps mapped)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from long_context_speed import tensor_peak  # noqa: E402

MIB = 2**20


def _tensor(mib: int) -> torch.Tensor:
    return torch.ones(mib * MIB // 4, dtype=torch.float32)  # written, so really allocated


def test_a_freed_tensor_counts_once_not_again_after_it_is_gone():
    def fn():
        a = _tensor(32)
        del a
        b = _tensor(16)
        del b

    assert 32 <= tensor_peak(fn) < 33  # the sum of the two would be 48


def test_tensors_alive_together_add_up():
    kept = []

    def fn():
        kept.append(_tensor(16))
        c = _tensor(8)
        del c

    assert 24 <= tensor_peak(fn) < 25


def test_memory_allocated_before_the_call_is_not_counted():
    kept = []
    tensor_peak(lambda: kept.append(_tensor(16)))  # allocated under a profiler ...
    kept.clear()  # ... and freed outside one: the profiler's running total still holds it
    before = _tensor(64)  # allocated outside any profiler
    assert tensor_peak(lambda: _tensor(4)) < 5
    del before
