"""benchmarks/floor.py, the raw-forward floor the speed scripts stand every path against: every unique token runs
through the model exactly once, at batch 1 (the CPU) and stacked (a GPU), and the prefix tree keeps each shared
prefix once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from floor import raw_forward, tree_token_ids  # noqa: E402


def test_the_tree_keeps_a_shared_prefix_once_in_first_met_order():
    assert tree_token_ids([[5, 6, 7], [5, 6, 8], [5, 9], [4]]) == [5, 6, 7, 8, 9, 4]


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_every_token_runs_once_whatever_the_batch(batch):
    model = tiny_model("llama", 100)
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(args[0].detach().clone()))
    tokens = torch.randint(4, 100, (23,), generator=torch.Generator().manual_seed(0)).tolist()
    forwards = raw_forward(model, tokens, 5, batch)
    assert forwards == len(seen) == -(-4 // batch) + 1  # 4 full sequences of 5 stacked `batch` at a time, then the 3 left
    assert [t for ids in seen for t in ids.flatten().tolist()] == tokens
    assert all(ids.shape[1] == 5 for ids in seen[:-1]) and seen[-1].shape == (1, 3)
