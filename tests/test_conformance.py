"""The conformance matrix: right or refused on every task and every file.

Every registered task and every user-file format (`posbias.tasks.FILE_SCHEMAS`: JSONL one gold, JSONL two hops,
pairwise judge, multiple choice) x every scoring engine posbias ships (`ENGINES`) x the prefix-shared and the plain
path x `none` and one method that applies, each a small sweep (1 example, 2 placements; every order of an order task) on a tiny
random model, then `compare` over both methods and one `report` over both paths. A cell either runs and writes a
complete, consistent result, or is refused in one line (PosbiasError) before anything is written; any other
exception fails it. A subset runs against the real vLLM server the suite starts (tests/served.py).

Registrations join without a new test: a task registered without a case here runs under its bare name (its
defaults), a method without an example in conftest.method_examples under its `example` spec or its name (the example
plugin, tests/plugin, adds a task and a method of each kind that way); a file format without an example file, or a
method that no cell runs, fails `test_every_registration_is_in_the_matrix`. Which method a cell runs is
the first in a rotation (starting at the cell's index) whose `check_task` accepts the cell, so the methods spread
over the cells; every method that does not apply to a cell is shown to be refused there
(`test_what_does_not_apply_is_refused_in_one_line`).

The matrix fails at 2bf741d (the commit before it): musique and the two-hop JSONL file crash in every cell with
"TypeError: 'str' object is not callable" (TwoHopQA hid Task.prompt behind its prompt style), a crash the ~1,400
tests before it never reached.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from conftest import THREADS, char_tokenizer, method_examples, missing_data, need_data, task_data, tiny_model
from posbias import (METHODS, TASKS, Loaded, PosbiasError, SweepConfig, build_report, get_method, get_task, run_compare,
                     run_sweep)
from posbias.measure import ENGINES
from posbias.tasks import FILE_SCHEMAS

LAYERS = 4  # Ms-PoE leaves the first two layers alone by default
WINDOW = 16384  # the character tokenizer turns NQ's 10 documents into ~7,000 tokens
GENERATE_TOKENS = 6  # generated answers are cut short: a random model's text is not what a cell checks


@dataclass(frozen=True)
class Case:
    """How the matrix runs one task: its spec (registered defaults where a tiny model can afford them)."""

    spec: str


# every registered task that takes no file; `test_every_registration_is_in_the_matrix` keeps this complete
CASES = {
    "kv-lookup": Case("kv-lookup"),
    "kv-uuid": Case("kv-uuid"),  # 75 pairs: the study's file (data set kv-uuid)
    "nq": Case("nq"),  # 10 documents, the default
    "musique": Case("musique:docs=10"),
    "kv-2hop": Case("kv-2hop"),
    "judge-nq": Case("judge-nq"),
    "mc-nq": Case("mc-nq"),
    "judge-kv": Case("judge-kv"),
    "mc-kv": Case("mc-kv"),
    "niah": Case("niah:tokens=1200,keys=2"),  # a haystack of NQ sentences (data set nq), a distractor needle beside the gold
}


# a task registered without a case here (a plugin's, say) runs under its bare name: its defaults
CASES.update({n: Case(n) for n, e in TASKS.items() if e.arg is None and n not in CASES})


def _docs(i: int) -> list[dict]:
    return [{"title": f"Station {i}-{j}", "text": f"Station {i}-{j} opened in {1900 + 7 * j + i} on the north line."}
            for j in range(4)]


# one writer per user-file format (lines written here, in the shape of the real files users bring)
FILES = {
    "jsonl-one-gold": lambda: [{"id": f"q{i}", "question": f"When did Station {i}-{i % 4} open?",
                                "answers": [str(1900 + 7 * (i % 4) + i)], "documents": _docs(i), "gold": i % 4}
                               for i in range(3)],
    "jsonl-two-hop": lambda: [{"id": f"h{i}", "question": f"When did the station after Station {i}-0 open?",
                               "answers": [str(1907 + i)],
                               "documents": [{"title": "Line", "text": f"After Station {i}-0 comes Station {i}-1."},
                                             *_docs(i)[1:], {"title": "Other", "text": "The south line has no stations."}],
                               "gold": [0, 1]} for i in range(3)],
    "judge": lambda: [{"id": f"p{i}", "question": f"What is {i} plus {i}?", "answers": [f"It is {2 * i}.", f"It is {2 * i + 1}."],
                       "preferred": 0} for i in range(3)],
    "mc": lambda: [{"id": f"m{i}", "question": f"Which number follows {i}?", "options": [str(i), str(i + 1), str(i + 2), "none"],
                    "gold": 1} for i in range(3)],
}


def _spec(name: str, root: Path) -> str:
    """The task spec of a matrix row: a registered task's case, or the file written for a user-file format."""
    if name in CASES:
        return CASES[name].spec
    path = root / f"{name}.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in FILES[name]()))
    return f"{FILE_SCHEMAS[name][0]}:{path}"


