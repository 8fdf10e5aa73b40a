"""Real-model rollout plumbing, on a tiny random Llama (no weights needed)."""

import pytest
import torch

from conftest import tiny_loaded
from posbias.analysis.rollout_real import SEGMENTS, kv_spans, real_rollout
from posbias.models.attention import layer_attentions
from posbias.tasks.kv_lookup import KVLookup


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded("llama")


def test_layer_attentions_are_causal_and_stochastic(loaded):
    task = KVLookup(facts=4, digits=3)
    spans = kv_spans(loaded, task, task.examples(1)[0], 2, chat=True)
    a = layer_attentions(loaded.model, spans.ids)
    n = len(spans.ids)
    assert a.shape == (2, n, n)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, n, dtype=torch.float64))
    assert float(a.triu(1).abs().max()) == 0.0
    assert loaded.model.config._attn_implementation != "eager"  # restored after capture


def test_spans_cover_the_prompt_once(loaded):
    task = KVLookup(facts=6, digits=3)
    ex = task.examples(1)[0]
    for p in (0, 3, 5):
        s = kv_spans(loaded, task, ex, p, chat=True)
        parts = [t for name in ("first", "begin", "middle", "end", "other") for t in s.segments[name]]
        assert sorted(parts) == list(range(len(s.ids)))
        key, value = ex.pairs[ex.gold]
        gold_text = loaded.tokenizer.decode([s.ids[t] for t in s.segments["gold"]])
        assert gold_text == f"The code for {key} is {value}."
        third = {0: "begin", 3: "middle", 5: "end"}[p]
        assert set(s.segments["gold"]) <= set(s.segments[third])


def test_real_rollout_masses_sum_to_one(loaded):
    out = real_rollout(loaded, facts=6, positions=[0, 5], n=2, residuals=(0.0, 0.5))
    for key in ("residual=0.0", "residual=0.5"):
        for p in ("0", "5"):
            m = out[key][p]
            assert set(m) == set(SEGMENTS)
            total = [sum(m[s][t] for s in ("first", "begin", "middle", "end", "other")) for t in range(2)]
            assert total == pytest.approx([1.0, 1.0], abs=1e-5)
            assert all(g <= e + 1e-9 for g, e in zip(m["gold"], m["begin" if p == "0" else "end"]))
