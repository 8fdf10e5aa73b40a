"""Cost estimate and budget (eval/cost.py; docs/backends.md, "Cost and budget"): the estimate by hand on the tiny
model, the refusals in one line, and a budget stop then a resume that ends with the rows and summary of an
uninterrupted run, in process and against a real llama.cpp server (tests/llamacpp.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from llamacpp import N_CTX, NAME, llama_missing
from posbias import PosbiasError, SweepConfig, run_sweep
from posbias.eval.cost import BudgetReached

PRICES = {"price_in": 0.15, "price_out": 0.60}
KV = {"facts": 4, "digits": 3}


def _cfg(**kw) -> SweepConfig:
    base = dict(task="kv-lookup", task_options=KV, positions="0,2,3", n=6, max_batch=2)
    return SweepConfig(**{**base, **kw})


def _rows(folder) -> list[dict]:
    return [json.loads(x) for x in (folder / "examples.jsonl").read_text().splitlines()]


def test_the_estimate_is_the_rows_requests_times_the_prices(loaded, tmp_path, capsys):
    """generate: one request per row, its prompt tokens and max_new_tokens (upper bound); teacher forcing: one
    request per accepted answer, prompt + answer tokens (the character tokenizer: " 998" is 4), 1 completion token."""
    gen = run_sweep(_cfg(engine="generate", max_new_tokens=5, **PRICES), tmp_path / "g", loaded=loaded, progress=False)
    rows = _rows(tmp_path / "g")
    prompt, completion = sum(r["prompt_tokens"] for r in rows), 5 * len(rows)
    usd = (prompt * 0.15 + completion * 0.60) / 1e6
    est = gen.record["cost"]["estimate"]
    assert (est["rows"], est["requests"], est["prompt_tokens"], est["completion_tokens"]) == (18, 18, prompt, completion)
    assert est["usd"] == pytest.approx(usd) and est["prompt"] == "counted"
    line = re.search(r"cost estimate: 18 requests, ([0-9,]+) prompt \+ ([0-9,]+) completion tokens \(upper bound\) = "
                     r"\$([0-9.]+) at \$0\.15/\$0\.60 per 1M", capsys.readouterr().err)
    assert line and line.groups()[:2] == (f"{prompt:,}", f"{completion:,}") and float(line[3]) == pytest.approx(usd, 1e-3)
    # spent: each answer's own tokens and the stop, never more than the limit
    tok = loaded.tokenizer
    own = sum(5 if r["cut"] else min(5, len(tok(" " + r["prediction"], add_special_tokens=False)["input_ids"]) + 1)
              for r in rows)
    spent = gen.record["cost"]["spent"]
    assert spent["total"] == {"rows": 18, "prompt_tokens": prompt, "completion_tokens": own,
                              "usd": pytest.approx((prompt * 0.15 + own * 0.60) / 1e6)}
    assert spent["this_run"]["counted_by"] == "estimate"  # in process: no server counts

    tf = run_sweep(_cfg(engine="teacher-forced", **PRICES), loaded=loaded, progress=False)
    answers = [len(set(r["answers"])) for r in tf.rows]
    est = tf.record["cost"]["estimate"]
    want = sum(n * r["prompt_tokens"] + sum(1 + len(a) for a in set(r["answers"])) for n, r in zip(answers, tf.rows))
    assert (est["requests"], est["prompt_tokens"], est["completion_tokens"]) == (sum(answers), want, sum(answers))


def test_in_process_without_prices_prints_and_records_no_cost(loaded, capsys):
    res = run_sweep(_cfg(n=1), loaded=loaded, progress=False)
    assert "cost" not in res.record and "cost estimate" not in capsys.readouterr().err


@pytest.mark.parametrize("kw, message", [
    ({"price_in": -0.1, "price_out": 0.6}, "`price_in` must be a number of US dollars of at least 0, got -0.1"),
    ({**PRICES, "budget": -1.0}, "`budget` must be a number of US dollars of at least 0, got -1.0"),
    ({"budget": 1.0}, "a `budget` needs the prices to count dollars"),
    ({"price_in": 0.15}, "`price_in` without `price_out`"),
])
def test_bad_prices_and_budgets_are_refused_in_one_line(kw, message):
    with pytest.raises(PosbiasError) as e:
        run_sweep(_cfg(model="no-such-model", **kw), progress=False)  # refused before any model is looked for
    assert message in str(e.value) and "\n" not in str(e.value) and " -- " in str(e.value)


def test_prices_and_budget_are_not_in_the_fingerprint():
    assert not {"price_in", "price_out", "budget"} & set(_cfg(**PRICES, budget=1.0).validate().to_dict())


def test_a_budget_stop_then_resume_gives_the_uninterrupted_run(loaded, tmp_path):
    full = run_sweep(_cfg(**PRICES), tmp_path / "full", loaded=loaded, progress=False)
    whole = full.record["cost"]["spent"]["total"]["usd"]
    cut = tmp_path / "cut"
    with pytest.raises(BudgetReached) as e:
        run_sweep(_cfg(**PRICES, budget=whole / 2), cut, loaded=loaded, progress=False)
    kept = _rows(cut)
    assert 0 < len(kept) < 18 and e.value.done == len(kept) and e.value.spent <= whole / 2
    assert str(e.value).startswith(f"budget of ${whole / 2:,.4g} reached after {len(kept)} of 18 rows (")
    assert str(e.value).endswith("spent) -- resume with `resume` and a larger `budget`")
    assert not (cut / "sweep.json").exists() and (cut / "run.json").exists()  # partial: resumable
    with pytest.raises(BudgetReached) as again:  # the rows already scored count toward the budget
        run_sweep(_cfg(**PRICES, budget=whole / 2), cut, loaded=loaded, progress=False, resume=True)
    assert again.value.done == len(kept) and len(_rows(cut)) == len(kept)
    res = run_sweep(_cfg(**PRICES, budget=2 * whole), cut, loaded=loaded, progress=False, resume=True)
    assert (cut / "examples.jsonl").read_bytes() == (tmp_path / "full" / "examples.jsonl").read_bytes()
    assert res.summary == full.summary and res.per_position == full.per_position
    spent = res.record["cost"]["spent"]
    assert spent["this_run"]["rows"] == 18 - len(kept) and spent["total"]["usd"] == pytest.approx(whole)


def _cli(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "POSBIAS_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "posbias.cli", *args], capture_output=True, text=True, env=env)


def test_cli_budget_stop_exits_2_with_one_line_and_resumes(model_dir, loaded, tmp_path):
    whole = run_sweep(_cfg(**PRICES), loaded=loaded, progress=False).record["cost"]["spent"]["total"]["usd"]
    args = ["sweep", "--model", str(model_dir), "--dtype", "fp32", "--facts", "4", "--digits", "3", "--positions",
            "0,2,3", "--n", "6", "--max-batch", "2", "--quiet", "--out", str(tmp_path / "o"), "--price-in", "0.15",
            "--price-out", "0.6"]
    r = _cli(*args, "--budget", str(whole / 2))
    err = [x for x in r.stderr.splitlines() if x.startswith("posbias: error")]
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert "reached after" in err[0] and err[0].endswith("-- resume with --resume and a larger --budget"), err
    assert "cost estimate: 18 requests" in r.stderr and not (tmp_path / "o" / "sweep.json").exists()
    ok = _cli(*args, "--budget", str(2 * whole), "--resume")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "o" / "sweep.json").read_text())["cost"]["spent"]["total"]["rows"] == 18
    bad = _cli(*args[:-4], "--budget", "1")  # no prices
    assert bad.returncode == 2 and bad.stderr.strip().endswith("-- pass --price-in and --price-out (USD per 1M prompt "
                                                               "/ completion tokens)"), bad.stderr


def _served(url: str) -> str:
    kv = {"model": NAME, "base_url": url, "tokenizer": "smollm2-135m", "context_window": N_CTX, "concurrency": 2}
    return "openai:" + ",".join(f"{k}={v}" for k, v in kv.items())


@pytest.mark.skipif(llama_missing() is not None, reason=str(llama_missing()))
def test_served_budget_stop_then_resume_gives_the_uninterrupted_run(llama_server, tmp_path, capsys):
    """Against a real llama.cpp server: the server's token counts are what is spent, the stop keeps the spent cost
    within the budget (requests go in windows of the in-flight capacity, each admitted on its estimate), and the
    resumed run ends with the uninterrupted run's rows, byte for byte, and summary."""
    # 2 examples x 3 slots: the half budget stops inside the 6 rows (n = 4 took 36-59 s in the suite, every row a
    # llama.cpp generation beside the other worker)
    served = dict(model=_served(llama_server["url"]), engine="generate", n=2, task_options={"facts": 6}, **PRICES)
    full = run_sweep(_cfg(**served), tmp_path / "full", progress=False)
    cost = full.record["cost"]
    assert cost["spent"]["this_run"]["counted_by"] == "server" and "cost estimate: 6 requests" in capsys.readouterr().err
    est, spent = cost["estimate"], cost["spent"]["total"]
    assert est["completion_tokens"] >= spent["completion_tokens"] > 0 and est["prompt_tokens"] >= spent["prompt_tokens"]
    whole = spent["usd"]
    cut = tmp_path / "cut"
    with pytest.raises(BudgetReached) as e:
        run_sweep(_cfg(**served, budget=whole / 2), cut, progress=False)
    kept = _rows(cut)
    assert 0 < len(kept) < 6 and e.value.done == len(kept) and e.value.spent <= whole / 2
    assert not (cut / "sweep.json").exists()
    res = run_sweep(_cfg(**served, budget=10 * whole), cut, progress=False, resume=True)
    assert (cut / "examples.jsonl").read_bytes() == (tmp_path / "full" / "examples.jsonl").read_bytes()
    assert res.summary == full.summary and res.record["cost"]["spent"]["total"]["rows"] == 6
