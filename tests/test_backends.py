"""Backends without a server: model specs parsed once (and refused in one line), capabilities known before an
engine starts, and the teacher-forced protocol over replies giving the in-process verdicts, ties included.
The real served paths are tested against a real vLLM server in tests/test_served.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import tiny_loaded
from posbias import PosbiasError, get_task
from posbias.backends import Reply
from posbias.eval.engines import _greedy, get_engine
from posbias.measure import Scorer, parse_spec

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("text, backend, args", [
    ("smollm2-135m", "hf", {"model": "smollm2-135m"}),
    ("runs/p2d/model", "hf", {"model": "runs/p2d/model"}),
    ("hf:runs/x", "hf", {"model": "runs/x"}),
    ("vllm:/m/llama-70b,tensor_parallel_size=8,pipeline_parallel_size=2,enforce_eager=true",
     "vllm", {"model": "/m/llama-70b", "tensor_parallel_size": 8, "pipeline_parallel_size": 2, "enforce_eager": True}),
    ("openai:model=qwen,base_url=http://h:8000/v1,tokenizer=d,concurrency=4,timeout=2.5",
     "openai", {"model": "qwen", "base_url": "http://h:8000/v1", "tokenizer": "d", "concurrency": 4, "timeout": 2.5}),
    ("openai:gpt-x,prompts=chat", "openai", {"model": "gpt-x", "prompts": "chat"}),
])
def test_specs_parse_once(text, backend, args):
    spec = parse_spec(text)
    assert (spec.backend, spec.args) == (backend, args)


@pytest.mark.parametrize("text, message", [
    ("openai:model=m,colour=red", "backend 'openai' takes no 'colour'"),
    ("openai:", "names no model"),
    ("openai:m,notapair", "'notapair' in model spec"),
    ("openai:model=m,prompts=bogus", "unknown prompts 'bogus'"),
    ("openai:model=m", "use prompts=chat"),  # no tokenizer, so no token prompts: chat is the default ...
    ("hf:x,dtype=fp32", "backend 'hf' takes no 'dtype'"),
])
def test_bad_specs_are_one_line(text, message):
    if text == "openai:model=m":  # ... and token prompts without one are refused
        text = "openai:model=m,prompts=tokens"
    with pytest.raises(PosbiasError, match=message.replace("(", r"\(")):
        parse_spec(text)


def test_model_lists_keep_each_specs_own_items():
    from posbias.measure import split_models

    text = "smollm2-135m,openai:model=m,base_url=http://h:1/v1,tokenizer=d,runs/p2d/model,vllm:/m,tensor_parallel_size=2"
    assert split_models(text) == ["smollm2-135m", "openai:model=m,base_url=http://h:1/v1,tokenizer=d", "runs/p2d/model",
                                  "vllm:/m,tensor_parallel_size=2"]


def test_capabilities_are_known_before_a_start():
    tokens = parse_spec("openai:model=m,tokenizer=d").caps
    chat = parse_spec("openai:model=m").caps
    assert tokens.prompt_logprobs and tokens.token_prompts and not tokens.methods and tokens.batching == "requests"
    assert not chat.prompt_logprobs and not chat.token_prompts
    assert parse_spec("vllm:d").caps.prompt_logprobs and not parse_spec("vllm:d").caps.methods
    hf = parse_spec("smollm2-135m").caps
    assert hf.methods and hf.prefix_sharing and hf.batching == "padded"
    with pytest.raises(PosbiasError, match="use `engine=generate`"):
        get_engine("teacher-forced").check(chat, "openai")


def test_ties_follow_the_in_process_argmax():
    assert int(torch.tensor([1.0, 3.0, 3.0]).argmax()) == 1  # torch picks the lowest id among equal logits
    assert _greedy(5, (-0.1, 1, 5, -0.1))
    assert _greedy(1, (-0.7, 2, 2, -0.7))  # tied with token 2, lower id: the argmax
    assert not _greedy(2, (-0.7, 2, 1, -0.7))  # tied with token 1: not the argmax
    assert not _greedy(1, (-0.9, 2, 2, -0.7))  # below the top token
    assert not _greedy(1, (-0.7, 3, 2, -0.7))  # a three-way tie: the third token is unknown, counted as not greedy


@torch.inference_mode()
def replies_like_vllm(model, row) -> list[Reply]:
    """What vLLM's prompt_logprobs=1 gives for each answer of a row, computed the way vLLM computes it
    (rank = how many tokens have a logprob at least the token's own), from the model's unpadded forward."""
    out = []
    for ans in row.answer_ids:
        ids = row.prompt_ids + ans
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        toks = []
        for j in range(len(row.prompt_ids), len(ids)):
            p = lp[j - 1]
            top = int(p.argmax())
            toks.append((float(p[ids[j]]), int((p >= p[ids[j]]).sum()), top, float(p[top])))
        out.append(Reply(tokens=toks))
    return out


def test_verdicts_from_replies_equal_the_in_process_verdicts():
    lo = tiny_loaded("llama")
    task = get_task("kv-lookup", facts=4, digits=3)
    scorer = Scorer(lo, task, "teacher-forced", prefix_sharing=False)
    rows = scorer.rows(task.examples(6, 0, 0), [0, 1, 2, 3])
    gen = {(r["example_id"], r["position"]): r["prediction"] for r in Scorer(lo, task, "generate").score(rows)}
    # a random model is rarely right: half the rows get its own greedy continuation as the answer (joined as it is)
    rows = scorer.prompt_rows([replace(r.prompt, answers=(gen[r.key],) if i % 2 else (" " + r.prompt.answers[0],))
                               for i, r in enumerate(rows)], continuation=True)
    local = {(r["example_id"], r["position"]): r for r in scorer.score(rows)}
    tf = get_engine("teacher-forced")
    for row in rows:
        want = local[row.key]
        got = tf.verdict(scorer, row, replies_like_vllm(lo.model, row))
        assert got["correct"] == want["correct"] and got["prediction"] == want["prediction"]
        assert got["logprob"] == pytest.approx(want["logprob"], abs=1e-4)
    assert any(r["correct"] for r in local.values()) and not all(r["correct"] for r in local.values())
