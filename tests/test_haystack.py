"""niah: needles in natural haystacks sized in the model's own tokens (tasks/haystack.py), and the long-context grid
(`posbias grid --task niah --lengths ...`: references, effective length, resume). Tiny character-level model: one
token per character, so lengths are exact to check; the NQ haystack is the shared data."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import dies_after
from posbias import GridConfig, PosbiasError, run_grid
from posbias.core.metrics import normalize_answer, ruler_all
from posbias.eval.longctx import (
    depth_spacing,
    effective_length,
    effective_lengths,
    fill_sizes,
    needle_hits,
    nolima_base,
    parse_size,
    ruler_share,
)
from posbias.scoring import engines
from posbias.scoring.scorer import Scorer
from posbias.tasks import content_words, get_task, sigmoid_depths
from posbias.tasks.text import ABBREVIATIONS, sentences

pytestmark = pytest.mark.usefixtures("one_thread")
DATA = Path(__file__).parent / "data"
ESSAYS, SF = DATA / "essays", DATA / "sf-needle.jsonl"  # hard-wrapped essays written here; NIAH's classic needle
SF_LINE = json.loads(SF.read_text())


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


@pytest.mark.data("nq")  # niah's default haystack
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


@pytest.mark.data("nq")  # niah's default haystack
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


def test_effective_length_is_the_longest_length_keeping_the_threshold_with_an_interval():
    short = np.ones(40)
    per = {1024: np.ones(40), 2048: np.r_[np.ones(36), np.zeros(4)], 4096: np.r_[np.ones(20), np.zeros(20)],
           8192: np.ones(40)}  # a recovery after a failing length does not count: every length up to L must keep it
    e = effective_length(per, short, 0.85)
    assert e["effective_length"] == 2048 and [r["keeps"] for r in e["ratios"]] == [True, True, False, True]
    assert e["ci"][0] <= 2048 <= e["ci"][1] and e["ci"][1] <= 2048
    assert e["base"] == 1.0 and e["ratios"][0]["ci"][0] < 1.0  # no zero-width interval at the ceiling
    assert effective_length({1024: np.zeros(10)}, np.ones(10))["effective_length"] == 0


def test_effective_length_keeps_the_threshold_at_exact_equality():
    """17/28 against 20/28 is 0.85 exactly; in floating point 17/28 / (20/28) is 0.8499999999999999."""
    acc, base = np.r_[np.ones(17), np.zeros(11)], np.r_[np.ones(20), np.zeros(8)]
    e = effective_length({1024: acc, 2048: np.zeros(28)}, base, 0.85)
    assert e["ratios"][0]["keeps"] is True and e["effective_length"] == 1024


def test_a_zero_base_gives_no_length_and_an_interval_open_above_never_length_0():
    floor = effective_length({1024: np.zeros(10), 2048: np.zeros(10)}, np.zeros(10))
    assert floor["effective_length"] is None and "base score is 0" in floor["note"]
    assert floor["ci"] == [0, 2048] and all(r["ci"][1] is None and r["ratio"] is None for r in floor["ratios"])
    thin = effective_length({1024: np.ones(10), 2048: np.ones(10)}, np.r_[1.0, np.zeros(9)])  # base 0.1: lower end ~0
    assert thin["effective_length"] == 2048 and thin["ci"][1] == 2048 and thin["ratios"][0]["ci"][1] is None


def test_nolima_base_is_each_examples_best_short_length_and_both_bases_are_named():
    per = {512: np.array([1.0, 0.0, 0.5]), 1024: np.array([0.5, 1.0, 0.5]), 4096: np.array([0.5, 0.5, 0.0])}
    short, base = nolima_base(per)
    assert short == [512, 1024] and base.tolist() == [1.0, 1.0, 0.5]  # NoLiMa Sec. 4.3: max per example, then mean
    both = effective_lengths(per, np.ones(3))
    assert set(both) == {"threshold", "lengths", "nolima_base", "needle_alone"}
    assert both["nolima_base"]["base"] == pytest.approx(2.5 / 3) and both["nolima_base"]["base_lengths"] == [512, 1024]
    assert both["needle_alone"]["base"] == 1.0
    none = effective_lengths({2048: np.ones(3), 4096: np.ones(3)}, np.ones(3))["nolima_base"]
    assert none["base"] is None and "add 1k to the lengths" in none["note"]


def test_sigmoid_depths_that_round_onto_one_slot_are_refused_naming_counts_that_work():
    for n in range(85, 89):
        with pytest.raises(PosbiasError) as e:
            depth_spacing(f"sigmoid:{n}")
        assert "distinct depths" in e.value.problem and "`depths=sigmoid:84`" in e.value.fix
        assert "`depths=sigmoid:89`" in e.value.fix
    assert len(depth_spacing("sigmoid:84")) == 84 and len(depth_spacing("sigmoid:89")) == 89


def test_kv_needles_are_matched_as_ruler_reads_them_with_ruler_s_generation_limit():
    assert ruler_all("The numbers are 1234567 and 7654321.", ["1234567", "7654321"])
    assert not ruler_all("The numbers are 1,234,567 and 7654321.", ["1234567", "7654321"])  # no punctuation stripped
    assert ruler_all("KEY-ABC", ["key-abc"])  # case-insensitive, as RULER's string_match_all
    assert ruler_share("1234567, then 1,111,111", ["1234567", "1111111", "2222222", "3333333"]) == 0.25
    mv, one = get_task("niah", values=4), get_task("niah")
    assert mv.metric == "ruler_all" and mv.multiline and mv.max_new_tokens == 128  # RULER's niah: 128 new tokens
    assert one.max_new_tokens == 128 and not one.multiline  # one value: stops at its first newline, as before
    assert get_task("niah", queries=16).max_new_tokens == 12 * 16


def test_each_needles_hits_are_read_from_the_answer_by_its_depth():
    rows = [{"needle_roles": ["gold", "value"], "needle_depths": [10.0, 90.0], "needle_answers": ["111", "2222"],
             "prediction": "111 and 2,222"}]
    hits = {(h["role"], h["depths"][0]): h["found"] for h in needle_hits(rows)}
    assert hits == {("gold", 0.0): 1.0, ("value", 80.0): 0.0}  # "2,222" is not 2222 (RULER's match)


def _grid(model_dir, **kw) -> GridConfig:
    return GridConfig(**{**dict(model=str(model_dir), task="niah", sizes="700,900", depths="linear:3", n=3,
                                dtype="fp32", max_batch=8), **kw})


def test_a_niah_grid_runs_references_and_resumes_after_a_kill(model_dir, loaded, tmp_path, monkeypatch):
    whole = run_grid(_grid(model_dir), tmp_path / "a", loaded=loaded, progress=False)
    rec = whole.record
    assert rec["size_option"] == "tokens" and [s["size"] for s in rec["sizes"]] == [700, 900]
    assert set(rec["references"]) == {"closed", "needle"} and rec["window"] == 2048
    assert rec["effective"]["threshold"] == 0.85 and all(0.2 < s["fill"] < 0.45 for s in rec["sizes"])
    assert [c["position"] for c in rec["cells"][:3]] == [0, 500, 1000]  # slot = depth x 10
    for s in rec["sizes"]:
        assert s["tokens"]["max"] <= s["size"] + 2
    assert "effective length" in whole.format() and "references (teacher-forced):" in whole.format()
    restore = dies_after(monkeypatch, engines, "score_teacher_forced", 3)
    with pytest.raises(KeyboardInterrupt):
        run_grid(_grid(model_dir), tmp_path / "b", loaded=loaded, progress=False)
    restore()
    again = run_grid(_grid(model_dir), tmp_path / "b", loaded=loaded, resume=True, progress=False)
    assert (tmp_path / "b" / "grid.json").read_text() == (tmp_path / "a" / "grid.json").read_text()
    assert again.record == rec


def test_a_multi_value_grid_keeps_ruler_s_partial_credit_beside_all_or_nothing(model_dir, loaded, tmp_path, monkeypatch):
    said = iter(["1,234,567 and {0}", "none", "The values: {0} and\n{1}"] * 10)  # by turns: one found, none, both

    def reply(scorer, pred, row, cut):  # each row's answer in place of the model's (a list over two lines is read whole)
        text = next(said).format(*row.prompt.answers)
        return {"correct": ruler_all(text, row.prompt.answers), "prediction": text, "cut": False}

    monkeypatch.setattr(engines.Generate, "_judge", staticmethod(reply))  # both paths judge each generation here
    res = run_grid(_grid(model_dir, sizes="800", n=2, engine="generate", task_options={"values": 2}), tmp_path / "mv",
                   loaded=loaded, progress=False)
    assert {r["partial"] for r in res.rows} == {0.0, 0.5, 1.0}
    assert all(r["partial"] == (1.0 if r["correct"] else 0.5 if "1,234,567" in r["prediction"] else 0.0)
               for r in res.rows)
    for c in res.record["cells"]:
        rows = [r for r in res.rows if r["depth"] == c["depth"]]
        assert c["partial"] == pytest.approx(np.mean([r["partial"] for r in rows]))
        assert c["accuracy"] == pytest.approx(np.mean([r["correct"] for r in rows]))
    assert res.record["sizes"][0]["partial"] == pytest.approx(np.mean([r["partial"] for r in res.rows]))
    text = res.format()
    assert "all-or-nothing" in text and "RULER's partial credit" in text and "NoLiMa base over lengths 800" in text


def test_fill_sizes_the_lengths_from_the_window(model_dir, loaded, tmp_path):
    res = run_grid(_grid(model_dir, sizes=GridConfig.sizes, fill="25%,100%", n=1, depths="0%,100%"), tmp_path / "f", loaded=loaded,
                   progress=False)
    assert [s["size"] for s in res.record["sizes"]] == [512, 2048 - 12 - 8]
    assert res.record["sizes"][1]["tokens"]["max"] <= 2048 - 12
    with pytest.raises(PosbiasError, match="task=niah"):
        run_grid(GridConfig(model=str(model_dir), task="kv-lookup", fill="50%"), tmp_path / "x", loaded=loaded)


# ----------------------------------------------------------------------------- sentences of real text

def test_sentences_of_hard_wrapped_text_end_only_where_a_sentence_ends():
    text = ("Dr. Ellis met Mr. and Mrs. Lee at\n5 p.m. near St. Anne's. It took 4.5 days,\ni.e. most of a week, "
            "e.g. for v1.2 of\nthe tool. J. R. R.\nTolkien wrote it. She said \"Stop. Now.\" Then\nshe left!\n"
            "  \t\nA new paragraph, no. 4 vs. no. 5, etc. Fig. 2 shows the U.S. and U.K. split 3.14 ways? Yes.\n\n"
            "Title without a period\n\nLast one.")
    assert sentences(text) == [
        "Dr. Ellis met Mr. and Mrs. Lee at 5 p.m. near St. Anne's.", "It took 4.5 days, i.e. most of a week, e.g. "
        "for v1.2 of the tool.", "J. R. R. Tolkien wrote it.", 'She said "Stop. Now."', "Then she left!",
        "A new paragraph, no. 4 vs. no. 5, etc. Fig. 2 shows the U.S. and U.K. split 3.14 ways?", "Yes.",
        "Title without a period", "Last one."]
    for abbr in ABBREVIATIONS | {"J", "Prof", "Jr", "Sr", "Ms", "a.m"}:  # each keeps its sentence whole
        assert len(sentences(f"We saw {abbr}. Hart there. Then we left.")) == 2, abbr


def _around(user: str, needle: str) -> tuple[str, str]:
    """The haystack text right before and right after the needle in a prompt (intro, context, question; a paragraph
    break inside the context marks where a file starts)."""
    hay = user.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
    i = hay.index(needle)
    return hay[:i].rstrip(), hay[i + len(needle):].lstrip()


def test_the_needle_never_lands_inside_a_sentence_of_hard_wrapped_essays(loaded, tmp_path, monkeypatch):
    monkeypatch.chdir(ESSAYS.parent.parent.parent)  # the windows are seeded by the haystack's path as typed: relative,
    # the same in every clone (an absolute path moved them with the checkout, and in some a depth pair met one place)
    titles = [f.read_text().split("\n", 1)[0] for f in sorted(ESSAYS.glob("*.txt"))]
    assert all(max(map(len, f.read_text().splitlines())) <= 70 for f in ESSAYS.glob("*.txt"))  # wrapped like NIAH's
    lines = tmp_path / "sf3.jsonl"
    lines.write_text(SF.read_text() * 3)  # three examples: three haystack windows
    task, rows = _rows(loaded, depths=",".join(f"{d}%" for d in range(0, 101, 10)), n=3, haystack="tests/data/essays",
                       needle=str(lines), tokens=1500)
    assert len(rows) == 33
    for r in rows:
        before, after = _around(r.prompt.user, SF_LINE["needle"])
        assert not before or re.search(r"[.!?][\"')\]]*$", before) or before.endswith(tuple(titles)), before[-80:]
        assert not after or re.match(r"[\"'(\[]?[A-Z0-9]", after), after[:80]


@pytest.mark.data("nq")  # niah's default haystack
def test_repeated_needle_lines_are_examples_of_their_own_with_their_own_haystack_window(loaded, tmp_path):
    lines = tmp_path / "sf3.jsonl"
    lines.write_text(SF.read_text() * 3)
    task = get_task("niah", needle=str(lines), haystack=str(ESSAYS), tokens=700)
    assert [ex.id for ex in task._records] == ["sf", "sf-line2", "sf-line3"]  # an id seen before gets its line
    task, rows = _rows(loaded, depths="50%", n=3, haystack=str(ESSAYS), needle=str(lines))
    hays = {r.prompt.user.split("\n\n")[1][:200] for r in rows}
    assert len(hays) == 3 and len({r.prompt.example_id for r in rows}) == 3
    with pytest.raises(PosbiasError) as e:
        get_task("niah", needle=str(SF)).examples(2)
    assert "use `n=1` or fewer, or repeat lines in" in str(e.value) and "its own seeded haystack window" in str(e.value)


# ----------------------------------------------------------------------------- a user's needle, scored right

def test_a_needle_without_an_answer_prefix_is_generated_and_refuses_teacher_forcing(loaded, tmp_path):
    file = get_task("niah", needle=str(SF), haystack=str(ESSAYS))
    assert file.default_engine == "generate" and "answer_prefix" not in file.config()
    with pytest.raises(PosbiasError) as e:
        file.check_engine("teacher-forced")
    assert f"{SF}:1 (id sf): the needle has no answer prefix" in str(e.value)
    assert e.value.fix == ("give an answer prefix with `answer_prefix=TEXT` (or an \"answer_prefix\" on each line of "
                           "the file), or use `engine=generate`")
    assert get_task("niah", needle="nq").default_engine == "generate"
    with pytest.raises(PosbiasError, match="`needle=nq-sentence`: the needle has no answer prefix"):
        get_task("niah", needle="nq-sentence").check_engine("teacher-forced")
    prefix = "The best thing to do in San Francisco is"
    given = get_task("niah", needle=str(SF), haystack=str(ESSAYS), answer_prefix=prefix + " ", tokens=700)
    assert given.default_engine == "teacher-forced" and given.config()["answer_prefix"] == prefix
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({**SF_LINE, "answer_prefix": "Answer:"}) + "\n" + SF.read_text())
    mixed = get_task("niah", needle=str(own), answer_prefix=prefix)
    assert [ex.answer_prefix for ex in mixed._records] == ["Answer:", prefix]  # a line's own wins
    assert get_task("niah", needle=str(own)).default_engine == "generate"  # line 2 has none
    row = Scorer(loaded, given).rows(given.examples(1), [500])[0]
    assert row.prompt.answer_prefix == prefix and row.prompt.user.endswith(SF_LINE["question"])
    assert get_task("niah").default_engine == "teacher-forced"  # kv keeps RULER's prefix
    with pytest.raises(PosbiasError, match="RULER's answer prefix already"):
        get_task("niah", answer_prefix="The number is")


def test_a_needle_file_s_generation_limit_leaves_room_for_its_answers(loaded):
    scorer = Scorer(loaded, get_task("niah", needle=str(SF), haystack=str(ESSAYS)))
    longest = max(len(a) + 1 for a in SF_LINE["answers"])  # one token per character, a space before
    assert scorer.max_new_tokens == 24 + longest and "longest answer" in scorer.limit_from
    assert Scorer(loaded, get_task("niah", needle="nq")).max_new_tokens == 24


@pytest.mark.data("nq")  # niah's default haystack
@pytest.mark.parametrize("line, message, fix", [
    ({"answers": 5}, '"answers" must be a list of non-empty strings, got 5', '"answers": ["5521"]'),
    ({"answers": [5521]}, "got [5521]", 'write answers as strings, e.g. "answers": ["5521"]'),
    ({"answers": [""]}, "got ['']", '"answers": ["5521"]'),
    ({"needle": " \n"}, 'the line\'s "needle" is empty', "write the needle's text on that line, or remove the line"),
    ({"question": ""}, 'the line\'s "question" is empty', "write the question's text"),
    ({"answer_prefix": 5}, '"answer_prefix" must be text', '"answer_prefix": "The answer is"'),
    ({"needle": None}, 'a needle line needs "needle" (text)', "use `needle=kv` or `needle=nq`"),
])
def test_a_bad_needle_line_is_refused_naming_its_line_and_id(tmp_path, line, message, fix):
    file = tmp_path / "needles.jsonl"
    file.write_text(SF.read_text() + json.dumps({**SF_LINE, "id": "two", **line}) + "\n")
    with pytest.raises(PosbiasError) as e:
        get_task("niah", needle=str(file))
    assert str(e.value).startswith(f"{file}:2 (id two): ") and message in e.value.problem and fix in e.value.fix



def test_a_grid_on_a_user_needle_scores_its_cells_and_references_on_generation(model_dir, loaded, tmp_path):
    lines = tmp_path / "sf2.jsonl"
    lines.write_text(SF.read_text() * 2)
    opts = {"needle": str(lines), "haystack": str(ESSAYS)}
    res = run_grid(_grid(model_dir, sizes="600", depths="0%,100%", n=2, task_options=opts, max_new_tokens=4),
                   tmp_path / "g", loaded=loaded, progress=False)
    refs = res.record["references"]
    assert res.record["config"]["engine"] == "generate" and refs["needle"]["engine"] == refs["closed"]["engine"] == "generate"
    for name in ("size-600", "ref-needle", "ref-closed"):
        assert json.loads((tmp_path / "g" / name / "sweep.json").read_text())["config"]["engine"] == "generate", name
    assert "references (generate): closed-book" in res.format()


def test_smollm2_finds_niah_s_needle_in_hard_wrapped_essays_at_a_sentence_boundary(smollm2, tmp_path):
    """NIAH's classic needle on the essays written here: SmolLM2 reproduces it alone (generation, the default for a
    needle without an answer prefix), and at no depth of 1K tokens does it split a sentence of its own tokenizer's
    haystack."""
    task = get_task("niah", needle=str(SF), haystack=str(ESSAYS), tokens=1024)
    for r in Scorer(smollm2, task).rows(task.examples(1), task.placements("0%,10%,20%,30%,40%,50%,60%,70%,80%,90%,100%")):
        before, after = _around(r.prompt.user, SF_LINE["needle"])
        assert not before or before.endswith(("Estimate", "Books", "Problem")) or re.search(r"[.!?][\"')\]]*$", before)
        assert not after or re.match(r"[\"'(\[]?[A-Z0-9]", after), after[:80]
    cfg = GridConfig(model="smollm2-135m", task="niah", task_options={"needle": str(SF), "haystack": str(ESSAYS)},
                     sizes="1k", depths="50%", n=1)
    refs = run_grid(cfg, tmp_path / "g", loaded=smollm2, progress=False).record["references"]
    print(refs)
    assert refs["needle"]["accuracy"] > 0.5 and refs["needle"]["engine"] == "generate"
    assert refs["closed"]["accuracy"] < refs["needle"]["accuracy"]


@pytest.mark.data("nq")  # niah's default haystack
def test_an_empty_needle_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "none.jsonl").write_text("\n")
    with pytest.raises(PosbiasError, match="holds no line -- add one JSON object per line"):
        get_task("niah", needle=str(tmp_path / "none.jsonl"))


def test_a_jsonl_question_may_carry_its_own_answer_prefix(tmp_path):
    """The same for QA files (tasks/docqa.py): a line's "answer_prefix" starts the reply, so teacher forcing can score
    an answer a chat model would not start with; without one the prefix stays empty (and the default engine is
    generation, as before)."""
    line = {"question": "Who wrote it?", "answers": ["Jane Austen"], "documents": ["x", "y"], "gold": 0}
    (tmp_path / "qa.jsonl").write_text(json.dumps({**line, "answer_prefix": "The author is "}) + "\n"
                                       + json.dumps(line) + "\n")
    task = get_task(f"jsonl:{tmp_path / 'qa.jsonl'}")
    assert [task.build(ex, 1).answer_prefix for ex in task.examples(2)] in (["The author is", ""], ["", "The author is"])
    assert task.default_engine == "generate"
    (tmp_path / "bad.jsonl").write_text(json.dumps({**line, "answer_prefix": 5}) + "\n")
    with pytest.raises(PosbiasError, match="bad.jsonl:1: 'answer_prefix' must be a string"):
        get_task(f"jsonl:{tmp_path / 'bad.jsonl'}")


def test_show_prints_the_needle_with_the_text_either_side_of_it(loaded):
    from posbias.measure import show_prompt

    shown = show_prompt("niah", "50%", loaded=loaded, task_options={"needle": str(SF), "haystack": str(ESSAYS),
                                                                    "tokens": 1200})
    gold = shown.gold[0]
    assert gold["text"] == SF_LINE["needle"] and shown.text[gold["chars"][0]:gold["chars"][1]] == gold["text"]
    before, after = gold["around"]
    assert re.search(r"[.!?][\"')\]]* $", before) and re.match(r" [\"'(\[]?[A-Z]", after), gold["around"]
    assert f"between ...{before!r} and {after!r}..." in shown.format()


def test_a_haystack_s_windows_follow_its_text_not_where_it_lies(loaded, tmp_path):
    """Same seed, same text, same windows: a copy of the essays elsewhere, or the path written relative, gives the
    prompts the original gives (the windows were seeded by the path as given, so a clone elsewhere drew others)."""
    import shutil

    shutil.copytree(ESSAYS, tmp_path / "copy")
    prompts = []
    for where in (ESSAYS, tmp_path / "copy", Path(os.path.relpath(ESSAYS))):
        task, rows = _rows(loaded, depths="50%", n=1, haystack=str(where), needle=str(SF))
        prompts.append([r.prompt_ids for r in rows])
    assert prompts[0] == prompts[1] == prompts[2]
