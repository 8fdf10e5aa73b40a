import json
import re

import pytest

from posbias.errors import PosbiasError
from posbias.tasks import get_task, move, resolve_positions
from posbias.tasks.kv_uuid import format_records


def test_move_keeps_the_others_in_order():
    items = list("abcdef")
    for g in range(6):
        for p in range(6):
            out = move(items, g, p)
            assert out[p] == items[g]
            assert [x for x in out if x != items[g]] == [x for x in items if x != items[g]]


def test_resolve_positions():
    assert resolve_positions("all", 4) == [0, 1, 2, 3]
    assert resolve_positions("9,0,4", 10) == [0, 4, 9]
    assert resolve_positions("0%,50%,100%", 10) == [0, 4, 9]
    assert resolve_positions("0%,50%,100%", 20) == [0, 10, 19]
    with pytest.raises(PosbiasError, match="out of range"):
        resolve_positions("0,10", 10)
    with pytest.raises(PosbiasError, match="bad position"):
        resolve_positions("first", 10)


def _fact_lines(user: str) -> list[str]:
    return [line for line in user.splitlines() if line.startswith("The code for")]


@pytest.mark.parametrize("facts", [3, 10, 30])
def test_kv_lookup_gold_lands_and_rest_is_identical(facts):
    task = get_task("kv-lookup", facts=facts)
    for ex in task.examples(5, seed=3):
        key, value = ex.pairs[ex.gold]
        gold_line = f"The code for {key} is {value}."
        prompts = [task.build(ex, p) for p in range(facts)]
        for p, pr in enumerate(prompts):
            lines = _fact_lines(pr.user)
            assert len(lines) == facts and lines[p] == gold_line
            assert pr.answers == (value,) and pr.answer_prefix == f"The code for {key} is"
        # removing the gold fact leaves the very same text at every position
        stripped = {pr.user.replace(gold_line + "\n", "").replace("\n" + gold_line, "") for pr in prompts}
        assert len(stripped) == 1


def test_kv_lookup_is_seeded():
    t = get_task("kv-lookup", facts=10, digits=6)
    a, b, c = t.examples(3, seed=1), t.examples(3, seed=1), t.examples(3, seed=2)
    assert a == b and a != c
    assert t.examples(2, seed=1, skip=1) == a[1:3]
    for ex in a:
        numbers = [x for kv in ex.pairs for x in kv]
        assert len(set(numbers)) == 20 and all(len(x) == 6 and x[0] != "0" for x in numbers)


def test_kv_uuid_shared_file_and_generated():
    t = get_task("kv-uuid", pairs=75)
    assert t.pool_size == 500
    ex = t.examples(1, seed=0)[0]
    key, value = ex.pairs[ex.gold]
    for p in (0, 37, 74):
        pr = t.build(ex, p)
        lines = pr.user.split("JSON data:\n")[1].split("\n\nKey:")[0].split("\n")
        assert f'"{key}": "{value}"' in lines[p]
        assert pr.user.endswith(f'Key: "{key}"\nCorresponding value:') and pr.answers == (value,)
    g = get_task("kv-uuid", pairs=7)
    ex = g.examples(2, seed=0)
    assert len(ex[0].pairs) == 7 and ex == g.examples(2, seed=0)
    assert re.fullmatch(r"[0-9a-f-]{36}", ex[0].pairs[0][0])


def test_kv_uuid_format_matches_the_study():
    assert format_records([("k1", "v1"), ("k2", "v2"), ("k3", "v3")]) == '{"k1": "v1",\n "k2": "v2",\n "k3": "v3"}'


@pytest.mark.parametrize("docs", [10, 20])
def test_nq_gold_moves_distractors_stay(docs):
    t = get_task("nq", docs=docs)
    assert t.pool_size == 341
    ex = t.examples(3, seed=0)
    for e in ex:
        gold = e.docs[e.gold]
        users = [t.build(e, p).user for p in range(docs)]
        for p, u in enumerate(users):
            found = re.findall(r"^Document \[(\d+)\]\(Title: (.*?)\) (.*)$", u, flags=re.M)
            assert len(found) == docs
            assert found[p][1:] == (gold.title, gold.text)
            assert int(found[p][0]) == p + 1
            others = [f[1:] for i, f in enumerate(found) if i != p]
            assert others == [(d.title, d.text) for i, d in enumerate(e.docs) if i != e.gold]
        assert all(u.startswith("Write a high-quality answer") and u.endswith(f"Question: {e.question}\nAnswer:") for u in users)


