"""Depth x length grids (`posbias grid`): cells and slots, agreement with a single sweep, resume after a kill,
refusals before anything is written (tiny model, seconds); one short SmolLM2 check (marker real)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import dies_after
from posbias import GridConfig, PosbiasError, SweepConfig, run_grid, run_sweep
from posbias.cli import main
from posbias.scoring import engines

pytestmark = pytest.mark.usefixtures("one_thread")
KV = {"digits": 3}


def _cfg(model_dir, **kw) -> GridConfig:
    base = dict(model=str(model_dir), task="kv-lookup", task_options=KV, sizes="3,6", depths="0%,25%,50%,100%",
                n=4, dtype="fp32", max_batch=4)
    return GridConfig(**{**base, **kw})


def test_cells_are_sizes_by_depths_with_the_depths_slots(model_dir, loaded, tmp_path):
    res = run_grid(_cfg(model_dir), tmp_path / "g", loaded=loaded, progress=False)
    rec = json.loads((tmp_path / "g" / "grid.json").read_text())
    assert rec == res.record
    # slot = round(d/100 * (size-1)): 3 facts -> 0, round(0.5)=0, 1, 2; 6 facts -> 0, round(1.25)=1, round(2.5)=2, 5
    assert [(c["size"], c["depth"], c["position"]) for c in rec["cells"]] == [
        (3, 0, 0), (3, 25, 0), (3, 50, 1), (3, 100, 2), (6, 0, 0), (6, 25, 1), (6, 50, 2), (6, 100, 5)]
    assert rec["sizes"][0]["merged_depths"] == [{"position": 0, "depths": [0, 25]}]  # said, not dropped
    assert rec["sizes"][1]["merged_depths"] == []
    assert rec["cells"][0]["same_slot_as"] == [25] and rec["cells"][4]["same_slot_as"] == []
    for c in rec["cells"]:
        assert c["n"] == 4 and 0 <= c["ci_low"] <= c["accuracy"] <= c["ci_high"] <= 1
        assert c["accuracy"] == c["correct"] / c["n"]
    t3, t6 = (s["tokens"] for s in rec["sizes"])
    assert t3["min"] <= t3["mean"] <= t3["max"] < t6["min"]  # more facts, more of the model's tokens
    assert {"average", "gap", "gap_ci"} <= set(rec["sizes"][0]["summary"])
    assert rec["size_option"] == "facts" and rec["depths"] == [0, 25, 50, 100]
    assert {"config", "model", "versions", "method"} <= set(rec)
    assert (tmp_path / "g" / "heatmap.png").stat().st_size > 1000
    assert (tmp_path / "g" / "size-6" / "sweep.json").exists()
    text = res.format()
    assert "3 facts" in text and "depths 0%, 25% share slot 0" in text and text.startswith("kv-lookup on ")
    assert len(res.rows) == 2 * 4 * 4  # sizes x depths x examples: a depth that shares a slot keeps its own rows
    for c in rec["cells"]:  # each cell's count is its rows' count
        rows = [r for r in res.rows if (r["size"], r["depth"]) == (c["size"], c["depth"])]
        assert {r["position"] for r in rows} == {c["position"]} and sum(r["correct"] for r in rows) == c["correct"]


def test_a_cell_equals_the_single_sweep_on_the_same_examples(model_dir, loaded, tmp_path):
    grid = run_grid(_cfg(model_dir, n=6), tmp_path / "g", loaded=loaded, progress=False)
    sweep = run_sweep(SweepConfig(model=str(model_dir), task_options={"facts": 6, **KV}, positions="0,1,2,5",
                                  n=6, dtype="fp32", max_batch=4), tmp_path / "s", loaded=loaded, progress=False)
    by_slot = {p["position"]: p for p in sweep.per_position}
    cells = [c for c in grid.cells if c["size"] == 6]
    assert [c["position"] for c in cells] == [0, 1, 2, 5]
    for c in cells:
        p = by_slot[c["position"]]
        assert (c["n"], c["correct"], c["accuracy"], c["ci_low"], c["ci_high"]) == (
            p["n"], p["correct"], p["accuracy"], p["ci_low"], p["ci_high"])
    assert grid.sizes[1]["summary"] == sweep.summary
    # the same examples scored the same way: row for row (predictions, scores), not only equal counts
    rows = lambda path: sorted(path.read_text().splitlines())  # noqa: E731
    assert rows(tmp_path / "g" / "size-6" / "examples.jsonl") == rows(tmp_path / "s" / "examples.jsonl")


def test_a_grid_killed_in_its_second_size_resumes_to_the_same_grid(model_dir, loaded, tmp_path, monkeypatch):
    whole = run_grid(_cfg(model_dir), tmp_path / "a", loaded=loaded, progress=False)
    restore = dies_after(monkeypatch, engines, "score_teacher_forced", 5)  # size 3: 3 batches; dies in size 6's second
    with pytest.raises(KeyboardInterrupt):
        run_grid(_cfg(model_dir), tmp_path / "b", loaded=loaded, progress=False)
    restore()
    b = tmp_path / "b"
    assert (b / "size-3" / "sweep.json").exists() and not (b / "size-6" / "sweep.json").exists()
    assert not (b / "grid.json").exists() and not (b / ".lock").exists()
    with (b / "size-6" / "examples.jsonl").open("a") as f:
        f.write('{"example_id": "torn')  # a line cut by the kill
    size3 = (b / "size-3" / "examples.jsonl").read_text()
    again = run_grid(_cfg(model_dir), b, loaded=loaded, resume=True, progress=False)
    assert (b / "grid.json").read_text() == (tmp_path / "a" / "grid.json").read_text()
    assert again.record == whole.record
    assert (b / "size-3" / "examples.jsonl").read_text() == size3  # the finished size was reused, not rescored
    assert (b / "size-6" / "examples.jsonl").read_text() == (tmp_path / "a" / "size-6" / "examples.jsonl").read_text()
    with pytest.raises(PosbiasError, match="different configuration"):
        run_grid(_cfg(model_dir, depths="0%,100%"), b, loaded=loaded, resume=True, progress=False)


def test_an_over_window_size_is_refused_before_anything_is_written(model_dir, loaded, tmp_path):
    out = tmp_path / "g"
    with pytest.raises(PosbiasError) as e:  # 100 facts of ~26 characters: far over the 2048 window
        run_grid(_cfg(model_dir, sizes="3,100"), out, loaded=loaded, progress=False)
    msg = str(e.value)
    assert "facts 100 needs up to" in msg and "context window is 2048" in msg and "sizes=3" in msg
    assert "facts 3" not in msg
    assert not out.exists()


@pytest.mark.parametrize("change, text", [
    ({"sizes": "5,x"}, "bad `sizes`"),
    ({"sizes": "5,5"}, "listed twice"),
    ({"sizes": "1,5"}, "at least 2"),
    ({"depths": "0%,150%"}, "outside 0%..100%"),
    ({"depths": "0%,half"}, "bad depth 'half'"),
    ({"depths": "50%,50"}, "listed twice"),
    ({"task": "kv-2hop"}, "two-hop task"),
    ({"task": "jsonl:x.jsonl"}, "has no size option"),
    pytest.param({"task": "nq", "sizes": "10,15"}, "nq has no size 15", marks=pytest.mark.data("nq")),
    ({"task_options": {"facts": 5}}, "sets `facts` itself"),
])
def test_bad_grids_are_refused_by_validation(model_dir, change, text):
    with pytest.raises(PosbiasError, match=text.replace("(", r"\(")):
        replace(_cfg(model_dir), **change).validate()


TINY = ["--n", "2", "--dtype", "fp32", "--quiet", "--digits", "3"]


@pytest.mark.parametrize("args, text", [
    (["--sizes", "5,x"], "bad --sizes '5,x'"),
    (["--depths", "0%,200%"], "depth 200% is outside 0%..100%"),
    (["--task", "kv-2hop"], "kv-2hop is a two-hop task"),
    (["--task", "jsonl:/nonexistent.jsonl"], "task jsonl has no size option to grow (a depth grid grows the context of one gold item) -- use a task with a size"),
    pytest.param(["--task", "nq", "--sizes", "10,30"], "nq has no size 30", marks=pytest.mark.data("nq")),
    (["--sizes", "3,100"], "context window is 2048 -- drop 100 from --sizes, e.g. --sizes 3"),
    (["--facts", "5"], "the grid sets --facts itself"),
])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(model_dir, tmp_path, monkeypatch, capsys, args, text):
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", ["posbias", "grid", "--model", str(model_dir), *TINY, "--out", str(out), *args])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("posbias: error: ")
    assert text in err, err
    assert not out.exists()


def test_cli_grid_prints_the_table_and_writes_the_folder(model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", ["posbias", "grid", "--model", str(model_dir), *TINY, "--sizes", "3,5",
                                     "--depths", "0%,100%", "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0
    printed = capsys.readouterr().out
    assert "2 sizes x 2 depths" in printed and "5 facts" in printed and "100%" in printed
    assert (out / "grid.json").exists() and (out / "size-5" / "sweep.json").exists()


@pytest.mark.real
def test_smollm2_grid_finds_the_first_fact_more_than_the_middle(smollm2, tmp_path):
    res = run_grid(GridConfig(sizes="5,10", depths="0%,50%", n=4), tmp_path / "g", loaded=smollm2, progress=False)
    acc = {(c["size"], c["depth"]): c["accuracy"] for c in res.cells}
    assert acc[(10, 0)] > acc[(10, 50)]  # lost in the middle (README: ~0.9 first vs ~0.05 middle at 10 facts)
    t5, t10 = (s["tokens"]["mean"] for s in res.sizes)
    assert 150 < t5 < t10 and 60 < t10 - t5 < 150  # the model's own tokens: 12-30 per fact (measured 181 at 5 facts)


NEEDLE = {"needle": str(Path(__file__).parent / "data" / "sf-needle.jsonl"),
          "haystack": str(Path(__file__).parent / "data" / "essays")}


@pytest.mark.parametrize("kw, text", [
    ({"n": 2}, "or repeat lines in"),  # a needle file of one line holds one example
    ({"n": 1, "engine": "teacher-forced"}, "the needle has no answer prefix"),
])
def test_a_niah_grid_checks_its_needle_file_before_the_model_loads(tmp_path, monkeypatch, kw, text):
    monkeypatch.setattr("posbias.eval.opening.open_backend", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(PosbiasError, match=text):
        run_grid(GridConfig(task="niah", task_options=NEEDLE, sizes="1k", **kw), tmp_path / "g", progress=False)
    assert not (tmp_path / "g").exists()