ROWS = sorted(CASES) + sorted(FILE_SCHEMAS)
# the engines posbias ships: the example plugin's (greedy generation under another name) runs in tests/test_plugins.py,
# where a column of its own here would repeat generate's cells at half the matrix's time again
OWN_ENGINES = sorted(e for e in ENGINES if ENGINES.origins[e] == "posbias")
CELLS = [(t, e) for t in ROWS for e in OWN_ENGINES]


def _placements(task) -> str | None:
    """Two placements (the first and the last slot, or two hop pairs); None for an order task (every order)."""
    if getattr(task, "order", False):
        return None
    n = task.n_slots
    return f"0:1,{n - 2}:{n - 1}" if task.n_gold == 2 else f"0,{n - 1}"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("matrix")


@pytest.fixture(scope="module")
def examples(root) -> dict[str, str]:
    return method_examples(root, LAYERS)


@pytest.fixture(scope="module")
def loaded() -> Loaded:
    """The tiny model, on the CPU (or on POSBIAS_TEST_DEVICE, e.g. cuda: the matrix on an accelerator, by hand)."""
    tok = char_tokenizer()
    device = os.environ.get("POSBIAS_TEST_DEVICE", "cpu")
    return Loaded(tiny_model("llama", len(tok), WINDOW, layers=LAYERS).to(device), tok,
                  {"name": "tiny-llama", "context_window": WINDOW, "dtype": "fp32", "device": device})


def _config(name: str, engine: str, root: Path, **kw) -> tuple[SweepConfig, object]:
    spec = _spec(name, root)
    task = get_task(spec)
    cfg = SweepConfig(task=spec, positions=_placements(task), n=1, engine=engine,
                      max_new_tokens=GENERATE_TOKENS if engine == "generate" else None, **kw)
    return cfg, task


def _applies(spec: str, task, cfg: SweepConfig) -> bool:
    method = get_method(spec).for_task(task)
    try:
        method.check_task(task, task.placements(cfg.positions), cfg.engine)
    except PosbiasError:
        return False
    return True


PER_ITEM = ("calib:prompt",)  # one capture forward per item and row: kept off cells of many items where it fits elsewhere


def _assign(examples: dict[str, str], root: Path) -> dict[tuple[str, str], str]:
    """Each cell's method besides `none`: in cell order, the applicable method that the fewest cells run so far (ties:
    the one that applies to the fewest cells, e.g. a curve measured on one task shape; then the rotation that starts
    at the cell's index), so every method lands where it applies. A method whose cost grows with the items (PER_ITEM)
    goes to a cell of more than 20 items only if nothing else fits there: on kv-uuid's 75 pairs (6,500 tokens with the
    character tokenizer) calib:prompt made 300 capture forwards, 143 s of the suite on an AVX2 CPU."""
    names = sorted(n for n in examples if n != "none")
    used = dict.fromkeys(names, 0)
    cells = [c for c in CELLS if not missing_data(*task_data(_spec(c[0], root)))]  # all of them where the data is here
    configs = [_config(*cell, root) for cell in cells]
    fit = {cell: {n for n in names if _applies(examples[n], task, cfg)} for cell, (cfg, task) in zip(cells, configs)}
    reach = {n: sum(n in f for f in fit.values()) for n in names}
    out = {}
    for i, cell in enumerate(CELLS):
        if cell not in fit:
            continue
        fits = [n for n in names[i % len(names):] + names[: i % len(names)] if n in fit[cell]]
        assert fits, f"no registered method applies to {cell}"
        many = configs[cells.index(cell)][1].n_slots > 20
        best = min(fits, key=lambda n: (many and examples[n] in PER_ITEM, used[n], reach[n]))
        used[best] += 1
        out[cell] = examples[best]
    return out


@pytest.fixture(scope="module")
def assigned(examples, root) -> dict[tuple[str, str], str]:
    return _assign(examples, root)


def test_every_registration_is_in_the_matrix(examples, assigned):
    assert set(CASES) == {n for n, e in TASKS.items() if e.arg is None}, "a registered task has no case"
    assert set(FILES) == set(FILE_SCHEMAS), "a user-file format has no example file"
    assert {n for n, e in TASKS.items() if e.arg} == {task for task, _ in FILE_SCHEMAS.values()}, \
        "a task that reads a file has no format in FILE_SCHEMAS"
    assert set(examples) - {"mspoe-query"} == set(METHODS), "a registered method has no example"
    need_data(*{d for name in CASES for d in task_data(CASES[name].spec)})  # which cells run depends on every one
    ran = {get_method(s).name for s in assigned.values()}
    assert ran == set(METHODS) - {"none"}, f"methods no cell runs: {sorted(set(METHODS) - {'none'} - ran)}"


def _key(row: dict) -> tuple:
    return row["example_id"], json.dumps(row["position"])


