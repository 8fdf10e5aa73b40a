"""Served backends against a real llama.cpp server (llama-cpp-python's, tests/llamacpp.py) on 127.0.0.1, serving
SmolLM2's GGUF file directly, with the fault-injecting proxy of tests/served.py in front where a fault is needed.

The dialect is detected (no token-id prompts, a JSON 500 for a bad request); the text protocol (posbias's own
template, the server's tokenisation checked) reproduces the in-process sweep for both engines; the chat protocol
generates with every llama.cpp sampler off, and scores an order task from the first token's top logprobs;
compare and --resume run through it; every hint a refusal prints works when followed.
"""

from __future__ import annotations

import json

import pytest

from llamacpp import N_CTX, NAME, llama_missing
from served import Proxy

pytestmark = [pytest.mark.real, pytest.mark.skipif(llama_missing() is not None, reason=str(llama_missing()))]

KV = {"facts": 6}
POS = "0,2,5"


def spec(url: str, **extra) -> str:
    kv = {"model": NAME, "base_url": url, "tokenizer": "smollm2-135m", "context_window": N_CTX, "concurrency": 2, **extra}
    return "openai:" + ",".join(f"{k}={v}" for k, v in kv.items() if v is not None)


def sweep(model: str, out=None, engine: str = "generate", n: int = 6, task: str = "kv-lookup", options=None,
          positions: str = POS, **kw):
    from posbias import SweepConfig, run_sweep

    cfg = SweepConfig(model=model, task=task, task_options=KV if options is None else options, positions=positions, n=n,
                      engine=engine)
    return run_sweep(cfg, out, progress=False, **kw)


def keyed(rows: list[dict]) -> dict:
    return {(r["example_id"], json.dumps(r["position"])): r for r in rows}


@pytest.fixture(scope="module")
def in_process(smollm2):
    """The in-process reference: the session's SmolLM2 (load_model's default dtype, as a load here would be)."""
    return smollm2


def test_dialect_detected_and_every_sampler_off(llama_server):
    from posbias import open_backend

    b = open_backend(spec(llama_server["url"]))
    assert (b.info["dialect"], b.info["prompts"], b.info["teacher_forcing"]) == ("llamacpp", "text", "generate")
    sent = b.decoding()["request"]
    # llama-cpp-python's own defaults (repeat_penalty 1.1, top_k 40, min_p 0.05, top_p 0.95) would change the digits
    assert sent["repeat_penalty"] == 1.0 and sent["top_k"] == 0 and sent["min_p"] == 0.0 and sent["top_p"] == 1
    assert sent["temperature"] == 0 and sent["mirostat_mode"] == 0


@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_text_protocol_reproduces_in_process(llama_server, in_process, engine, tmp_path):
    from posbias import SweepConfig, run_sweep

    served = sweep(spec(llama_server["url"]), tmp_path / "s", engine=engine, n=4)
    local = run_sweep(SweepConfig(task_options=KV, positions=POS, n=4, engine=engine), loaded=in_process, progress=False)
    a, b = keyed(local.rows), keyed(served.rows)
    # llama.cpp computes on the Q4_1 weights, posbias on their bf16 dequantisation: near ties may flip (measured:
    # none on these 12 rows); every prompt's tokenisation was checked against the in-process ids
    assert sum(a[k]["correct"] == b[k]["correct"] for k in a) >= len(a) - 1
    record = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert record["backend"]["counters"]["tokenize_checks"] == 12 and record["model"]["prompts"] == "text"


def test_chat_protocol_answers_past_the_restated_prefix(llama_server):
    """The chat template is the server's and the answer prefix sits in the user's message: the model restates it
    ("The code for K is ...") before the digits, which the generation limit makes room for and the verdict skips."""
    served = sweep(spec(llama_server["url"], prompts="chat"))
    assert served.summary["average"] > 0.3 and served.summary["cut"]["rows"] == 0
    # (a restatement naming another key stays in the prediction: a wrong answer)
    assert sum(r["prediction"].lstrip().startswith("The code") for r in served.rows) <= 2


