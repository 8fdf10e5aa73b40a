"""Sweep files, resume after a kill, and bad input through the CLI (tiny models, no weights)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import tiny_loaded
from posbias import SweepConfig, run_sweep
from posbias.errors import PosbiasError
from posbias.scoring import engines


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama saved as a plain HF directory, loaded by `--model DIR`."""
    d = tmp_path_factory.mktemp("tiny-llama")
    lo = tiny_loaded("llama")
    lo.model.save_pretrained(d)
    lo.tokenizer.save_pretrained(d)
    return d


def _cfg(model_dir, **kw):
    base = dict(model=str(model_dir), task="kv-lookup", task_options={"facts": 4, "digits": 3},
                positions="0,2,3", n=6, dtype="fp32", max_batch=4)
    return SweepConfig(**{**base, **kw})


def test_sweep_writes_complete_results(model_dir, tmp_path):
    res = run_sweep(_cfg(model_dir), tmp_path / "out", progress=False)
    out = tmp_path / "out"
    rec = json.loads((out / "sweep.json").read_text())
    assert {"config", "model", "task", "versions", "per_position", "summary"} <= set(rec)
    assert [p["position"] for p in rec["per_position"]] == [0, 2, 3]
    assert rec["model"]["architecture"] == "LlamaForCausalLM"
    rows = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    assert len(rows) == 18 and len({(r["example_id"], r["position"]) for r in rows}) == 18
    assert {"example_id", "position", "prediction", "correct"} <= set(rows[0])
    assert (out / "curve.png").stat().st_size > 1000
    assert not (out / "sweep.partial.json").exists()
    assert res.summary == rec["summary"]
    with pytest.raises(PosbiasError, match="already holds a sweep"):
        run_sweep(_cfg(model_dir), out, progress=False)


def test_resume_after_interruption_gives_the_same_sweep(model_dir, tmp_path, monkeypatch):
    full = tmp_path / "full"
    run_sweep(_cfg(model_dir), full, progress=False)

    cut = tmp_path / "cut"
    calls = {"n": 0}
    real = engines.score_teacher_forced

    def dies_on_third_batch(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # as a kill would, mid-sweep
        return real(*a, **k)

    monkeypatch.setattr(engines, "score_teacher_forced", dies_on_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_cfg(model_dir), cut, progress=False)
    monkeypatch.setattr(engines, "score_teacher_forced", real)
    assert not (cut / "sweep.json").exists() and (cut / "run.json").exists()
    with (cut / "examples.jsonl").open("a") as f:
        f.write('{"example_id": "torn')  # a line cut by the kill
    calls["n"] = 0
    run_sweep(_cfg(model_dir), cut, resume=True, progress=False)
    assert (cut / "sweep.json").read_text() == (full / "sweep.json").read_text()
    assert (cut / "examples.jsonl").read_text() == (full / "examples.jsonl").read_text()
    with pytest.raises(PosbiasError, match="different configuration"):
        run_sweep(_cfg(model_dir, seed=1), cut, resume=True, progress=False)


def _cli(*args, **kw):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "POSBIAS_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "posbias.cli", *args], capture_output=True, text=True, env=env, **kw)


def test_cli_kill_and_resume(model_dir, tmp_path):
    args = ["sweep", "--model", str(model_dir), "--facts", "4", "--digits", "3", "--n", "30", "--dtype", "fp32",
            "--max-batch", "1", "--quiet"]
    ok = _cli(*args, "--out", str(tmp_path / "a"))
    assert ok.returncode == 0, ok.stderr
    p = subprocess.Popen([sys.executable, "-m", "posbias.cli", *args, "--out", str(tmp_path / "b")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "b" / "examples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 10):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (tmp_path / "b" / "sweep.json").exists()
    assert log.read_text().count("\n") < 120
    again = _cli(*args, "--out", str(tmp_path / "b"), "--resume")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "b" / "sweep.json").read_text() == (tmp_path / "a" / "sweep.json").read_text()


# In a real process: one refusal before the model loads, one after (the window check). Every other bad input is
# checked in process, with its hint, by tests/test_bad_input.py.
@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--facts", "200"], "context window is 512"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, message):
    d = tmp_path / "m"
    lo = tiny_loaded("llama", max_pos=512)
    lo.model.save_pretrained(d)
    lo.tokenizer.save_pretrained(d)
    full = ["sweep", "--model", str(d), "--n", "2", "--dtype", "fp32", "--quiet", "--out", str(tmp_path / "o"), *args]
    r = _cli(*full)
    assert r.returncode == 2, r.stderr
    err = [x for x in r.stderr.splitlines() if x.startswith("posbias: error")]
    assert len(err) == 1 and message in err[0] and " -- " in err[0], r.stderr
    assert not (tmp_path / "o" / "sweep.json").exists()


def test_cli_malformed_jsonl_names_the_line(tmp_path, model_dir):
    p = tmp_path / "d.jsonl"
    p.write_text('{"question": "q", "answers": ["a"], "documents": ["x", "y"], "gold": 0}\n{"question": \n')
    r = _cli("sweep", "--model", str(model_dir), "--task", f"jsonl:{p}", "--n", "1", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and f"{p}:2: not valid JSON" in r.stderr
    assert not (tmp_path / "o" / "sweep.json").exists()