def test_nq_unnumbered_documents_are_the_same_lines_in_every_slot():
    """numbered=no: each document's line is the same text wherever it sits (PINE's case), only their order moves;
    the gold still moves slot by slot, nothing is left of the numbering, and the run records it."""
    t, plain = get_task("nq", numbered="no"), get_task("nq")
    e = t.examples(1, seed=0)[0]
    lines = [t.build(e, p).user.splitlines() for p in range(10)]
    docs = [[ln for ln in u if ln.startswith("Document")] for u in lines]
    assert all(sorted(d) == sorted(docs[0]) for d in docs)
    gold = e.docs[e.gold]
    assert all(d[p] == f"Document (Title: {gold.title}) {gold.text}" for p, d in enumerate(docs))
    assert all([ln for ln in u if not ln.startswith("Document")] == [ln for ln in lines[0] if not ln.startswith("Document")]
               for u in lines)
    assert "[" not in "".join(docs[0]).split("(Title:")[0] and t.slot_label is None and plain.slot_label
    assert t.config()["numbered"] is False and "numbered" not in plain.config()
    with pytest.raises(PosbiasError, match="numbered"):
        get_task("nq", numbered="maybe")


def test_the_question_before_and_after_the_documents_is_the_query_aware_prompt(tmp_path):
    """Lost in the Middle's qa_with_query_aware_contextualization.prompt (and Found in the Middle's prompt): the question
    on both sides of the documents; the default stays the study's qa.prompt (after only)."""
    plain, both = get_task("nq"), get_task("nq:question=both")
    ex = plain.examples(1)[0]
    a, b = plain.build(ex, 3), both.build(ex, 3)
    head = "Write a high-quality answer for the given question using only the provided search results " \
           "(some of which might be irrelevant).\n\n"
    assert b.user == a.user.replace(head, head + f"Question: {ex.question}\n\n", 1)
    assert b.user.count(f"Question: {ex.question}") == 2 and a.user.count(f"Question: {ex.question}") == 1
    assert both.items(ex, 3) == plain.items(ex, 3) and all(i in b.user for i in both.items(ex, 3))
    assert "question" not in plain.config() and both.config()["question"] == "both"  # in the fingerprint
    with pytest.raises(PosbiasError, match="question=after"):
        get_task("nq:question=first")


def test_nq_unknown_docs_and_missing_file(tmp_path):
    with pytest.raises(PosbiasError, match="10 or 20"):
        get_task("nq", docs=15)
    with pytest.raises(PosbiasError, match=r"data set nq is not here .* `posbias data fetch nq`"):
        get_task("nq", data_dir=str(tmp_path))


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_jsonl_task_roundtrip(tmp_path):
    rec = {"question": "q?", "answers": ["A"], "documents": [{"title": "t", "text": "x"}, {"text": "gold A"}, "plain"], "gold": 1}
    p = _write(tmp_path / "d.jsonl", [dict(rec, id="a"), dict(rec, id="b", answer="B", answers=None) | {"answers": ["B"]}])
    t = get_task(f"jsonl:{p}")
    assert t.n_slots == 3 and t.pool_size == 2
    pr = t.build(t._example(0), 2)
    assert "Document [3](Title: ) gold A" in pr.user and pr.answers == ("A",)


def test_answers_first_keeps_only_the_canonical_answer(tmp_path):
    rec = {"question": "q?", "answers": ["A", "a.", "Ay"], "documents": ["x", "gold A"], "gold": 1}
    p = _write(tmp_path / "d.jsonl", [rec])
    every, first = get_task(f"jsonl:{p}"), get_task(f"jsonl:{p}", answers="first")
    assert every.build(every._example(0), 0).answers == ("A", "a.", "Ay")
    assert first.build(first._example(0), 0).answers == ("A",)
    assert first.config()["answers"] == "first" and every.config()["answers"] == "all"  # part of the fitness key
    with pytest.raises(PosbiasError, match="unknown answers mode") as e:
        get_task(f"jsonl:{p}", answers="canonical")
    assert "all, first" in e.value.fix
    with pytest.raises(PosbiasError, match="does not take `answers`"):
        get_task("kv-lookup", answers="first")


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", r"d\.jsonl:2: not valid JSON"),
        ({"question": "q", "answers": ["a"], "documents": ["x", "y"]}, r"d\.jsonl:2: missing or bad field"),
        ({"question": "q", "answers": ["a"], "documents": ["x", "y"], "gold": 5}, r"d\.jsonl:2: gold=5"),
        ({"question": "q", "answers": [], "documents": ["x", "y"], "gold": 0}, r"d\.jsonl:2: 'answers'"),
        ({"question": "q", "answers": ["a"], "documents": ["x", "y", "z"], "gold": 0}, r"d\.jsonl:2: 3 documents"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, bad, message):
    good = {"question": "q", "answers": ["a"], "documents": ["x", "y"], "gold": 0}
    p = _write(tmp_path / "d.jsonl", [good, bad])
    with pytest.raises(PosbiasError, match=message):
        get_task(f"jsonl:{p}")


def test_unknown_task_and_wrong_option():
    with pytest.raises(PosbiasError, match="unknown task"):
        get_task("kv-lookupp")
    with pytest.raises(PosbiasError, match="does not take `docs`"):
        get_task("kv-lookup", docs=10)