def test_order_task_on_chat_is_scored_from_top_logprobs(llama_server, in_process):
    from posbias import SweepConfig, run_sweep

    mc = {"engine": "teacher-forced", "task": "mc-kv", "options": {}, "positions": "all", "n": 3}
    chat = sweep(spec(llama_server["url"], prompts="chat", tokenizer=None), **mc)
    assert {r["choice"] for r in chat.rows} <= set(range(4)) and all(len(r["option_logprobs"]) == 4 for r in chat.rows)
    assert sum(v is not None for r in chat.rows for v in r["option_logprobs"]) >= len(chat.rows)
    assert "order" in chat.summary
    text = sweep(spec(llama_server["url"]), **mc)
    local = run_sweep(SweepConfig(task="mc-kv", positions="all", n=3), loaded=in_process, progress=False)
    a, b = keyed(local.rows), keyed(text.rows)
    assert sum(a[k]["choice"] == b[k]["choice"] for k in a) >= len(a) - 1


def test_compare_and_resume_through_llama_cpp(llama_server, in_process, tmp_path):
    from posbias import SweepConfig, run_compare

    cfg = SweepConfig(task_options=KV, positions=POS, n=2)
    models = [in_process, spec(llama_server["url"])]
    res = run_compare(cfg, ["none"], tmp_path / "c", models=models, progress=False)
    assert len(res.entries) == 2
    again = run_compare(cfg, ["none"], tmp_path / "c", models=models, resume=True, progress=False)
    assert [e["summary"]["average"] for e in again.entries] == [e["summary"]["average"] for e in res.entries]


def test_token_prompts_are_refused_with_the_way_on(llama_server):
    from posbias import PosbiasError, open_backend

    with pytest.raises(PosbiasError, match=r"dialect, llamacpp, takes no prompts=tokens .* use prompts=text") as e:
        open_backend(spec(llama_server["url"], prompts="tokens"))
    fix = str(e.value).split("use ")[-1].split(" ")[0]  # followed as printed
    assert open_backend(spec(llama_server["url"], **dict([fix.split("=")]))).info["prompts"] == "text"


def test_missing_window_names_the_servers_option(llama_server):
    from posbias import PosbiasError, open_backend

    with pytest.raises(PosbiasError, match=r"add context_window=N .*--n_ctx"):
        open_backend(spec(llama_server["url"], context_window=None))


def test_a_bad_request_shows_the_servers_reason_once(llama_server):
    """llama-cpp-python answers a validation error with HTTP 500: shown with its reason, sent once, never retried."""
    from posbias import PosbiasError, open_backend

    proxy = Proxy(llama_server["url"])
    try:
        b = open_backend(spec(proxy.url, dialect="llamacpp"))
        b.dialect = type(b.dialect)(**{**b.dialect.__dict__, "greedy": {**b.dialect.greedy, "top_k": -1}})  # as before
        from posbias.backends import Request

        with pytest.raises(PosbiasError, match=r"HTTP 500: 1 validation error.*greater than or equal to 0"):
            list(b.run([Request("generate", ids=[1, 2, 3], max_tokens=2)]))
        assert proxy.posts == 2 and b.counters()["retries"] == 0  # the tokenisation check, then the one request
    finally:
        proxy.stop()


def test_outages_are_still_retried(llama_server):
    proxy = Proxy(llama_server["url"])
    try:
        proxy.fail = (3, 503)
        served = sweep(spec(proxy.url), n=2)
        assert len(served.rows) == 6 and served.record["backend"]["counters"]["retries"] >= 3
    finally:
        proxy.stop()


