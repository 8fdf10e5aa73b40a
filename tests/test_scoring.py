"""Scoring engines on tiny random models of every supported family (fp32, 2 threads)."""

import dataclasses

import pytest
import torch

from conftest import ARCHS, tiny_loaded
from posbias import get_task
from posbias.measure import Scorer
from posbias.scoring.encode import encode, left_pad, plan_batches, right_pad
from posbias.scoring.scorer import use_chat


def _rows(loaded, n=8, facts=4, positions=(0, 1, 3)):
    task = get_task("kv-lookup", facts=facts, digits=3)
    return Scorer(loaded, task).rows(task.examples(n, seed=0), list(positions)), task


def score_rows(loaded, task, rows, engine, max_new, max_batch=32):
    return Scorer(loaded, task, engine, max_new, max_batch=max_batch).score(rows)


@pytest.fixture(scope="module", params=ARCHS)
def loaded(request):
    return tiny_loaded(request.param, chat=request.param != "gpt2")


def test_encode_appends_answer_after_prefix(loaded):
    task = get_task("kv-lookup", facts=3, digits=3)
    ex = task.examples(1)[0]
    chat = use_chat(loaded, "auto")
    row = encode(loaded.tokenizer, task.build(ex, 1), chat)
    tok = loaded.tokenizer
    text = tok.decode(row.prompt_ids + row.answer_ids[0])
    assert text.endswith(f"The code for {ex.pairs[ex.gold][0]} is {ex.pairs[ex.gold][1]}")
    assert text.startswith("<|user|>\nBelow is a list of facts" if chat else "Below is a list of facts")


def test_batch_size_1_and_8_give_identical_results(loaded):
    rows, task = _rows(loaded)
    one = score_rows(loaded, task, rows, "teacher-forced", 8, max_batch=1)
    eight = score_rows(loaded, task, rows, "teacher-forced", 8, max_batch=8)
    key = lambda r: (r["example_id"], r["position"])  # noqa: E731
    one, eight = sorted(one, key=key), sorted(eight, key=key)
    assert [r["prediction"] for r in one] == [r["prediction"] for r in eight]
    assert [r["correct"] for r in one] == [r["correct"] for r in eight]
    assert [r["logprob"] for r in one] == pytest.approx([r["logprob"] for r in eight], abs=1e-3)
    g1 = score_rows(loaded, task, rows, "generate", 6, max_batch=1)
    g8 = score_rows(loaded, task, rows, "generate", 6, max_batch=8)
    assert sorted((key(r), r["prediction"]) for r in g1) == sorted((key(r), r["prediction"]) for r in g8)


@torch.inference_mode()
def test_left_and_right_padding_agree(loaded):
    rows, _ = _rows(loaded, n=4)
    seqs = [r.prompt_ids[: 40 + 7 * i] for i, r in enumerate(rows[:4])]  # different lengths
    left = loaded.model(**left_pad(seqs, 0)).logits
    right = loaded.model(**right_pad(seqs, 0)).logits
    width = left.shape[1]
    for i, s in enumerate(seqs):
        n = len(s)
        torch.testing.assert_close(left[i, width - n :], right[i, :n], atol=1e-4, rtol=1e-4)
        solo = loaded.model(input_ids=torch.tensor([s])).logits[0]
        torch.testing.assert_close(left[i, width - n :], solo, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_padding_needs_position_ids():
    """Guard that the padding test can fail: with absolute positions (GPT-2), the arange
    positions plain model(...) uses shift a left-padded row. (RoPE is shift-invariant.)"""
    loaded = tiny_loaded("gpt2", chat=False)
    rows, _ = _rows(loaded, n=2)
    b = left_pad([rows[0].prompt_ids[:30], rows[1].prompt_ids[:50]], 0)
    good = loaded.model(**b).logits[0, -1]
    bad = loaded.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[0, -1]
    assert not torch.allclose(good, bad, atol=1e-3)


def test_teacher_forced_agrees_with_generate(loaded):
    """Gold := the model's own greedy continuation, so teacher forcing must call it correct;
    a changed last token must make it wrong."""
    rows, task = _rows(loaded)
    gen = score_rows(loaded, task, rows, "generate", 5)
    by_key = {(r["example_id"], r["position"]): r["prediction"] for r in gen}
    tok = loaded.tokenizer
    own, wrong = [], []
    for r in rows:
        pred = by_key[r.key]
        if not pred.strip():
            continue
        ids = tok(pred, add_special_tokens=False)["input_ids"]
        own.append(dataclasses.replace(r, answer_ids=[ids]))
        alt = ids[:-1] + [ids[-1] + 1 if ids[-1] + 1 < len(tok) else ids[-1] - 1]
        wrong.append(dataclasses.replace(r, answer_ids=[alt]))
    assert len(own) >= len(rows) // 2
    ok = score_rows(loaded, task, own, "teacher-forced", 5)
    assert all(r["correct"] for r in ok)
    assert [r["prediction"] for r in ok] == [tok.decode(r.answer_ids[0]) for r in own]
    bad = score_rows(loaded, task, wrong, "teacher-forced", 5)
    assert not any(r["correct"] for r in bad)


def test_plan_batches_is_deterministic_and_bounded():
    lengths = [5, 100, 50, 50, 7, 100, 3]
    plan = plan_batches(lengths, max_tokens=200, max_rows=3)
    assert plan == plan_batches(lengths, max_tokens=200, max_rows=3)
    assert sorted(i for b in plan for i in b) == list(range(7))
    for b in plan:
        assert len(b) <= 3 and len(b) * max(lengths[i] for i in b) <= 200 or len(b) == 1


def test_batches_given_groups_never_mix_them_and_keep_the_budget():
    lengths = [50, 10, 40, 10, 30, 50, 20, 40]
    groups = ["a", "b", "a", "b", "c", "a", "c", "b"]
    batches = plan_batches(lengths, 100, 2, groups)
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert all(len({groups[i] for i in b}) == 1 and len(b) <= 2 and len(b) * max(lengths[i] for i in b) <= 100
               for b in batches), batches
    assert plan_batches(lengths, 100, 2, groups) == batches  # deterministic: a resumed sweep gets the same
    assert any(len({groups[i] for i in b}) > 1 for b in plan_batches(lengths, 1000, 8))  # without groups they mix
