"""Attention per document: item spans, the cheap per-span capture (exact against eager attention), the pipeline."""

from __future__ import annotations

import json

import pytest
import torch

import posbias
from conftest import position_sensitive, random_seqs, tiny_loaded
from posbias import PosbiasError
from posbias.explain import AttentionConfig, run_attention
from posbias.methods import get_method
from posbias.models.attention import span_attention
from posbias.scoring.encode import encode, left_pad
from posbias.scoring.spans import item_spans
from posbias.tasks import Prompt, get_task

# ----------------------------------------------------------------------------- spans


@pytest.mark.parametrize("spec,opts", [("kv-lookup", {"facts": 5}), ("kv-uuid", {"pairs": 4}),
                                       ("kv-2hop", {"facts": 5})])
def test_items_appear_in_prompt_in_order(spec, opts):
    task = get_task(spec, **opts)
    ex = task.examples(1, seed=3)[0]
    for p in task.placements("all" if task.n_gold == 1 else "0:1,4:2"):
        user, items = task.build(ex, p).user, task.items(ex, p)
        assert len(items) == task.n_slots
        at = [user.index(it) for it in items]
        assert at == sorted(at)


def test_items_of_jsonl_docs_and_hops(tmp_path):
    docs = [{"title": f"T{i}", "text": f"text number {i}."} for i in range(4)]
    one, two = tmp_path / "qa.jsonl", tmp_path / "hop.jsonl"
    one.write_text(json.dumps({"question": "q?", "answers": ["a"], "documents": docs, "gold": 2}) + "\n")
    two.write_text(json.dumps({"question": "q?", "answers": ["a"], "documents": docs, "gold": [1, 3]}) + "\n")
    for path, p in ((one, 0), (two, (3, 0))):
        task = get_task(f"jsonl:{path}")
        ex = task.examples(1)[0]
        user, items = task.build(ex, p).user, task.items(ex, p)
        assert all(it in user for it in items) and items[0].startswith("Document [1]")
    assert "T2" in get_task(f"jsonl:{one}").items(ex := get_task(f"jsonl:{one}").examples(1)[0], 0)[0]


def test_spans_map_items_to_their_tokens_and_repeats_in_order():
    lo = tiny_loaded("llama")
    prompt = Prompt("e", 1, "Intro.\nsame fact\nsame fact\nother\nQ?", "A:", ("x",))
    items = ["same fact", "same fact", "other"]
    sp = item_spans(lo.tokenizer, prompt, items, chat=True)
    assert sp.ids == encode(lo.tokenizer, prompt, True).prompt_ids
    text = [lo.tokenizer.decode([sp.ids[t]]) for t in range(len(sp.ids))]
    for k, it in enumerate(items):
        assert "".join(text[t] for t in sp.tokens(k)) == it
    assert sp.tokens(0)[-1] < sp.tokens(1)[0]  # the repeat maps to the second occurrence
    assert sp.tokens(sp.first) == [0] and len(sp.span_of) == len(sp.ids)


def test_spans_refuse_items_not_in_the_prompt():
    lo = tiny_loaded("llama")
    prompt = Prompt("e", 0, "one\ntwo", "", ("x",))
    with pytest.raises(PosbiasError, match="not found verbatim"):
        item_spans(lo.tokenizer, prompt, ["two", "one"], chat=True)  # out of order


# ----------------------------------------------------------------------------- capture


def _eager_span_masses(model, batch, span_of, n_spans, cols, weights):
    """Reference: full eager attention weights (output_attentions), rows averaged, summed per span, float64."""
    old = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        att = model(**batch, output_attentions=True, use_cache=False).attentions
    finally:
        model.set_attn_implementation(old)
    b = cols.shape[0]
    out = []
    for a in att:  # [B, H, T, T]
        rows = a.double()[torch.arange(b)[:, None], :, cols].permute(0, 2, 1, 3)  # [B, H, q, T]
        rows = (rows * weights.double()[:, None, :, None]).sum(2)
        ids = span_of.clamp(max=n_spans)[:, None].expand(-1, a.shape[1], -1)
        out.append(torch.zeros(b, a.shape[1], n_spans + 1, dtype=torch.float64).scatter_add_(2, ids, rows)[..., :n_spans])
    return torch.stack(out, 1)  # [B, L, H, S]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["none", "pi:1.3"])