def test_a_long_context_grid_through_llama_cpp_builds_the_in_process_prompts(llama_server, in_process, tmp_path):
    from posbias import GridConfig, run_grid

    # what is checked is that the served prompts are the in-process ones, at lengths half those this test first ran
    # at (512 and 1,024 tokens: 94 s in the suite, most of it llama.cpp prefilling beside the other worker)
    base = dict(task="niah", depths="linear:3", n=1, engine="generate")
    served = run_grid(GridConfig(model=spec(llama_server["url"]), fill="12.5%,25%", **base), tmp_path / "g",
                      progress=False)
    local = run_grid(GridConfig(sizes="256,512", **base), loaded=in_process, progress=False)  # its window is 8192
    assert [s["size"] for s in served.record["sizes"]] == [N_CTX // 8, N_CTX // 4]  # the served window's shares
    assert served.record["references"] and served.record["effective"]["lengths"] == [256, 512]
    key = lambda r: (r["size"], r["example_id"], r["position"])  # noqa: E731
    s, p = {key(r): r for r in served.rows}, {key(r): r for r in local.rows}
    assert s.keys() == p.keys() and len(s) == 6
    for k in s:  # the same haystack, needle depths and token counts (SmolLM2's tokenizer, our template, as text)
        assert (s[k]["prompt_tokens"], s[k]["needle_depths"]) == (p[k]["prompt_tokens"], p[k]["needle_depths"])
        assert s[k]["prompt_tokens"] <= k[0]
    assert sum(s[k]["correct"] == p[k]["correct"] for k in s) >= 5  # Q4_1 on llama.cpp against bf16 in process
    again = run_grid(GridConfig(model=spec(llama_server["url"]), fill="12.5%,25%", **base), tmp_path / "g", resume=True,
                     progress=False)
    assert again.record["cells"] == served.record["cells"]


def test_a_prompt_over_the_window_advises_the_servers_n_ctx(llama_server, tmp_path):
    """The server's refusal of a prompt over its window (its 400, in OpenAI's words) is named as such, with the
    window it states: context_window=2048, followed as printed, refuses the long rows before sending any."""
    from served import cli, follow

    proxy = Proxy(llama_server["url"])
    try:
        argv = ["sweep", "--model", spec(proxy.url, context_window=2 * N_CTX), "--facts", "150", "--n", "1", "--positions",
                "0", "--out", str(tmp_path / "run"), "--quiet"]
        line = cli(argv)
        assert f"the server refused a prompt longer than its context window (HTTP 400: This model's maximum context " \
               f"length is {N_CTX} tokens" in line, line
        assert line.split(" -- ")[1].startswith(f"set context_window={N_CTX} in the model spec") and "prompts=" not in \
            line.split(" -- ")[1] and "and rerun with --overwrite (nothing is lost)" in line
        (again, _), = follow(argv, line)
        proxy.received = 0
        assert f"but the model's context window is {N_CTX} -- use fewer" in cli(again) and proxy.received == 0
    finally:
        proxy.stop()


def test_a_slow_llama_server_is_not_asked_again(llama_server, tmp_path):
    """llama-cpp-python computes a request to the end after its client left (a 500-token reply abandoned at 1 s held
    the next request for 144 s): a reply past the timeout is never sent again there; one line says what to do."""
    from served import cli, follow

    proxy = Proxy(llama_server["url"])
    try:
        proxy.delay = (1000, 3.0)
        argv = ["sweep", "--model", spec(proxy.url, timeout=1), "--facts", "6", "--n", "1", "--positions", POS,
                "--engine", "generate", "--out", str(tmp_path / "run"), "--quiet"]
        line = cli(argv)
        assert proxy.received == 2, proxy.received  # the two in flight (concurrency=2), each once
        assert "no reply within 1 s (1 try) from a server that took the request" in line, line
        assert line.endswith("-- give it more time with timeout=120 in the model spec, and rerun with --resume (no row "
                             "is kept yet)"), line
        proxy.delay = (0, 0.0)
        (again, _), = follow(argv, line)
        assert cli(again) is None and (tmp_path / "run" / "sweep.json").is_file()
    finally:
        proxy.stop()
