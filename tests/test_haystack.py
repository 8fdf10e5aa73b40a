"""niah: needles in natural haystacks sized in the model's own tokens (tasks/haystack.py), and the long-context grid
(`posbias grid --task niah --lengths ...`: references, effective length, resume). Tiny character-level model: one
token per character, so lengths are exact to check; the NQ haystack is the shared data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import dies_after
from posbias import GridConfig, PosbiasError, run_grid
from posbias.core.metrics import normalize_answer
from posbias.eval import engines
from posbias.eval.longctx import depth_spacing, effective_length, fill_sizes, needle_hits, parse_size
from posbias.eval.scorer import Scorer
from posbias.tasks import content_words, get_task, sigmoid_depths

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(loaded, depths="0%,50%,100%", n=3, engine=None, **opts):
    task = get_task("niah", **{"tokens": 700, **opts})
    scorer = Scorer(loaded, task, engine)
    return task, scorer.rows(task.examples(n, 0), task.placements(depths))


@pytest.mark.parametrize("opts", [{}, {"needle": "nq"}, {"needle": "nq-sentence"}, {"keys": 3}, {"values": 3},
                                  {"queries": 2}, {"tokens": 600}], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "kv")
def test_every_prompt_fills_its_length_without_passing_it_and_records_its_needles(loaded, opts, tmp_path):
    hay = tmp_path / "short.txt"  # short sentences: boundaries every ~30 tokens, so depths land within a few percent
    hay.write_text(" ".join(f"Day {i} was dry and calm." for i in range(400)))
    engine = "generate" if {"values", "queries"} & set(opts) else None
    task, rows = _rows(loaded, engine=engine, haystack=str(hay), **{"tokens": 1900, **opts})
    for r in rows:
        n = len(r.prompt_ids)
        assert task.tokens - 30 < n <= task.tokens + 2, n  # up to the length, less than one sentence short of it
        m = r.prompt.meta
        assert m["target_tokens"] == task.tokens and len(m["needle_depths"]) == len(m["needle_roles"]) >= 1
        assert m["needle_roles"][0] == "gold"
        for needle in task._example(0).needles if task.pool_size is None else ():
            assert needle.text in r.prompt.user or r.prompt.example_id != "niah0"
    golds = [r.prompt.meta["needle_depths"][0] for r in rows[:3]]
    assert golds[0] == 0 and golds[2] == 100 and 45 < golds[1] < 55  # 0%, 50%, 100% of the haystack's tokens
    others = {tuple(r.prompt.meta["needle_depths"][1:]) for r in rows[:3]}
    assert len(others) == 1  # the other needles stay put while the gold moves


def test_the_haystack_never_holds_the_needles_key_or_answer(loaded):
    for opts in ({}, {"needle": "nq"}):
        task, rows = _rows(loaded, depths="50%", n=6, **{**opts, "tokens": 1900})
        for r in rows:
            ex = next(e for e in task.examples(6, 0) if e.id == r.prompt.example_id)
            hay = r.prompt.user.replace(ex.question, "")
            for needle in ex.needles:
                hay = hay.replace(needle.text, "")
            for avoid in ex.avoid:
                assert avoid not in normalize_answer(hay), (avoid, r.prompt.example_id)


def test_same_seed_same_prompts_and_another_example_another_haystack(loaded):
    _, a = _rows(loaded)
    _, b = _rows(loaded)
    assert [r.prompt_ids for r in a] == [r.prompt_ids for r in b]
    assert a[0].prompt.user != a[3].prompt.user  # examples draw their own haystack


def test_a_user_text_haystack_and_a_user_needle_file(loaded, tmp_path):
    hay = tmp_path / "essays"
    hay.mkdir()
    (hay / "a.txt").write_text(" ".join(f"Sentence number {i} talks about the weather in town." for i in range(300)))
    needles = tmp_path / "needles.jsonl"
    needles.write_text(json.dumps({"needle": "Rosa keeps her bicycle in the blue shed.",
                                   "question": "Where does Rosa keep her bicycle?", "answers": ["blue shed"]}) + "\n")
    task, rows = _rows(loaded, n=1, haystack=str(hay), needle=str(needles))
    assert all("Rosa keeps her bicycle in the blue shed." in r.prompt.user for r in rows)
    assert "weather in town" in rows[0].prompt.user and rows[0].prompt.answers == ("blue shed",)
    assert task.metric == "best_subspan_em"


def test_no_overlap_keeps_only_needles_sharing_no_content_word_with_their_question():
    task = get_task("niah", needle="nq-sentence", overlap="none")
    allowed = get_task("niah", needle="nq-sentence")
    assert 0 < task.pool_size < allowed.pool_size
    for ex in task.examples(20, 0):
        assert not content_words(ex.needles[0].text) & content_words(ex.question)
    assert content_words("The Rivers were flowing") == {"river", "flow"}


def test_references_drop_the_haystack(loaded):
    _, needle = _rows(loaded, context="needle", n=2)
    _, closed = _rows(loaded, context="none", n=2)
    _, full = _rows(loaded, n=2)
    assert len(needle) == len(closed) == 2  # one place: no depth without a haystack
    gold = full[0].prompt.meta and "special magic number" in full[0].prompt.user
    assert gold and needle[0].prompt.user.count("One of the special magic numbers") == 1
    assert "One of the special magic numbers" not in closed[0].prompt.user
    assert len(closed[0].prompt_ids) < len(needle[0].prompt_ids) < len(full[0].prompt_ids) - 200


@pytest.mark.parametrize("opts, fix", [
    ({"tokens": 80}, "tokens="), ({"keys": 2, "values": 2}, "only one"), ({"needle": "nq", "values": 2}, "needle=kv"),
    ({"overlap": "none"}, "nq-sentence"), ({"context": "half"}, "context ="), ({"haystack": "/nope"}, "haystack=nq"),
    ({"tokens": 100000}, "fewer `tokens`"), ({"tokens": 1900, "haystack": "small"}, "holds only"),
])
def test_bad_options_are_refused_in_one_line(loaded, opts, fix, tmp_path):
    if opts.get("haystack") == "/nope":
        opts = {"haystack": str(tmp_path / "nope.txt")}
    if opts.get("haystack") == "small":
        (tmp_path / "small.txt").write_text("One short line. And another one.")
        opts = {**opts, "haystack": str(tmp_path / "small.txt")}
    with pytest.raises(PosbiasError) as e:
        task = get_task("niah", **opts)
        Scorer(loaded, task).rows(task.examples(1, 0), [0])
    assert fix in str(e.value) and "\n" not in str(e.value)


def test_multi_value_needs_generation(loaded):
    with pytest.raises(PosbiasError, match="engine=generate"):
        Scorer(loaded, get_task("niah", values=2), "teacher-forced")


def test_depth_spacings_and_lengths():
    assert depth_spacing("linear:5") == ["0", "25", "50", "75", "100"]
    s = sigmoid_depths(11)
    assert s[0] == 0 and s[-1] == 100 and s[5] == 50 and s[1] < 10 - 5  # denser at both ends than linear
    assert depth_spacing("0%,50%") is None
    assert [parse_size(x) for x in ("1k", "1.5k", "700")] == [1024, 1536, 700]
    assert fill_sizes("25%,100%", 8192, 20) == [2048, 8172]
    with pytest.raises(PosbiasError, match="fill"):
        fill_sizes("0%", 8192, 20)


def test_effective_length_is_the_longest_length_keeping_the_threshold_with_a_paired_interval():
    short = np.ones(40)
    per = {1024: np.ones(40), 2048: np.r_[np.ones(36), np.zeros(4)], 4096: np.r_[np.ones(20), np.zeros(20)],
           8192: np.ones(40)}  # a recovery after a failing length does not count: every length up to L must keep it
    e = effective_length(per, short, 0.85)
    assert e["effective_length"] == 2048 and [r["keeps"] for r in e["ratios"]] == [True, True, False, True]
    assert e["ci"][0] <= 2048 <= e["ci"][1] and e["ci"][1] <= 2048
    assert effective_length({1024: np.zeros(10)}, np.ones(10))["effective_length"] == 0
    floor = effective_length({1024: np.zeros(10)}, np.zeros(10))
    assert floor["effective_length"] is None and "needle alone" in floor["note"]


def test_each_needles_hits_are_read_from_the_answer_by_its_depth():
    rows = [{"needle_roles": ["gold", "value"], "needle_depths": [10.0, 90.0], "needle_answers": ["111", "222"],
             "prediction": "111 and 333"}]
    hits = {(h["role"], h["depths"][0]): h["found"] for h in needle_hits(rows)}
    assert hits == {("gold", 0.0): 1.0, ("value", 80.0): 0.0}


def _grid(model_dir, **kw) -> GridConfig:
    return GridConfig(**{**dict(model=str(model_dir), task="niah", sizes="600,900", depths="linear:3", n=3,
                                dtype="fp32", max_batch=8), **kw})


def test_a_niah_grid_runs_references_and_resumes_after_a_kill(model_dir, loaded, tmp_path, monkeypatch):
    whole = run_grid(_grid(model_dir), tmp_path / "a", loaded=loaded, progress=False)
    rec = whole.record
    assert rec["size_option"] == "tokens" and [s["size"] for s in rec["sizes"]] == [600, 900]
    assert set(rec["references"]) == {"closed", "needle"} and rec["window"] == 2048
    assert rec["effective"]["threshold"] == 0.85 and all(0.2 < s["fill"] < 0.45 for s in rec["sizes"])
    assert [c["position"] for c in rec["cells"][:3]] == [0, 500, 1000]  # slot = depth x 10
    for s in rec["sizes"]:
        assert s["tokens"]["max"] <= s["size"] + 2
    assert "effective length" in whole.format() and "references:" in whole.format()
    restore = dies_after(monkeypatch, engines, "score_teacher_forced", 3)
    with pytest.raises(KeyboardInterrupt):
        run_grid(_grid(model_dir), tmp_path / "b", loaded=loaded, progress=False)
    restore()
    again = run_grid(_grid(model_dir), tmp_path / "b", loaded=loaded, resume=True, progress=False)
    assert (tmp_path / "b" / "grid.json").read_text() == (tmp_path / "a" / "grid.json").read_text()
    assert again.record == rec


def test_fill_sizes_the_lengths_from_the_window(model_dir, loaded, tmp_path):
    res = run_grid(_grid(model_dir, sizes="5", fill="25%,100%", n=1, depths="0%,100%"), tmp_path / "f", loaded=loaded,
                   progress=False)
    assert [s["size"] for s in res.record["sizes"]] == [512, 2048 - 12 - 8]
    assert res.record["sizes"][1]["tokens"]["max"] <= 2048 - 12
    with pytest.raises(PosbiasError, match="task=niah"):
        run_grid(GridConfig(model=str(model_dir), task="kv-lookup", fill="50%"), tmp_path / "x", loaded=loaded)