def test_capture_equals_eager_attention_and_leaves_outputs_alone(arch, method):
    lo = tiny_loaded(arch)
    position_sensitive(lo.model)
    lo.model.set_attn_implementation("sdpa")
    batch = left_pad(random_seqs([31, 19, 26], 90, seed=1), 0)  # left padding in the batch
    width = batch["input_ids"].shape[1]
    span_of = torch.randint(0, 5, (3, width), generator=torch.Generator().manual_seed(0))
    span_of[batch["attention_mask"] == 0] = 5  # padding: past every span
    cols = torch.tensor([[width - 1, width - 1], [width - 4, width - 3], [width - 2, width - 1]])
    weights = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.25, 0.75]])
    with torch.no_grad(), get_method(method).apply(lo):
        plain = lo.model(**batch, use_cache=False).logits
        with span_attention(lo.model) as cap:
            cap.set_batch(span_of, 5, cols, weights)
            captured = lo.model(**batch, use_cache=False).logits
            assert lo.model.config._attn_implementation == "posbias_spans_sdpa"
        got = torch.stack([cap.masses[k] for k in sorted(cap.masses)], 1).double()
        want = _eager_span_masses(lo.model, batch, span_of, 5, cols, weights)
    assert torch.equal(plain, captured)  # the capture does not alter outputs
    assert lo.model.config._attn_implementation == "sdpa"  # and is removed afterwards
    assert got.shape == want.shape == (3, 2, 4, 5)
    assert (got - want).abs().max() < 1e-5
    assert torch.allclose(got.sum(-1), torch.ones(3, 2, 4, dtype=torch.float64), atol=1e-5)  # every key has a span


def test_capture_refuses_a_foreign_attention_function():
    from posbias.models.mspoe import mspoe

    lo = tiny_loaded("llama")
    with mspoe(lo.model, layers=[0, 1]):
        with pytest.raises(PosbiasError, match="sdpa or eager"):
            with span_attention(lo.model):
                pass


# ----------------------------------------------------------------------------- pipeline


def _cfg(**kw):
    base = dict(model="tiny", task="kv-lookup", task_options={"facts": 4, "digits": 2}, n=2, max_batch=3)
    return AttentionConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tiny():
    lo = tiny_loaded("llama")
    position_sensitive(lo.model)
    return lo


def test_pipeline_rows_and_summary(tiny, tmp_path):
    res = run_attention(_cfg(rows="answer", heads=True, rollout=True), tmp_path / "a", loaded=tiny,
                        progress=False)
    assert len(res.rows) == 2 * 4 * 2  # examples x positions x layers
    for r in res.rows:
        assert abs(sum(r["items"]) + r["first"] + r["other"] - 1) < 1e-4
        assert r["gold"] == pytest.approx(r["items"][r["position"]], abs=1e-6)
        assert len(r["head_items"]) == 4 and "rollout_gold" in r
    rec = json.loads((tmp_path / "a" / "attention.json").read_text())
    per = rec["per_scale"][0]["per_position"]
    assert [p["position"] for p in per] == [0, 1, 2, 3] and "rollout_gold_share" in per[0]
    assert {"attention_heatmap.png", "attention_gold.png", "attention_rollout.png"} <= {p.name for p in (tmp_path / "a").iterdir()}
    assert "middle-third share" in res.format()


def test_resume_after_a_kill_gives_identical_numbers(tiny, tmp_path):
    cfg = _cfg(scales=(1.0, 1.4), positions="0,3", rollout=False)
    full = run_attention(cfg, tmp_path / "full", loaded=tiny, progress=False)
    out = tmp_path / "cut"
    run_attention(cfg, out, loaded=tiny, progress=False)
    log = out / "rows.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:5]) + lines[5][:17])  # a kill mid-batch, mid-line
    (out / "attention.json").unlink()
    with pytest.raises(PosbiasError, match="already holds"):
        run_attention(cfg, out, loaded=tiny, progress=False)
    res = run_attention(cfg, out, loaded=tiny, resume=True, progress=False)
    assert res.summary == full.summary
    assert res.record["rows_this_run"] > 0


@pytest.mark.parametrize("kw,match", [
    (dict(rows="all"), "unknown `rows`"),
    (dict(scales=(1.0, -1.0)), "positive"),
    (dict(scales=(1.2,), method="pi:1.1"), "both set"),
    (dict(method="mspoe"), "cannot run under mspoe"),
    (dict(method="buckets"), "cannot run under buckets"),
    (dict(n=0), "at least 1"),
])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, kw, match):
    with pytest.raises(PosbiasError, match=match):
        run_attention(_cfg(**kw), tmp_path / "x", progress=False)  # no model given: fails before loading
    assert not (tmp_path / "x").exists()


def test_a_task_without_items_is_refused_before_loading(tmp_path):
    class NoItems(posbias.Task):
        name, n_slots, pool_size = "no-items", 2, None

        def _example(self, i):
            return i

        def build(self, ex, p):
            return Prompt(str(ex), p, "a\nb", "", ("a",))

    with pytest.raises(PosbiasError, match="does not list its items"):
        run_attention(_cfg(task=NoItems(), task_options={}), tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()


@pytest.mark.real
def test_real_smollm2_attention(smollm2, tmp_path):
    """The capture on the real model (the rollout beside it is checked on the tiny model above: on SmolLM2 it doubled
    this test's time, 35 -> 70 CPU s, for no assertion of its own)."""
    res = run_attention(_cfg(model="smollm2-135m", task_options={"facts": 6}, n=2, positions="0,5", rollout=False),
                        tmp_path / "r", loaded=smollm2, progress=False)
    per = res.summary["per_scale"][0]["per_position"]
    assert per[0]["bands"]["late"]["first"] > 0.3  # measured 0.49: the first token is SmolLM2's attention sink
    assert all(abs(sum(r["items"]) + r["first"] + r["other"] - 1) < 1e-3 for r in res.rows)