def _check_entry(out: Path, entry: dict, rows: list[dict], cfg: SweepConfig, task, path: str) -> dict:
    """One entry of a comparison: its sweep folder finished, its log complete and its figures those of its rows;
    -> per row, what both scoring paths must agree on."""
    folder = out / entry["dir"]
    record = json.loads((folder / "sweep.json").read_text())
    logged = [json.loads(line) for line in (folder / "examples.jsonl").read_text().splitlines()]
    assert len({_key(r) for r in logged}) == len(logged), "a row was logged twice"
    placements = task.placements(cfg.positions)
    mine = [r for r in rows if r["method"] == entry["method"]]
    assert len(mine) == cfg.n * len(placements) and {_key(r) for r in mine} <= {_key(r) for r in logged}
    assert [json.dumps(p["position"]) for p in record["per_position"]] == [json.dumps(p) for p in map(list_or_int, placements)]
    for p in record["per_position"]:
        at = [r for r in mine if json.dumps(r["position"]) == json.dumps(p["position"])]
        assert p["n"] == len(at) == cfg.n and p["correct"] == sum(bool(r["correct"]) for r in at)
    assert record["config"]["scoring_path"].startswith(path), record["config"]["scoring_path"]
    assert record["summary"]["chance"] == pytest.approx(task.chance) and ("order" in record["summary"]) == \
        getattr(task, "order", False)
    if cfg.engine == "generate":  # every generated answer says whether the limit cut it short
        assert all(isinstance(r["prediction"], str) and isinstance(r["cut"], bool) for r in mine)
    return {_key(r): {k: r.get(k) for k in ("correct", "prediction", "choice")} for r in mine}


def list_or_int(p):
    return list(p) if isinstance(p, tuple) else p


@pytest.mark.parametrize("cell", CELLS, ids=[f"{t}-{e}" for t, e in CELLS])
def test_cell_runs_right_on_both_paths_then_compare_and_report(cell, loaded, assigned, root, tmp_path):
    name, engine = cell
    need_data(*task_data(_spec(name, root)))
    method = assigned[cell]
    by_path = {}
    for shared in (True, False):
        cfg, task = _config(name, engine, root, prefix_sharing=shared)
        out = tmp_path / ("shared" if shared else "plain")
        res = run_compare(cfg, ["none", method], out, loaded=loaded, progress=False)
        assert [e["method"] for e in res.entries] == ["none", method]
        assert res.entries[0]["collapse"]["chance"] == pytest.approx(task.chance)
        by_path[shared] = [_check_entry(out, e, res.rows, cfg, task, "prefix-shared" if shared and
                                        get_method(e["method"]).prefix_safe else "plain") for e in res.entries]
    assert by_path[True] == by_path[False], "the prefix-shared and the plain path disagree"
    report = build_report([tmp_path / "shared", tmp_path / "plain"], tmp_path / "report.html")
    assert report.sections == 2 and report.kinds == ["comparison", "comparison"]


@pytest.mark.parametrize("cell", CELLS, ids=[f"{t}-{e}" for t, e in CELLS])
def test_what_does_not_apply_is_refused_in_one_line(cell, loaded, examples, root, tmp_path):
    cfg, task = _config(*cell, root)
    refused = [s for s in examples.values() if not _applies(s, task, cfg)]
    for spec in refused:
        out = tmp_path / get_method(spec).name
        with pytest.raises(PosbiasError) as e:
            run_sweep(replace(cfg, method=spec), out, loaded=loaded, progress=False)
        assert "\n" not in str(e.value) and e.value.fix, str(e.value)
        assert not out.exists(), f"{spec} on {cell} wrote {sorted(p.name for p in out.iterdir())} before refusing"


# --- served: the same cells against the real vLLM server (SmolLM2), for the methods a served model takes ---------

SERVED_ROWS = sorted(FILE_SCHEMAS) + ["kv-lookup", "mc-kv"]


@pytest.mark.parametrize("name", SERVED_ROWS)
def test_served_cells(name, vllm_server, tmp_path):
    spec = (f"openai:model=smollm2,base_url={vllm_server['url']},tokenizer={vllm_server['dir']}")
    for engine in OWN_ENGINES:
        cfg, task = _config(name, engine, tmp_path, model=spec)
        methods = ["none"] + (["swap", "aswap"] if getattr(task, "order", False) else
                              ["reorder:bm25:first", "ensemble:3:shift:adaptive", f"curve:{_served_policy(task, tmp_path)}"])
        res = run_compare(cfg, methods, tmp_path / engine, progress=False)
        for e in res.entries:
            _check_entry(tmp_path / engine, e, res.rows, cfg, task, "served")
        assert all(r["prompt_tokens"] > 0 for r in res.rows)
        with pytest.raises(PosbiasError):  # attention calibration reads the attention, in process only
            run_sweep(replace(cfg, method="calib:prompt"), tmp_path / "refused", progress=False)
        assert not (tmp_path / "refused").exists()
    build_report([tmp_path / e for e in OWN_ENGINES], tmp_path / "report.html")


def _served_policy(task, root: Path) -> Path:
    """A slot policy for the served model on this task (the last slot best), as `posbias policy export` writes it."""
    n, f = task.n_slots, root / "policy.json"
    f.write_text(json.dumps({"posbias_policy": 1, "model": "openai:smollm2", "task": task.config(), "n_slots": n,
                             "ranking": list(range(n))[::-1], "measured": {"run": "tests"}}))
    return f


torch.set_num_threads(THREADS)
