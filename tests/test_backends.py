"""Backends without a server: model specs parsed once (and refused in one line), capabilities known before an
engine starts, and the teacher-forced protocol over replies giving the in-process verdicts, ties included.
The real served paths are tested against a real vLLM server in tests/test_served.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import tiny_loaded
from posbias import PosbiasError, get_task
from posbias.backends import Reply
from posbias.backends.base import is_greedy
from posbias.measure import Scorer, parse_spec
from posbias.scoring.engines import get_engine

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
    logprobs = parse_spec("openai:model=m,tokenizer=d,teacher_forcing=prompt_logprobs").caps
    chat = parse_spec("openai:model=m").caps
    assert tokens.teacher_forcing == "generate" and tokens.token_prompts and not tokens.prompt_logprobs
    assert logprobs.prompt_logprobs and logprobs.teacher_forcing == "prompt_logprobs"
    assert not tokens.methods and tokens.batching == "requests" and tokens.top_logprobs
    assert not chat.prompt_logprobs and not chat.token_prompts and chat.top_logprobs
    assert parse_spec("vllm:d").caps.teacher_forcing == "generate" and not parse_spec("vllm:d").caps.methods
    hf = parse_spec("smollm2-135m").caps
    assert hf.methods and hf.prefix_sharing and hf.batching == "padded"
    tf = get_engine("teacher-forced")
    tf.check(chat, "openai", get_task("mc-kv"))  # an order task: its labels from the first token's top logprobs
    with pytest.raises(PosbiasError, match="use `engine=generate`"):
        tf.check(chat, "openai", get_task("kv-lookup"))
    with pytest.raises(PosbiasError, match="needs token prompts on a server with prompt_logprobs"):
        parse_spec("openai:model=m,teacher_forcing=prompt_logprobs")


def test_ties_follow_the_in_process_argmax_from_values():
    assert int(torch.tensor([1.0, 3.0, 3.0]).argmax()) == 1  # torch picks the lowest id among equal logits
    assert is_greedy(5, -0.1, {5: -0.1, 9: -2.0})
    assert is_greedy(1, -0.7, {2: -0.7, 1: -0.7})  # tied with token 2, lower id: the argmax, wherever it was ranked
    assert not is_greedy(2, -0.7, {2: -0.7, 1: -0.7})  # tied with token 1: not the argmax
    assert not is_greedy(1, -0.9, {2: -0.7, 1: -0.9})  # below the top token
    assert is_greedy(1, -0.7, {3: -0.7, 2: -0.7, 1: -0.7})  # a three-way tie, the lowest id


RECORDED = json.loads((Path(__file__).parent / "replies" / "vllm.json").read_text())  # a real vLLM server's replies


def shape(value):
    """The structure of a JSON value: dict keys (entries keyed by token collapsed to one), list item shapes."""
    if isinstance(value, dict):
        keys = {"<token>" if k.lstrip("-").isdigit() or k.startswith("token_id:") else k for k in value}
        return {k: shape(next(v for j, v in value.items() if ("<token>" if j.lstrip("-").isdigit() or
                                                               j.startswith("token_id:") else j) == k)) for k in keys}
    if isinstance(value, list):
        return sorted({json.dumps(shape(v), sort_keys=True) for v in value})
    return type(value).__name__ if value is not None else "null"


@torch.inference_mode()
def prompt_logprobs_like_vllm(model, ids: list[int], k: int = 2) -> dict:
    """A completion choice with vLLM V1's prompt_logprobs for `ids`: per position the prompt token and the top k,
    the top k numbered 1..k by their place in topk (vLLM overwrites their computed rank so), the prompt token's
    rank 1 + the tokens more likely."""
    lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    out: list = [None]
    for j in range(1, len(ids)):
        p = lp[j - 1]
        entry = {str(ids[j]): {"logprob": float(p[ids[j]]), "rank": int((p > p[ids[j]]).sum()) + 1, "decoded_token": "?"}}
        vals, top = p.topk(k)
        entry.update({str(int(t)): {"logprob": float(v), "rank": r + 1, "decoded_token": "?"}
                      for r, (v, t) in enumerate(zip(vals, top))})
        out.append(entry)
    return {"index": 0, "text": "", "prompt_logprobs": out, "finish_reason": "length"}


@torch.inference_mode()
def generation_like_vllm(model, ids: list[int], n: int, k: int = 1) -> dict:
    """A completion choice of greedy generation with logprobs=k and return_tokens_as_token_ids, as vLLM lists it."""
    toks, lps, tops = [], [], []
    for _ in range(n):
        p = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        t = int(p.argmax())
        vals, top = p.topk(k)
        toks.append(f"token_id:{t}")
        lps.append(float(p[t]))
        tops.append({f"token_id:{int(a)}": float(v) for v, a in zip(vals, top)} | {f"token_id:{t}": float(p[t])})
        ids = ids + [t]
    return {"index": 0, "text": "", "logprobs": {"text_offset": list(range(n)), "token_logprobs": lps, "tokens": toks,
                                                 "top_logprobs": tops}, "finish_reason": "length"}


def test_fakes_have_the_recorded_shape():
    lo = tiny_loaded("llama")
    plp = prompt_logprobs_like_vllm(lo.model, [1, 2, 3, 4])
    real = RECORDED["prompt_logprobs"]["reply"]["choices"][0]
    assert shape(plp["prompt_logprobs"]) == shape(real["prompt_logprobs"])
    gen = generation_like_vllm(lo.model, [1, 2, 3], 2, k=2)
    assert shape(gen["logprobs"]) == shape(RECORDED["generate_ids"]["reply"]["choices"][0]["logprobs"])


def test_a_recorded_tie_is_decided_from_values():
    """At prompt position 3 of the recorded reply two tokens tie; vLLM ranked the higher id (1604) first. The
    in-process argmax picks the lower one (198): decided from the values, as is_greedy does."""
    from posbias.backends import Request
    from posbias.backends.openai import _prompt_steps

    req = RECORDED["prompt_logprobs"]["request"]
    choice = RECORDED["prompt_logprobs"]["reply"]["choices"][0]
    steps = _prompt_steps(choice, Request("logprobs", ids=req["prompt"], start=1))
    alts = steps[2][2]
    assert alts[1604] == alts[198] and choice["prompt_logprobs"][3]["1604"]["rank"] == 1
    assert is_greedy(198, alts[198], alts) and not is_greedy(1604, alts[1604], alts)
    assert not is_greedy(26843, steps[2][1], alts)  # the prompt's own token, far below


def served_view(lo, task, route: str):
    from types import SimpleNamespace

    caps = parse_spec(f"openai:model=m,tokenizer=d,teacher_forcing={route}").caps
    return SimpleNamespace(backend=SimpleNamespace(caps=caps, tokenizer=lo.tokenizer), task=task, max_new_tokens=8,
                           loaded=None, count_tokens=lambda t: len(t))


@pytest.mark.parametrize("route", ["prompt_logprobs", "generate"])
def test_verdicts_from_replies_equal_the_in_process_verdicts(route):
    from posbias.backends.openai import _gen_steps, _prompt_steps

    lo = tiny_loaded("llama")
    task = get_task("kv-lookup", facts=4, digits=3)
    scorer = Scorer(lo, task, "teacher-forced", prefix_sharing=False)
    rows = scorer.rows(task.examples(6, 0, 0), [0, 1, 2, 3])
    gen = {(r["example_id"], r["position"]): r["prediction"] for r in Scorer(lo, task, "generate").score(rows)}
    # a random model is rarely right: half the rows get its own greedy continuation as the answer (joined as it is)
    rows = scorer.prompt_rows([replace(r.prompt, answers=(gen[r.key],) if i % 2 else (" " + r.prompt.answers[0],))
                               for i, r in enumerate(rows)], continuation=True)
    local = {(r["example_id"], r["position"]): r for r in scorer.score(rows)}
    tf, view = get_engine("teacher-forced"), served_view(lo, task, route)
    for row in rows:
        want = local[row.key]
        replies = []
        for q in tf.requests(view, row):
            if q.kind == "logprobs":
                replies.append(Reply(tokens=_prompt_steps(prompt_logprobs_like_vllm(lo.model, q.ids), q)))
            else:
                replies.append(Reply(tokens=_gen_steps(generation_like_vllm(lo.model, q.ids, q.max_tokens))))
        got = tf.verdict(view, row, replies)
        assert got["correct"] == want["correct"]
        if route == "prompt_logprobs":
            assert got["prediction"] == want["prediction"] and got["logprob"] == pytest.approx(want["logprob"], abs=1e-4)
        elif got["correct"]:
            assert got["logprob"] == pytest.approx(want["logprob"], abs=1e-4)
    assert any(r["correct"] for r in local.values()) and not all(r["correct"] for r in local.values())


def test_dialects_detected_from_the_model_listing_and_their_prompts():
    from posbias.backends.dialects import choose_prompts, detect

    # owned_by as the real servers list it: vLLM (tests/replies/vllm.json's server) and llama-cpp-python ("me")
    assert detect([{"id": "smollm2", "owned_by": "vllm"}]).name == "vllm"
    assert detect([{"id": "smollm2", "owned_by": "me"}]).name == "llamacpp"
    hosted = detect([{"id": "gpt-x", "owned_by": "system"}])
    assert hosted.name == "openai" and not hosted.exact_greedy
    assert choose_prompts(detect([{"owned_by": "me"}]), None, True) == "text"
    assert choose_prompts(detect([{"owned_by": "vllm"}]), None, True) == "tokens"
    assert choose_prompts(hosted, None, True) == "chat"
    with pytest.raises(PosbiasError, match=r"dialect, openai, takes no prompts=tokens.*or dialect=vllm"):
        choose_prompts(hosted, "tokens", True)


def test_replies_of_a_text_listing_server_parse():
    """llama.cpp lists generated tokens by text (tests/replies/llamacpp.json, a real reply): parsed as text steps."""
    from posbias.backends.openai import _gen_steps

    real = json.loads((Path(__file__).parent / "replies" / "llamacpp.json").read_text())
    steps = _gen_steps(real["generate_text"]["reply"]["choices"][0])
    assert steps and all(isinstance(t, str) and t in alts for t, _, alts in steps)
    assert real["token_ids_refused"]["status"] == 500 and "validation error" in real["token_ids_refused"]["reply"]["error"]["message"]
