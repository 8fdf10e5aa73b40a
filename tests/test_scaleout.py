"""Sweeps, comparisons and grids across processes (scoring/scaleout.py), launched for real with
`accelerate launch --multi_gpu --num_processes 2` on the CPU (gloo), against the one-process run; and
`device_map=auto` (models/load.py). Tiny sharpened Llama, fp32, one thread per process.

The data: small documents of random letters with single-letter answers that the tiny model's greedy next token
hits on some rows and misses on others (by example and slot), so a dropped, duplicated or misplaced row changes the
numbers or the row sets."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import dies_after
from posbias import GridConfig, SweepConfig, load_model, run_compare, run_grid, run_sweep
from posbias.errors import PosbiasError
from posbias.scoring import engines
from posbias.scoring.scaleout import blocks, rounds

pytestmark = pytest.mark.usefixtures("one_thread")
SRC = Path(__file__).resolve().parents[1] / "src"
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """12 questions over 4 documents of random letters; the answer is 'q' or 'a' (the tiny model's usual guesses)."""
    rng = random.Random(0)
    lines = []
    for i in range(12):
        docs = [{"title": f"D{j}", "text": "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 12)))}
                for j in range(4)]
        lines.append(json.dumps({"id": f"q{i}", "question": "what?", "answers": ["q" if i % 2 else "a"],
                                 "documents": docs, "gold": 0}))
    path = tmp_path_factory.mktemp("data") / "letters.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def loaded_fp32(model_dir):
    return load_model(str(model_dir), "fp32", "cpu", progress=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args: str, module: str = "posbias.cli", processes: int = 2) -> subprocess.CompletedProcess:
    """`accelerate launch` of `module` (posbias.cli or a script path) on `processes` CPU processes (gloo)."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "POSBIAS_THREADS": "1",
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    head = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(_free_port())]
    cmd = head + (["-m", module] if not module.endswith(".py") else [module]) + list(args)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-8000:]
    return p


def _sweep_args(model_dir, data, out, *extra: str) -> list[str]:
    tokens = [] if "teacher-forced" in extra else ["--max-new-tokens", "2"]  # a token limit needs generation
    return ["sweep", "--model", str(model_dir), "--dtype", "fp32", "--task", f"jsonl:{data}", "--n", "12",
            "--max-batch", "4", *tokens, "--out", str(out), "--quiet", *extra]


def _cfg(model_dir, data, **kw) -> SweepConfig:
    tokens = None if kw.get("engine") == "teacher-forced" else 2  # a token limit needs generation
    return SweepConfig(**{"model": str(model_dir), "dtype": "fp32", "task": f"jsonl:{data}", "n": 12, "max_batch": 4,
                          "max_new_tokens": tokens, **kw})


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]


def _same_rows(a: list[dict], b: list[dict], exact: bool = True) -> None:
    """Same rows, each once, with the same verdicts, predictions and logprobs (exact: the same batches ran; else to
    float noise, for two different computations)."""
    ka = [(r["example_id"], r["position"]) for r in a]
    kb = [(r["example_id"], r["position"]) for r in b]
    assert len(set(kb)) == len(kb), "a row was logged twice"
    assert sorted(ka) == sorted(kb)
    by = {(r["example_id"], r["position"]): r for r in b}
    for r in a:
        o = by[(r["example_id"], r["position"])]
        assert (o["correct"], o["prediction"]) == (r["correct"], r["prediction"])
        assert o.get("logprob") == (r.get("logprob") if exact or "logprob" not in r else pytest.approx(r["logprob"], abs=1e-4))


def _record(out: Path, name: str = "sweep.json") -> dict:
    return json.loads((out / name).read_text())


# ----------------------------------------------------------------------------- the split itself


def test_blocks_are_contiguous_near_equal_and_cover_everything():
    items = list(range(11))
    parts = blocks(items, 3)
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert blocks([1], 3) == [[1], [], []]
    r = rounds([f"e{i}" for i in range(21)], 2, per=4)  # 8 units a round, 4 per rank
    assert [len(x) for x in r] == [2, 2, 2] and r[0] == [["e0", "e1", "e2", "e3"], ["e4", "e5", "e6", "e7"]]
    assert [e for x in r for part in x for e in part] == [f"e{i}" for i in range(21)]
    assert r[-1] == [["e16", "e17", "e18"], ["e19", "e20"]]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shared", [True, False])
def test_a_unit_scored_alone_gives_the_numbers_of_the_whole_run(model_dir, data, dtype, shared):
    """What makes the split exact: each unit of the plan (a group of examples / a batch), scored on its own, is
    planned into the same batches, so its logprobs are bit-identical to the whole run's, bf16 included."""
    from posbias import get_task
    from posbias.measure import Scorer

    lo = load_model(str(model_dir), dtype, "cpu", progress=False)
    task = get_task(f"jsonl:{data}")
    scorer = Scorer(lo, task, "teacher-forced", max_batch=4, prefix_sharing=shared)
    rows = scorer.rows(task.examples(12), [0, 1, 2, 3])
    none = scorer.resolve(None)
    units = scorer.runner.units(rows, none)
    assert len(units) == (3 if shared else 12) and sorted(i for u in units for i in u) == list(range(48))
    if shared:
        assert all(len({rows[i].key[0] for i in u}) == 4 for u in units)  # whole examples, 4 to a group
    whole = scorer.score(rows)
    alone = [r for u in units for r in scorer.score([rows[i] for i in sorted(u)])]
    _same_rows(whole, alone)
    assert [rows[i].key for i in scorer.runner.result_order(rows, none)] == [(r["example_id"], r["position"]) for r in whole]


# ----------------------------------------------------------------------------- 2 processes against 1
# One `accelerate launch` runs every two-process job of this module in turn (each process start costs seconds on
# these CPUs): the CLI commands through `posbias.cli.main` exactly as `posbias ...` runs them, and one API-level job.
# Each test then checks its job's folder and exit code against the one-process run.

DRIVER = """
import contextlib, io, json, sys
import torch
torch.set_num_threads(1)
from posbias import SweepConfig, load_model, run_sweep
from posbias.cli import main
from posbias.runs import process_index
rank = process_index()
for job in json.loads(open(sys.argv[1]).read()):
    if job["argv"] == ["api"]:  # every rank gets every row back, in the one-process order, from run_sweep itself
        lo = load_model(job["model"], "fp32", "cpu", progress=False)
        got = {}
        for shared in (True, False):
            cfg = SweepConfig(model=job["model"], dtype="fp32", task="jsonl:" + job["data"], n=12, max_batch=4,
                              prefix_sharing=shared)
            got[str(shared)] = [[r["example_id"], r["position"], r["correct"]]
                                for r in run_sweep(cfg, None, loaded=lo, progress=False).rows]
        print(json.dumps(got), file=open(f"{job['out']}.rank{rank}.json", "w"))
        continue
    sys.argv, out, code = ["posbias", *job["argv"]], io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as e:
            code = e.code
    print(json.dumps({"code": code, "stdout": out.getvalue()}), file=open(f"{job['out']}.rank{rank}.json", "w"))
"""

LPES_ARGS = ["--task", "kv-lookup", "--facts", "4", "--digits", "3", "--n", "4", "--skip", "100", "--generations", "2",
             "--pop-size", "6", "--parents", "2", "--crossovers", "1", "--mutations", "3", "--points", "2", "--y-min", "1",
             "--y-max", "2", "--y-step", "0.25", "--y-init", "1.25", "--my", "0.5", "--mx", "1", "--quiet"]


@pytest.fixture(scope="module")
def two(model_dir, loaded_fp32, data, tmp_path_factory):
    """-> (root, rows the killed one-process run had logged): every job's folder is root / name, its exit code and
    stdout per rank in root / f"{name}.rank{r}.json"."""
    root = tmp_path_factory.mktemp("two")
    with pytest.MonkeyPatch.context() as mp:  # the resume job continues a one-process run killed mid-way
        dies_after(mp, engines, "decode_shared", 3)  # the prefix-shared path generates through it
        with pytest.raises(KeyboardInterrupt):
            run_sweep(_cfg(model_dir, data), root / "cut", loaded=loaded_fp32, progress=False)
    done = len(_rows(root / "cut"))
    m = str(model_dir)
    jobs = {
        "sweep-teacher-forced": _sweep_args(model_dir, data, root / "sweep-teacher-forced", "--engine", "teacher-forced"),
        "sweep-generate": _sweep_args(model_dir, data, root / "sweep-generate", "--engine", "generate"),
        "cut": _sweep_args(model_dir, data, root / "cut", "--resume"),
        "compare": ["compare", *_sweep_args(model_dir, data, root / "compare")[1:], "--methods", "none,pi:1.5"],
        "lpes": ["lpes", "search", "--model", m, "--dtype", "fp32", *LPES_ARGS, "--out", str(root / "lpes")],
        "grid": ["grid", "--model", m, "--dtype", "fp32", "--digits", "2", "--sizes", "3,4", "--depths", "0%,50%,100%",
                 "--n", "6", "--max-batch", "4", "--out", str(root / "grid"), "--quiet"],
        "api": ["api"],
    }
    spec = root / "jobs.json"
    spec.write_text(json.dumps([{"argv": a, "out": str(root / k), "model": m, "data": str(data)} for k, a in jobs.items()]))
    script = root / "driver.py"
    script.write_text(DRIVER)
    launch(str(spec), module=str(script))
    return root, done


def _job(root: Path, name: str) -> list[dict]:
    """The job's exit code and printed text on rank 0 and rank 1; both must have succeeded."""
    got = [json.loads((root / f"{name}.rank{r}.json").read_text()) for r in (0, 1)]
    assert [g["code"] for g in got] == [0, 0], got
    return got


@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_two_process_sweep_equals_one_process(model_dir, loaded_fp32, data, tmp_path, two, engine):
    root, _ = two
    one = run_sweep(_cfg(model_dir, data, engine=engine), tmp_path / "one", loaded=loaded_fp32, progress=False)
    assert 0 < sum(p["correct"] for p in one.per_position) < 48, "the data must give mixed verdicts"
    assert one.config["scoring_path"] == "prefix-shared"
    rank0, rank1 = _job(root, f"sweep-{engine}")
    assert rank0["stdout"].count("average ") == 1 and rank0["stdout"].count("wrote ") == 1  # rank 0 prints the table
    assert rank1["stdout"] == ""  # and rank 1 nothing
    out = root / f"sweep-{engine}"
    assert _record(out) == _record(tmp_path / "one")  # per_position, summary (bootstrap CI), config, ...
    _same_rows(_rows(tmp_path / "one"), _rows(out))
    assert len(_rows(out)) == 48


def test_every_rank_returns_every_row_in_the_one_process_order(model_dir, loaded_fp32, data, two):
    """Prefix-shared path (row order) and plain path (longest-batch-first order), API level, no folder."""
    root, _ = two
    for shared in (True, False):
        one = run_sweep(_cfg(model_dir, data, prefix_sharing=shared, max_new_tokens=None), None, loaded=loaded_fp32,
                        progress=False)
        want = [[r["example_id"], r["position"], r["correct"]] for r in one.rows]
        for rank in (0, 1):
            assert json.loads((root / f"api.rank{rank}.json").read_text())[str(shared)] == want, (shared, rank)


def test_resume_under_two_processes_after_a_one_process_kill(model_dir, loaded_fp32, data, tmp_path, two):
    root, done = two
    full = run_sweep(_cfg(model_dir, data), tmp_path / "full", loaded=loaded_fp32, progress=False)
    assert 0 < done < 48
    _job(root, "cut")
    cut = root / "cut"
    assert _record(cut) == _record(tmp_path / "full") and full.summary == _record(cut)["summary"]
    _same_rows(_rows(tmp_path / "full"), _rows(cut))
    assert json.loads((cut / "timing.json").read_text())["rows_this_run"] == 48 - done


def test_two_process_compare_equals_one_process(model_dir, loaded_fp32, data, tmp_path, two):
    root, _ = two
    cfg = _cfg(model_dir, data)
    run_compare(cfg, ["none", "pi:1.5"], tmp_path / "one", loaded=loaded_fp32, progress=False)
    _job(root, "compare")
    one, two_ = _record(tmp_path / "one", "compare.json"), _record(root / "compare", "compare.json")
    assert two_ == one
    assert one["methods"][0]["per_position"] != one["methods"][1]["per_position"], "pi:1.5 must change something"
    for d in ("none", "pi-1.5"):
        _same_rows(_rows(tmp_path / "one" / d), _rows(root / "compare" / d))
    assert sorted(p.name for p in (root / "compare").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())


def test_two_process_lpes_search_splits_the_candidates(model_dir, loaded_fp32, tmp_path, two):
    """LPES fitness under 2 processes (mitigate/lpes/fitness.py): the same factors.json as one process, and each
    candidate scored once (a rank that had not joined the process group scored every candidate: evals.jsonl twice)."""
    from posbias.lpes import GAConfig, SearchConfig, run_search

    root, _ = two
    ga = GAConfig(pop_size=6, n_parents=2, n_crossover=1, n_mutation=3, generations=2, n_points=2, y_min=1.0,
                  y_max=2.0, y_step=0.25, y_init=1.25, my=0.5, mx=1)
    cfg = SearchConfig(model=str(model_dir), task_options={"facts": 4, "digits": 3}, n=4, skip=100, dtype="fp32", ga=ga)
    one = run_search(cfg, tmp_path / "one", loaded=loaded_fp32, progress=False).record
    _job(root, "lpes")
    two_ = _record(root / "lpes", "factors.json")
    drop = ("seconds_this_call", "history", "versions")
    assert {k: v for k, v in two_.items() if k not in drop} == {k: v for k, v in one.items() if k not in drop}
    lines = [(d / "evals.jsonl").read_text().splitlines() for d in (tmp_path / "one", root / "lpes")]
    assert len(lines[1]) == len(lines[0]) == len({json.loads(x)["key"] for x in lines[0]})


def test_two_process_grid_equals_one_process(model_dir, loaded_fp32, tmp_path, two):
    root, _ = two
    cfg = GridConfig(model=str(model_dir), dtype="fp32", task_options={"digits": 2}, sizes="3,4", depths="0%,50%,100%",
                     n=6, max_batch=4)
    run_grid(cfg, tmp_path / "one", loaded=loaded_fp32, progress=False)
    _job(root, "grid")
    assert _record(root / "grid", "grid.json") == _record(tmp_path / "one", "grid.json")
    for size in ("size-3", "size-4"):
        _same_rows(_rows(tmp_path / "one" / size), _rows(root / "grid" / size))


# ----------------------------------------------------------------------------- device_map


def test_device_map_auto_on_the_cpu_gives_the_same_sweep(model_dir, loaded_fp32, data, tmp_path):
    """device_map=auto with only a CPU puts every layer there (accelerate's dispatch); the prefix-shared path then
    gives the numbers of a plain load, and the run records the choice (a default run does not mention it)."""
    spread = load_model(str(model_dir), "fp32", "cpu", progress=False, device_map="auto")
    assert spread.info["device_map"] == "auto" and "device_map" not in loaded_fp32.info
    assert spread.info["device"] == "cpu"
    plain = run_sweep(_cfg(model_dir, data, engine="teacher-forced"), tmp_path / "plain", progress=False)
    auto = run_sweep(_cfg(model_dir, data, engine="teacher-forced", device_map="auto"), tmp_path / "auto", progress=False)
    a, b = _record(tmp_path / "plain"), _record(tmp_path / "auto")
    assert b["config"].pop("device_map") == "auto" and "device_map" not in a["config"]
    assert b["model"].pop("device_map") == "auto"
    assert a == b and plain.config["scoring_path"] == auto.config["scoring_path"] == "prefix-shared"
    _same_rows(plain.rows, auto.rows)


@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_prefix_sharing_through_accelerate_dispatch_hooks(model_dir, loaded_fp32, data, tmp_path, engine):
    """A model placed by a device map runs under accelerate's hooks (they move weights and activations to each
    layer's device); here layer 1 is offloaded to disk, the case device_map=auto takes for a model too big for its
    devices. Prefix-shared scoring through the hooks gives the plain model's verdicts and logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    from posbias import get_task
    from posbias.measure import Scorer
    from posbias.models.load import Loaded

    where = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
             "model.norm": "cpu", "lm_head": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=where, offload_folder=str(tmp_path / "offload"),
                                                 dtype=torch.float32).eval()
    assert hasattr(model.model.layers[1], "_hf_hook")
    hooked = Loaded(model, loaded_fp32.tokenizer, loaded_fp32.info)
    task = get_task(f"jsonl:{data}")
    rows = Scorer(loaded_fp32, task, engine, 2).rows(task.examples(6), [0, 1, 2, 3])
    plain = Scorer(loaded_fp32, task, engine, 2, max_batch=4, prefix_sharing=False).score(rows)
    shared = Scorer(hooked, task, engine, 2, max_batch=4).score(rows)
    _same_rows(plain, shared, exact=False)


def test_device_map_refusals(monkeypatch):
    with pytest.raises(PosbiasError, match="unknown `device_map` 'balanced'"):
        SweepConfig(device_map="balanced").validate()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(PosbiasError, match="one of 2 processes"):
        SweepConfig(device_map="auto").validate()
    with pytest.raises(PosbiasError, match="one of 2 processes"):
        load_model("smollm2-135m", device_map="auto")
    monkeypatch.delenv("WORLD_SIZE")
    assert "device_map" not in SweepConfig().to_dict()  # fingerprints of runs without it are unchanged


def test_cli_refuses_a_bad_device_map_in_one_line(model_dir, tmp_path, monkeypatch, capsys):
    from posbias.cli import main

    monkeypatch.setattr(sys, "argv", ["posbias", "sweep", "--model", str(model_dir), "--device-map", "balanced",
                                      "--out", str(tmp_path / "x"), "--quiet"])
    with pytest.raises(SystemExit) as e:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0] == "posbias: error: unknown --device-map 'balanced' -- use --device-map auto, or leave it out"
    assert not (tmp_path / "x").exists()
