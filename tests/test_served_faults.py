"""What a user met running served sweeps, each pinned by a test:

1. transport keys (timeout, retries, concurrency, batch, cache) are not part of a run's fingerprint: a resume may
   change them (and sends only the missing rows); tokenizer= or model= still refuse;
2. timing.json and sweep.json's backend counters add up over every invocation of a run (a failed one included);
3. a failed run offers `resume` only where its folder keeps rows, saying how many;
4. a refused resume names the spec items that differ, in full;
5. a served model is named `openai:NAME` in progress bars, titles and compare's tables;
6. examples.jsonl is in row order however the replies arrived, so identical runs write identical files;
7. the CLI says "connecting to openai:NAME at URL" for a served model, not "loading ... (bf16, cpu)";
8. the test server runs as `vllm serve DIR`, and `posbias export` says so.

The tests that need the session's vLLM server use the `vllm_server` fixture (conftest marks them served); the rest
run on a tiny in-process model or on no model at all.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from posbias import PosbiasError, SweepConfig, get_task, run_compare, run_sweep
from served import NAME, Proxy, free_port, server_cmd

KV = {"facts": 6}  # short prompts: the server's one CPU core answers in seconds
POS = "0,2,5"


def spec(url: str, model_dir: str, **extra) -> str:
    kv = {"model": NAME, "base_url": url, "tokenizer": model_dir, **extra}
    return "openai:" + ",".join(f"{k}={v}" for k, v in kv.items())


def sweep(model: str, out=None, n: int = 1, progress: bool = False, **kw):
    cfg = SweepConfig(model=model, task_options=KV, positions=POS, n=n, engine="generate")
    return run_sweep(cfg, out, progress=progress, **kw)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def restart(proxy: Proxy) -> None:
    """Listen again once the proxy has stopped (die_after stops it from another thread)."""
    for _ in range(200):
        if proxy.server is None:
            break
        time.sleep(0.05)
    proxy.start()


@pytest.fixture()
def proxy(vllm_server):
    p = Proxy(vllm_server["url"])
    yield p
    p.stop()


# ----------------------------------------------------------------------------- 1. transport keys


def test_resume_takes_new_transport_keys_but_refuses_a_new_tokenizer(vllm_server, proxy, tmp_path):
    d, out = vllm_server["dir"], tmp_path / "run"
    sweep(spec(proxy.url, d, timeout=30, retries=1, concurrency=2), out)
    log = out / "examples.jsonl"
    log.write_text(log.read_text().splitlines(keepends=True)[0])  # as if killed after the first row
    (out / "sweep.json").unlink()
    proxy.posts = 0
    changed = spec(proxy.url, d, timeout=60, retries=2, concurrency=1, batch=2, cache=tmp_path / "cache")
    res = sweep(changed, out, resume=True)
    assert proxy.posts == 1, "the two missing rows, in one request (batch=2), and nothing else"
    assert len(res.rows) == 3 and len(lines(log)) == 3
    assert "timeout" not in json.dumps(json.loads((out / "run.json").read_text())["fingerprint"])
    with pytest.raises(PosbiasError, match="different configuration") as e:
        sweep(spec(proxy.url, d + "/"), out, resume=True)  # the same files, but another tokenizer= as written
    assert f"config.model: tokenizer={d} -> tokenizer={d}/" in str(e.value)
    with pytest.raises(PosbiasError, match="not 'other'"):  # another model=: the server serves smollm2 only
        sweep(spec(proxy.url, d).replace(f"model={NAME}", "model=other"), out, resume=True)
    assert proxy.posts == 1


def test_in_process_fingerprint_records_the_model_as_written(model_dir, tmp_path):
    cfg = SweepConfig(model=str(model_dir), task_options={"facts": 4, "digits": 3}, positions="0,3", n=2, dtype="fp32")
    run_sweep(cfg, tmp_path / "s", progress=False)
    fingerprint = json.loads((tmp_path / "s" / "run.json").read_text())["fingerprint"]
    assert fingerprint["config"]["model"] == str(model_dir)
    run_sweep(cfg, tmp_path / "s", resume=True, progress=False)


# ----------------------------------------------------------------------------- 2, 3. counters and the resume hint


def test_counters_add_up_over_a_failed_run_and_its_resumes(vllm_server, proxy, tmp_path):
    s, out = spec(proxy.url, vllm_server["dir"], retries=0, concurrency=1), tmp_path / "run"
    proxy.die_after = 2  # the second row's request is answered by no one
    with pytest.raises(PosbiasError, match="cannot connect") as e:
        sweep(s, out)
    assert e.value.fix.endswith(", and rerun with `resume` (1 row is kept)")
    first = json.loads((out / "timing.json").read_text())  # saved by the failed run
    assert first["replies"] == 1 and first["requests"] >= 3 and first["rows"] == 1 and first["invocations"] == 1
    proxy.die_after = None
    restart(proxy)
    res = sweep(s, out, resume=True)
    c = res.record["backend"]
    assert c["counters"]["replies"] == 3 and c["this_run"]["replies"] == 2
    assert c["counters"]["prompt_tokens"] > c["this_run"]["prompt_tokens"] > 0
    timing = json.loads((out / "timing.json").read_text())
    assert (timing["replies"], timing["rows"], timing["invocations"], timing["this_run"]["rows"]) == (3, 3, 2, 2)
    again = sweep(s, out, resume=True).record["backend"]  # nothing left to score
    assert again["this_run"]["replies"] == 0 and again["this_run"]["prompt_tokens"] == 0
    assert again["counters"]["replies"] == 3 and again["counters"]["prompt_tokens"] == c["counters"]["prompt_tokens"]
    assert again["counters"]["requests"] == c["counters"]["requests"] + again["this_run"]["requests"]
    assert json.loads((out / "sweep.json").read_text())["backend"] == again
    assert json.loads((out / "timing.json").read_text())["invocations"] == 3


def test_a_folder_without_rows_is_resumed_too(vllm_server, proxy, tmp_path):
    """No folder: no resume offered. A folder whose run failed before its first row still holds the run (run.json):
    a plain rerun is refused there, so the hint says --resume, and following it finishes the run."""
    s = spec(proxy.url, vllm_server["dir"], retries=0, concurrency=1)
    for out in (None, tmp_path / "run"):
        proxy.die_after, proxy.posts = 1, 0  # the first request already goes unanswered
        with pytest.raises(PosbiasError, match="cannot connect") as e:
            sweep(s, out)
        if out is None:
            assert "kept" not in str(e.value) and "resume" not in str(e.value)
        else:
            assert e.value.fix.endswith(", and rerun with `resume` (no row is kept yet)"), e.value.fix
        proxy.die_after = None
        restart(proxy)
    assert len(sweep(s, tmp_path / "run", resume=True).rows) == 3


def _failing_score(monkeypatch, after: int, when=lambda method: True):
    """Scorer.score scores `after` rows (logging them), then fails as a server that went away would."""
    from posbias.eval import sweep as sweep_module

    real = sweep_module.Scorer.score

    def score(self, rows, method=None, done=None, on_batch=None):
        if not when(method):
            return real(self, rows, method, done, on_batch)
        real(self, [r for r in rows if r.key not in (done or set())][:after], method, done, on_batch)
        raise PosbiasError("http://server/v1: cannot connect, 1 tries", "check that the server is up")

    monkeypatch.setattr(sweep_module.Scorer, "score", score)


def test_a_failed_sweep_offers_resume_with_the_rows_kept(loaded, tmp_path, monkeypatch):
    from posbias.cli import flag

    cfg = SweepConfig(task_options={"facts": 4, "digits": 3}, positions="0,3", n=2)
    _failing_score(monkeypatch, after=2)
    with pytest.raises(PosbiasError) as e:
        run_sweep(cfg, None, loaded=loaded, progress=False)  # no folder: nothing to resume
    assert e.value.fix == "check that the server is up"
    with pytest.raises(PosbiasError) as e:
        run_sweep(cfg, tmp_path / "s", loaded=loaded, progress=False)
    assert e.value.fix == "check that the server is up, and rerun with `resume` (2 rows are kept)"
    assert "and rerun with --resume (2 rows are kept)" in e.value.render(flag)
    _failing_score(monkeypatch, after=0)
    with pytest.raises(PosbiasError) as e:
        run_sweep(cfg, tmp_path / "t", loaded=loaded, progress=False)  # a folder, but no row in it: it holds the run
    assert e.value.fix == "check that the server is up, and rerun with `resume` (no row is kept yet)"
    monkeypatch.undo()
    run_sweep(cfg, tmp_path / "t", loaded=loaded, resume=True, progress=False)  # followed as printed


def test_a_fix_that_changes_the_rows_says_overwrite(loaded, tmp_path, monkeypatch):
    """A fix a resume cannot take (another prompts=, context_window=: the fingerprint changes) says --overwrite."""
    from posbias.backends.http import served_error
    from posbias.eval import sweep as sweep_module

    real = sweep_module.Scorer.score

    def score(self, rows, method=None, done=None, on_batch=None):
        real(self, rows[:1], method, done, on_batch)
        raise served_error("the server refused a prompt", "set context_window=2048 in the model spec", False)

    monkeypatch.setattr(sweep_module.Scorer, "score", score)
    cfg = SweepConfig(task_options={"facts": 4, "digits": 3}, positions="0,3", n=2)
    with pytest.raises(PosbiasError) as e:
        run_sweep(cfg, tmp_path / "s", loaded=loaded, progress=False)
    assert e.value.fix == "set context_window=2048 in the model spec, and rerun with `overwrite` (the row kept is scored again)"


def test_a_failed_comparison_counts_the_rows_of_every_entry(loaded, tmp_path, monkeypatch):
    cfg = SweepConfig(task_options={"facts": 4, "digits": 3}, positions="0,3", n=2)
    _failing_score(monkeypatch, after=1, when=lambda method: method.name == "pi")
    with pytest.raises(PosbiasError) as e:
        run_compare(cfg, ["none", "pi:1.5"], tmp_path / "c", loaded=loaded, progress=False)
    assert e.value.fix == "check that the server is up, and rerun with `resume` (5 rows are kept)"  # 4 + 1


# ----------------------------------------------------------------------------- 4. what a refused resume shows


def test_a_refused_resume_names_the_differing_items_in_full(tmp_path):
    from posbias.runs import RunFolder

    base = "openai:model=smollm2,base_url=http://127.0.0.1:8000/v1,context_window=2048,seed=0,tokenizer=/models/"
    long_dir = "/data/" + "x" * 150 + "/end-a"
    first = {"config": {"model": base + "a", "data_dir": long_dir}}
    with RunFolder(tmp_path / "r", "sweep", "sweep.json").open(first, False, False):
        pass
    second = {"config": {"model": base + "b", "data_dir": long_dir.replace("end-a", "end-b")}}
    with pytest.raises(PosbiasError) as e:
        with RunFolder(tmp_path / "r", "sweep", "sweep.json").open(second, True, False):
            pass
    message = str(e.value)
    assert "config.model: tokenizer=/models/a -> tokenizer=/models/b" in message
    assert 'end-a" -> ' in message and message.count("end-b") == 1  # a long value: both ends shown
    shown = message.split("config.data_dir: ")[1].split("; config.model")[0]
    assert len(shown) <= 2 * 120 + len(" -> ")  # each value cut to 120 characters


# ----------------------------------------------------------------------------- 5. short names


def test_a_served_spec_has_a_short_label():
    from posbias.eval.compare import model_label

    s = "openai:model=smollm2,base_url=http://127.0.0.1:8000/v1,tokenizer=/models/smollm2,timeout=5,concurrency=2"
    assert model_label(s) == "openai:smollm2" and model_label("smollm2-135m") == "smollm2-135m"


def test_served_runs_are_named_short(vllm_server, proxy, tmp_path, monkeypatch):
    from posbias.eval import sweep as sweep_module
    from posbias.runs import progress

    bars = []
    monkeypatch.setattr(sweep_module, "progress_bar", lambda total, desc, *a, **k: bars.append(desc) or progress(
        total, desc, *a, **{**k, "enabled": False}))
    s = spec(proxy.url, vllm_server["dir"], timeout=30)
    res = sweep(s, progress=True)
    assert bars == ["kv-lookup on openai:smollm2"] and res.format().startswith("kv-lookup on openai:smollm2: ")
    cfg = SweepConfig(task_options=KV, positions=POS, n=1, engine="generate")
    cmp = run_compare(cfg, ["none"], tmp_path / "c", models=[s], progress=False)
    table = cmp.format()
    assert cmp.entries[0]["label"] == "openai:smollm2" and "base_url" not in table
    assert table.splitlines()[1].startswith("openai:smollm2 ")
    posts = proxy.posts  # resumed with another timeout: the same entry folder, nothing sent again
    again = run_compare(cfg, ["none"], tmp_path / "c", models=[s.replace("timeout=30", "timeout=60")], resume=True,
                        progress=False)
    assert proxy.posts == posts and again.entries[0]["per_position"] == cmp.entries[0]["per_position"]
    assert [p.name for p in (tmp_path / "c").iterdir() if p.is_dir()] == [cmp.entries[0]["dir"]]


# ----------------------------------------------------------------------------- 6. row order


def test_rows_are_written_in_example_order(vllm_server, proxy, tmp_path):
    s = spec(proxy.url, vllm_server["dir"], concurrency=3, cache=tmp_path / "cache")
    proxy.delay = (1, 3.0)  # the first request is answered after the others
    a = sweep(s, tmp_path / "a", n=2)
    b = sweep(s, tmp_path / "b", n=2)  # the same replies, from the cache, in another order
    log = (tmp_path / "a" / "examples.jsonl").read_bytes()
    assert log == (tmp_path / "b" / "examples.jsonl").read_bytes()
    keys = [(r["example_id"], r["position"]) for r in lines(tmp_path / "a" / "examples.jsonl")]
    ids = [e.id for e in get_task("kv-lookup", **KV).examples(2, 0, 0)]  # the seeded example order
    assert keys == [(e, p) for e in ids for p in (0, 2, 5)] == [(r["example_id"], r["position"]) for r in a.rows]
    shutil.copytree(tmp_path / "b", tmp_path / "c")  # killed after two rows, logged out of order
    rows = log.decode().splitlines(keepends=True)
    (tmp_path / "c" / "examples.jsonl").write_text(rows[4] + rows[1])
    (tmp_path / "c" / "sweep.json").unlink()
    sweep(s, tmp_path / "c", n=2, resume=True)
    assert (tmp_path / "c" / "examples.jsonl").read_bytes() == log
    records = [json.loads((tmp_path / d / "sweep.json").read_text()) for d in "abc"]
    for r in records:
        r.pop("backend")  # how requests went (cache hits, counters): not the result
    assert records[0] == records[1] == records[2] and a.record["per_position"] == b.record["per_position"]


def test_in_process_rows_are_written_in_example_order(loaded, tmp_path):
    data = tmp_path / "docs.jsonl"  # examples of growing length: the plain path scores the longest rows first
    data.write_text("".join(json.dumps({"question": f"q{i}", "answers": ["a"], "documents": ["x" * 10 * i, "y a"],
                                        "gold": 1}) + "\n" for i in range(1, 5)))
    cfg = SweepConfig(task=f"jsonl:{data}", positions="0,1", n=4, prefix_sharing=False, max_batch=2)
    res = run_sweep(cfg, tmp_path / "s", loaded=loaded, progress=False)
    keys = [(r["example_id"], r["position"]) for r in lines(tmp_path / "s" / "examples.jsonl")]
    ids = [e.id for e in get_task(f"jsonl:{data}").examples(4, 0, 0)]  # the seeded example order
    assert keys == [(e, p) for e in ids for p in (0, 1)] == [(r["example_id"], r["position"]) for r in res.rows]


# ----------------------------------------------------------------------------- 7, 8. what the CLI says; vllm serve


def test_cli_says_it_connects_to_a_served_model(tmp_path, monkeypatch, capsys):
    from posbias.cli import main

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    model = f"openai:model={NAME},base_url={url},retries=0"
    monkeypatch.setattr("sys.argv", ["posbias", "sweep", "--model", model, "--facts", "4", "--n", "1", "--positions",
                                     "0", "--engine", "generate", "--out", str(tmp_path / "s")])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"connecting to openai:{NAME} at {url} ..." in err
    assert "loading" not in err and "bf16" not in err


def test_nothing_listening_at_open_fails_fast_and_names_base_url(tmp_path, monkeypatch, capsys):
    """A refused connection when the backend opens is a wrong port or no server: one quick retry (not 6 over 31 s),
    then one line naming the URL and base_url=, not timeout= / retries=."""
    import requests

    from posbias.cli import main

    sent = []
    real = requests.Session.request
    monkeypatch.setattr(requests.Session, "request", lambda self, *a, **k: sent.append(a[1]) or real(self, *a, **k))
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    monkeypatch.setattr("sys.argv", ["posbias", "sweep", "--model", f"openai:model={NAME},base_url={url}", "--facts", "4",
                                     "--n", "1", "--positions", "0", "--engine", "generate", "--out", str(tmp_path / "s")])
    t0 = time.perf_counter()
    with pytest.raises(SystemExit):
        main()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert time.perf_counter() - t0 < 5 and len(sent) == 2, (sent, err)
    assert err.startswith(f"posbias: error: nothing listens at {url} (connection refused) -- start the server there")
    assert "base_url=" in err and "timeout" not in err and "retries" not in err
    assert not (tmp_path / "s").exists()


def _argv(model: str, out, engine: str = "generate") -> list[str]:
    return ["sweep", "--model", model, "--facts", "6", "--n", "1", "--positions", POS, "--engine", engine, "--out",
            str(out), "--quiet"]


def test_a_slow_server_is_asked_twice_at_most_and_the_hint_works(vllm_server, proxy, tmp_path):
    """A live server slower than the timeout: each request is sent again once (vLLM drops a request its client left),
    not 6 times; then one line advising a larger timeout= with --resume, which, followed as printed, finishes."""
    from served import cli, follow

    proxy.delay = (1000, 3.0)  # every reply takes 3 s: a slow server, not a dead one
    argv = _argv(spec(proxy.url, vllm_server["dir"], timeout=1, concurrency=2), tmp_path / "run")
    line = cli(argv)
    assert proxy.received <= 4, f"{proxy.received} requests for 2 in flight"
    assert "no reply within 1 s (2 tries) from a server that took the request" in line, line
    assert line.endswith("-- give it more time with timeout=120 in the model spec, and rerun with --resume (no row is "
                         "kept yet)"), line
    timing = json.loads((tmp_path / "run" / "timing.json").read_text())
    assert timing["retries"] <= 2 and timing["requests"] <= 5  # the two in flight, each once more; GET /models
    proxy.delay = (0, 0.0)
    (followed, _), = follow(argv, line)
    assert cli(followed) is None and (tmp_path / "run" / "sweep.json").is_file()


def test_chat_rows_record_the_servers_token_count_or_null(vllm_server, proxy, tmp_path):
    """A chat row has no token ids here: its prompt_tokens is the server's count, null where the server gives none
    (never 0); the cost record then prices the rows by their estimate."""
    chat = f"openai:model={NAME},base_url={proxy.url},prompts=chat"
    counted = sweep(chat).rows
    assert all(isinstance(r["prompt_tokens"], int) and r["prompt_tokens"] > 20 for r in counted)
    proxy.drop_usage = True
    cfg = SweepConfig(model=chat, task_options=KV, positions=POS, n=1, engine="generate", price_in=1.0, price_out=1.0)
    res = run_sweep(cfg, tmp_path / "run", progress=False)
    assert [r["prompt_tokens"] for r in res.rows] == [None] * 3
    assert [json.loads(x)["prompt_tokens"] for x in (tmp_path / "run" / "examples.jsonl").read_text().splitlines()] == [None] * 3
    assert res.record["cost"]["spent"]["this_run"]["counted_by"] == "estimate"


def test_a_context_window_above_the_servers_is_refused_at_open(vllm_server, tmp_path):
    from served import cli, follow

    argv = _argv(spec(vllm_server["url"], vllm_server["dir"], context_window=4096), tmp_path / "run")
    line = cli(argv)
    assert line == ("posbias: error: context_window=4096 in the model spec, but the server takes 2048 tokens -- use "
                    "context_window=2048 in the model spec (or leave it out)"), line
    assert not (tmp_path / "run").exists()
    (followed, _), = follow(argv, line)
    assert cli(followed) is None


def test_a_chat_prompt_over_the_servers_window_says_what_works(vllm_server, proxy, tmp_path):
    """vLLM's 400 for a chat prompt longer than its window is named as such, with the fix that works: the served
    model's tokenizer, so posbias counts every prompt and refuses the long rows before sending any."""
    from served import cli

    chat = f"openai:model={NAME},base_url={proxy.url},prompts=chat"
    argv = ["sweep", "--model", chat, "--facts", "150", "--n", "1", "--positions", "0", "--engine", "generate",
            "--out", str(tmp_path / "run"), "--quiet"]
    line = cli(argv)
    assert "the server refused a prompt longer than its context window (HTTP 400: This model's maximum context length " \
           "is 2048 tokens" in line, line
    assert "-- add tokenizer=DIR (the served model's) to the model spec" in line and "--overwrite" in line
    assert "prompts=" not in line.split(" -- ")[1] and proxy.received == 1  # shown once, not retried
    proxy.received = 0
    line = cli(argv[:2] + [chat + f",tokenizer={vllm_server['dir']}"] + argv[3:] + ["--overwrite"])  # followed
    assert "tokens (3081 prompt + 12 answer) but the model's context window is 2048 -- use fewer" in line, line
    assert proxy.received == 0  # refused before any request


