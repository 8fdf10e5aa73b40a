"""The prompt protocols and teacher-forcing routes against the real vLLM server of the session (tests/served.py):
text prompts (posbias's template, the server's tokenisation checked) give the token-id rows; teacher forcing by
greedy generation gives the verdicts of prompt_logprobs; an order task on chat messages is scored from the first
token's top logprobs; the live replies still have the shapes recorded in tests/replies/vllm.json, which the unit
tests' fakes are built in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from served import NAME, vllm_missing
from test_backends import RECORDED, shape

pytestmark = [pytest.mark.real, pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]

KV = {"facts": 6}
POS = "0,2,5"


def spec(server, **extra) -> str:
    kv = {"model": NAME, "base_url": server["url"], "tokenizer": server["dir"], **extra}
    return "openai:" + ",".join(f"{k}={v}" for k, v in kv.items() if v is not None)


def sweep(model: str, engine: str = "teacher-forced", n: int = 6, **kw):
    from posbias import SweepConfig, run_sweep

    return run_sweep(SweepConfig(model=model, task_options=KV, positions=POS, n=n, engine=engine, **kw), progress=False)


def verdicts(res) -> dict:
    return {(r["example_id"], json.dumps(r["position"])): r["correct"] for r in res.rows}


def test_text_prompts_give_the_token_rows(vllm_server):
    tokens = sweep(spec(vllm_server))
    text = sweep(spec(vllm_server, prompts="text"))
    assert verdicts(text) == verdicts(tokens) and text.record["model"]["prompts"] == "text"
    assert text.record["backend"]["counters"]["tokenize_checks"] == 18


def test_teacher_forcing_by_generation_equals_prompt_logprobs(vllm_server):
    by_gen = sweep(spec(vllm_server))
    by_logprobs = sweep(spec(vllm_server, teacher_forcing="prompt_logprobs"))
    assert verdicts(by_gen) == verdicts(by_logprobs)
    assert by_gen.record["model"]["teacher_forcing"] == "generate"
    assert by_logprobs.record["backend"]["counters"]["requests"] >= by_gen.record["backend"]["counters"]["requests"]


def test_order_task_on_chat_messages_from_top_logprobs(vllm_server):
    from posbias import SweepConfig, run_sweep

    cfg = SweepConfig(model=f"openai:model={NAME},base_url={vllm_server['url']},prompts=chat", task="mc-kv", n=3)
    res = run_sweep(cfg, progress=False)
    assert {r["choice"] for r in res.rows} <= {-1, 0, 1, 2, 3} and "order" in res.summary
    assert sum(v is not None for r in res.rows for v in r["option_logprobs"]) >= len(res.rows)


@pytest.mark.parametrize("name", ["prompt_logprobs", "generate_ids", "chat_top_logprobs", "tokenize"])
def test_live_replies_keep_the_recorded_shape(vllm_server, name):
    import requests

    case = RECORDED[name]
    root = vllm_server["url"].removesuffix("/v1")
    route = case.get("route") or ("/v1/chat/completions" if "messages" in case["request"] else "/v1/completions")
    live = requests.post(root + route, json=case["request"], timeout=120).json()
    for drop in ("id", "created", "system_fingerprint"):
        live.pop(drop, None)
    assert shape(live) == shape(case["reply"])
    assert Path(__file__).with_name("replies").joinpath("vllm.json").is_file()