def test_vllm_drops_a_request_its_client_left(vllm_server):
    """Why the vllm dialect sends a timed-out request once more (dialects.py, drops_abandoned): the server stops
    computing it when the client's connection closes, so it is never computed twice at once."""
    import requests

    base = vllm_server["url"].removesuffix("/v1")
    body = {"model": NAME, "prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True, "temperature": 0}
    with pytest.raises(requests.ReadTimeout):
        requests.post(f"{base}/v1/completions", json=body, timeout=1.0)  # 400 tokens take 15 s or more here
    running = []
    for _ in range(20):
        metrics = requests.get(f"{base}/metrics", timeout=10).text
        running = [float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("vllm:num_requests_running")]
        if running == [0.0]:
            break
        time.sleep(0.5)
    assert running == [0.0], running


SERVED_HINTS = [  # (the model spec's extra keys, the engine, what the refusal says): each hint, followed, finishes
    ({"model": "other"}, "generate", "serves smollm2, not 'other'"),
    ({"context_window": 4096}, "generate", "but the server takes 2048 tokens"),
    ({"concurrency": 0}, "generate", "concurrency and batch must be at least 1"),
    ({"tokenizer": None, "prompts": "tokens"}, "teacher-forced", "prompts=tokens needs the served model's tokenizer"),
    # another model's tokenizer: the tiny test model's (a character vocabulary), read in a blink where Gemma-3's GGUF
    # vocabulary took 20-30 s to parse on a cold cache
    ({"prompts": "text", "tokenizer": "{TINY}"}, "teacher-forced", "the server tokenises a prompt differently"),
    ({"teacher_forcing": "prompt_logprobs", "prompts": "text"}, "teacher-forced",
     "teacher_forcing=prompt_logprobs needs token prompts"),
]


@pytest.mark.parametrize("extra, engine, problem", SERVED_HINTS, ids=[p for *_, p in SERVED_HINTS])
def test_every_served_hint_works_as_printed(vllm_server, model_dir, tmp_path, extra, engine, problem):
    """tests/hints.py for the model spec: each alternative of the hint that spells a command (key=value in the spec,
    flags) is run against the real server and must not be refused again."""
    from served import cli, follow, set_spec

    extra = {k: str(model_dir) if v == "{TINY}" else v for k, v in extra.items()}
    model = set_spec(spec(vllm_server["url"], vllm_server["dir"]), {k: v for k, v in extra.items() if v is not None})
    if extra.get("tokenizer", "") is None:
        model = model.replace(f",tokenizer={vllm_server['dir']}", "")
    argv = _argv(model, tmp_path / "run", engine)
    line = cli(argv)
    assert line is not None and problem in line, line
    followed = follow(argv, line)
    assert followed, f"no alternative of the hint can be followed as printed: {line}"
    for k, (again, text) in enumerate(followed):
        again = [str(tmp_path / f"run{k}") if a == str(tmp_path / "run") else a for a in again]  # each in a fresh copy
        if (tmp_path / "run").exists():
            shutil.copytree(tmp_path / "run", tmp_path / f"run{k}")
        assert cli(again) is None, f"`{text}` from {line!r} does not work: {cli(again)}"


def test_the_first_vllm_block_of_the_docs_is_complete():
    """docs/backends.md's first `vllm serve` (the block a newcomer copies) sizes the KV cache (unset, vLLM's CPU worker
    wants 92% of the RAM free and dies on a machine whose RAM is in use) and serves float32, as the suite's own server
    does (served.server_cmd): vLLM's bf16 rows vary from run to run with its batching."""
    from served import KV_SPACE, ROOT, VLLM_DTYPE

    text = (ROOT / "docs" / "backends.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "vllm serve" in b).replace("\\\n", " ")
    serve = next(x for x in block.splitlines() if "vllm serve" in x)
    assert serve.startswith(f"VLLM_CPU_KVCACHE_SPACE={KV_SPACE} .venv-vllm/bin/vllm serve "), serve
    assert f"--dtype {VLLM_DTYPE}" in serve and "--max-model-len 2048" in serve and VLLM_DTYPE == "float32"
    cmd = server_cmd(Path("/m"), 8123, cli=["vllm"])
    assert cmd[cmd.index("--dtype") + 1] == VLLM_DTYPE


def test_the_test_server_runs_vllm_serve():
    cmd = server_cmd(Path("/models/smollm2"), 8123, eager=True, cli=["vllm"])
    assert cmd[:3] == ["vllm", "serve", "/models/smollm2"] and "--model" not in cmd
    assert cmd[cmd.index("--served-model-name") + 1] == NAME and "--enforce-eager" in cmd
    assert not any("api_server" in c for c in server_cmd(Path("/m"), 8123))


def test_export_names_vllm_serve(tmp_path, monkeypatch, capsys):
    import posbias.cli.measure as cli_measure
    from posbias.cli import main

    monkeypatch.setattr(cli_measure, "export_model", lambda *a: None)
    monkeypatch.setattr("sys.argv", ["posbias", "export", "smollm2-135m", str(tmp_path / "m")])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr().out
    assert e.value.code == 0 and f"vllm serve {tmp_path / 'm'}" in out and "api_server" not in out
