"""Order bias (tasks/order.py, core/order.py, methods/decision.py): the figures against hand counts and the
authors' formulas, the cyclic design, label scoring against the model's own logits, the decision rules in a
sweep and a comparison (PriDe's calibration items never evaluated), users' files and their bad lines."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from posbias import PosbiasError, SweepConfig, build_report, get_method, get_task, run_compare, run_sweep
from posbias.core.order import balanced_choice, candidate, order_figures, parse_choice, pride_choice, pride_prior
from posbias.measure import Scorer
from posbias.scoring.encode import encode, left_pad

pytestmark = pytest.mark.usefixtures("one_thread")
KV = {"options": 3, "facts": 2, "digits": 3}


def test_figures_match_hand_counts():
    # item rows: (slot chosen with the correct answer at slot 0, at slot 1)
    ch = np.array([[0, 0], [0, 0], [1, 1], [0, 1], [1, 0], [0, -1]])
    f = order_figures(ch, [0, 1], 2)
    assert f["consistency"]["value"] == pytest.approx(2 / 5)  # (0,1) right twice, (1,0) wrong twice; unread left out
    assert f["conflict_rate"]["value"] == pytest.approx(3 / 5)
    assert f["preference_fairness"]["value"] == pytest.approx((1 - 2) / 6)  # recency 1, primacy 2, over 6 pairs
    assert f["rstd"]["value"] == pytest.approx(np.std([4 / 6, 2 / 6]))
    assert f["choice_share"] == pytest.approx([7 / 12, 4 / 12]) and f["unread"] == pytest.approx(1 / 12)
    lo, hi = f["consistency"]["ci"]
    assert lo <= 0.4 <= hi and lo < hi


@pytest.mark.parametrize("seed", range(5))
def test_preference_fairness_is_the_authors_rescaled_raw_score(seed):
    """Judging the Judges, authors' code: raw = R * R/(P+R) - P * P/(P+R), rescaled from [-n, n] to [-1, 1]."""
    ch = np.random.default_rng(seed).integers(-1, 2, (40, 2))
    p = int(((ch[:, 0] == 0) & (ch[:, 1] == 0)).sum())
    r = int(((ch[:, 0] == 1) & (ch[:, 1] == 1)).sum())
    n = len(ch)
    raw = r * r / (p + r) - p * p / (p + r) if p + r else 0.0
    assert order_figures(ch, [0, 1], 2)["preference_fairness"]["value"] == pytest.approx((raw + n) / (2 * n) * 2 - 1)


def test_conflicts_over_pairs_of_orders_for_k_options():
    ch = np.array([[0, 1, 2], [0, 0, 0]])  # always right; always slot 0 (candidates 0, 2, 1)
    f = order_figures(ch, [0, 1, 2], 3)
    assert f["consistency"]["value"] == 0.5 and f["conflict_rate"]["value"] == 0.5
    assert "preference_fairness" not in f and candidate(0, 1, 3) == 2


def _authors_prior(probs: np.ndarray) -> np.ndarray:
    """PriDe's global prior as the authors' code computes it (chujiezheng/LLM-MCQ-Bias, code/debias_utils.py `simple`
    and code/debias_pride.py), rewritten here: per item, the rows (cyclic orders) normalised, the softmax of the mean
    log-probability per label; then the plain mean of the items' priors."""
    priors = []
    for observed in probs:
        observed = observed / (observed.sum(axis=1, keepdims=True) + 1e-10)
        e = np.exp(np.log(observed + 1e-10).mean(axis=0))
        priors.append(e / e.sum())
    return np.mean(priors, axis=0)


def test_pride_prior_is_the_authors_mean_of_item_priors():
    rng = np.random.default_rng(0)
    changed = 0
    for _ in range(2000):
        logits = rng.normal(size=(3, 4, 4)) * 2  # 3 calibration items, 4 cyclic orders, 4 labels
        prior = pride_prior(logits)
        assert np.exp(prior) == pytest.approx(_authors_prior(np.exp(logits)), abs=1e-6)
        geometric = np.log(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).mean(axis=1)  # the old rule
        geometric = geometric - np.log(np.exp(geometric).sum(-1, keepdims=True))
        geometric = geometric.mean(axis=0) - np.log(np.exp(geometric.mean(axis=0)).sum())
        row = rng.normal(size=4) * 2
        changed += pride_choice(row, prior) != pride_choice(row, geometric)
    assert changed == 91  # decisions the geometric mean (posbias before 2026-11) took differently


def test_pride_calibrates_on_the_authors_share_rounded_down():
    assert [get_method("pride").calibration(n) for n in (10, 50, 60, 100, 1000)] == [1, 2, 3, 5, 50]
    assert get_method("pride:7").calibration(50) == 7


def test_pride_prior_and_debiasing():
    # one item, two orders: label A gets 0.7 then 0.6 -> geometric means 0.648 : 0.346 -> prior 0.652 : 0.348
    lp = np.log([[[0.7, 0.3], [0.6, 0.4]]])
    prior = pride_prior(lp)
    assert np.exp(prior) == pytest.approx([0.6517, 0.3483], abs=1e-4)
    assert pride_choice(np.log([0.6, 0.4]), prior) == 1  # 0.6/0.652 < 0.4/0.348
    assert pride_choice(np.log([0.9, 0.1]), prior) == 0
    assert np.exp(pride_prior(lp + 3.0)) == pytest.approx(np.exp(prior))  # any scale: normalised over labels


def test_balanced_choice_averages_orders_and_ties_are_no_verdict():
    # order 0: candidate 0 at A, 1 at B; order 1: candidate 1 at A, 0 at B. Slot A is favoured by 1 nat in both
    # orders; candidate 0 by 0.5 nat in the first, candidate 1 by 0.5 nat... net: candidate 1 by the mean.
    assert balanced_choice([0, 1], 2, logps=[[0.5, 0.0], [2.0, 0.0]]) == 1  # c0: (.5 + 0)/2 vs c1: (0 + 2)/2 on
    assert balanced_choice([0, 1], 2, logps=[[3.0, 0.0], [1.0, 0.0]]) == 0  # normalised logps: the larger mean wins
    assert balanced_choice([0, 1], 2, choices=[0, 1]) == 0  # both orders name candidate 0
    assert balanced_choice([0, 1], 2, choices=[0, 0]) == -1  # A both times: the orders disagree -> a tie
    assert balanced_choice([0, 1, 2], 3, choices=[0, 1, 0]) == 0  # 2 votes of 3


def test_parse_choice():
    labels = ("A", "B", "C")
    assert parse_choice(" [[B]]", labels) == 1 and parse_choice(" C. the third", labels) == 2
    assert parse_choice("Answer B", labels) == 1 and parse_choice(" ABC", labels) == -1 and parse_choice("", labels) == -1
    assert parse_choice(" 12", ("1", "12")) == 1  # the longer label first


@pytest.mark.parametrize("name", ["judge-kv", "mc-kv", "judge-nq", "mc-nq"])
def test_every_order_holds_the_same_candidates_cyclically(name):
    task = get_task(name, options=3)
    item = task.examples(1, seed=3)[0]
    arrangements = [task.arrangement(item, p) for p in range(task.n_slots)]
    for p, arr in enumerate(arrangements):
        assert arr[p] == item.candidates[0] and sorted(arr) == sorted(item.candidates)
        assert all(arr[s] == item.candidates[(s - p) % 3] for s in range(3))
        prompt = task.build(item, p)
        assert prompt.answers == (prompt.options[p],) and all(c in prompt.user for c in item.candidates)
    assert len(set(item.candidates)) == 3


@pytest.mark.parametrize("name", ["judge-kv", "mc-kv", "judge-nq", "mc-nq"])
def test_labels_bound_to_candidates_go_with_them_and_the_reply_instruction_stays(name):
    """bind=candidate: each candidate shows the same label at every slot (so the orders are one set of labelled
    texts reordered), the correct one's label is the gold at every slot and varies between items, and everything
    but the order of the labelled items is the same text (a judge's "Reply with A or B" lists the labels in their
    own order); bind=slot keeps A at the first slot."""
    task = get_task(name, options=3, bind="candidate")
    items = task.examples(12, seed=3)
    golds = set()
    for item in items:
        shown = {}
        texts = []
        for p in range(3):
            prompt = task.build(item, p)
            labels = task.slot_labels(item, p)
            assert sorted(labels) == sorted(task.labels_of(item)) and prompt.options == labels
            for s, label in enumerate(labels):
                shown.setdefault(item.candidates[(s - p) % 3], set()).add(label)
            assert prompt.answers == (labels[p],)
            golds.add(labels[p])
            rest = prompt.user
            for text in task.items(item, p):
                assert text in rest
                rest = rest.replace(text, "")
            texts.append((rest, sorted(task.items(item, p))))
        assert all(len(v) == 1 for v in shown.values()), shown
        assert all(t == texts[0] for t in texts), texts
    assert len(golds) > 1
    # equal scores fall to the label first in the set, wherever it is shown (bf16 ties are common): the same verdict
    # at every slot; with slot labels, to the first slot as before
    from types import SimpleNamespace

    from posbias.scoring.teacher_forced import option_verdict
    item = items[0]
    picked = {option_verdict(SimpleNamespace(prompt=task.build(item, p)), [0.0] * 3)["prediction"] for p in range(3)}
    assert picked == {task.labels_of(item)[0]}, picked
    plain = get_task(name, options=3)
    assert option_verdict(SimpleNamespace(prompt=plain.build(item, 2)), [0.0] * 3)["choice"] == 0
    assert get_task(name, options=3).slot_labels(items[0], 2) == task.labels_of(items[0])
    assert task.config()["bind"] == "candidate" and "bind" not in get_task(name, options=3).config()
    with pytest.raises(PosbiasError, match="bind="):
        get_task(name, bind="label")


def test_nq_wrong_candidates_never_match_a_gold_answer():
    from posbias.core.metrics import best_subspan_em

    task = get_task("mc-nq", options=5)
    for item in task.examples(200):
        golds = task._items[int(item.id[2:])].candidates[:1]
        assert not any(best_subspan_em(w, golds) for w in item.candidates[1:]), item


def test_label_scoring_is_the_models_next_token_distribution(loaded):
    task = get_task("mc-kv", **KV)
    scorer = Scorer(loaded, task, chat=False)
    rows = scorer.rows(task.examples(3), [0, 1, 2])
    got = scorer.score(rows)
    with torch.no_grad():
        logits = loaded.model(**left_pad([r.prompt_ids for r in rows], 0)).logits[:, -1].float()
    logp = torch.log_softmax(logits, -1)
    by_key = {(d["example_id"], d["position"]): d for d in got}
    for i, r in enumerate(rows):
        d = by_key[r.key]
        want = logp[i, r.option_ids]
        assert d["option_logprobs"] == pytest.approx(want.tolist(), abs=1e-4)
        assert d["choice"] == int(want.argmax()) and d["correct"] == (d["choice"] == r.key[1])


def test_prefix_shared_label_scoring_equals_plain(loaded):
    task = get_task("judge-kv", **KV)
    rows = Scorer(loaded, task, chat=False).rows(task.examples(4), [0, 1, 2])
    shared = Scorer(loaded, task, chat=False).score(rows)
    plain = Scorer(loaded, task, chat=False, prefix_sharing=False).score(rows)
    key = lambda d: (d["example_id"], d["position"])  # noqa: E731
    for a, b in zip(sorted(shared, key=key), sorted(plain, key=key)):
        assert a["choice"] == b["choice"] and a["option_logprobs"] == pytest.approx(b["option_logprobs"], abs=1e-4)


def test_labels_that_need_two_tokens_or_share_one_are_refused(loaded):
    from posbias.tasks.order import OrderItem, OrderTask

    two = OrderTask("t", [OrderItem("i", "q?", ("x", "y"), labels=("AB", "CD"))], 2)
    with pytest.raises(PosbiasError, match="several tokens"):
        encode(loaded.tokenizer, two.build(two.examples(1)[0], 0), False)
    generated = Scorer(loaded, two, engine="generate", chat=False).rows(two.examples(1), [0, 1])  # generate reads text
    assert generated[0].option_ids == []


def test_swap_and_pride_in_a_comparison(model_dir, tmp_path):
    cfg = SweepConfig(model=str(model_dir), task="judge-kv", task_options=KV, n=8, dtype="fp32")
    res = run_compare(cfg, ["none", "swap", "pride:3"], tmp_path / "c", progress=False)
    none, swap, pride = res.entries
    accs = [p["accuracy"] for p in swap["per_position"]]
    assert max(accs) == min(accs)  # one verdict per item from every order: no slot effect left
    assert swap["summary"]["order"]["consistency"]["value"] == 1.0
    assert none["vs_first"]["difference"] == 0 and "difference" in pride["vs_first"]
    logs = {d: [json.loads(x) for x in (tmp_path / "c" / d / "examples.jsonl").read_text().splitlines()]
            for d in ("none", "swap", "pride-3")}
    rec = json.loads((tmp_path / "c" / "pride-3" / "sweep.json").read_text())
    cal = set(rec["decision"]["calibration_items"])
    evaluated = {e.id for e in get_task("judge-kv", **KV).examples(8)}
    assert len(cal) == 3 and not cal & evaluated and cal | evaluated == {r["example_id"] for r in logs["pride-3"]}
    assert rec["summary"]["decision"]["calibration_forward_passes"] == 9
    # the decision rules reuse the unmodified model's rows (logged as they were, scored once)
    assert sorted(map(json.dumps, logs["none"])) == sorted(map(json.dumps, logs["swap"]))


def test_decision_rules_refuse_what_they_cannot_decide(model_dir):
    base = dict(model=str(model_dir), task="judge-kv", task_options=KV, n=2, dtype="fp32")
    with pytest.raises(PosbiasError, match="needs every order"):
        run_sweep(SweepConfig(**base, positions="0,1", method="swap"), progress=False)
    with pytest.raises(PosbiasError, match="engine=teacher-forced"):
        run_sweep(SweepConfig(**base, engine="generate", method="pride"), progress=False)
    with pytest.raises(PosbiasError, match="not one"):
        run_sweep(SweepConfig(model=str(model_dir), task_options={"facts": 3}, n=2, method="swap"), progress=False)
    with pytest.raises(PosbiasError, match="pride:0.05"):
        get_method("pride:1.5")


def test_generated_verdicts_give_choices_and_the_figures(model_dir):
    cfg = SweepConfig(model=str(model_dir), task="mc-kv", task_options=KV, n=3, dtype="fp32", engine="generate",
                      max_new_tokens=3, method="swap")
    res = run_sweep(cfg, progress=False)
    assert all(r["choice"] in (-1, 0, 1, 2) and "raw_choice" in r for r in res.rows)
    assert set(res.summary["order"]) >= {"consistency", "conflict_rate", "rstd", "choice_share", "unread"}


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_users_files_both_schemas(tmp_path):
    pair = _write(tmp_path / "p.jsonl", [{"question": "2+2?", "answers": ["5", "4"], "preferred": 1},
                                         {"id": "b", "question": "sky?", "answers": ["blue", "green"], "preferred": 0}])
    t = get_task(f"judge:{pair}")
    assert t.n_slots == 2 and t.examples(2, seed=0)[0].candidates[0] in ("4", "blue") and t.has_gold
    mc = _write(tmp_path / "m.jsonl", [{"question": "q", "options": ["a", "b", "c"], "gold": 2, "labels": ["x", "y", "z"],
                                        "context": "ctx"}])
    item = get_task(f"mc:{mc}").examples(1)[0]
    assert item.candidates == ("c", "a", "b") and item.labels == ("x", "y", "z")
    nopref = _write(tmp_path / "n.jsonl", [{"question": "q", "answers": ["a", "b"]}])
    assert not get_task(f"judge:{nopref}").has_gold


@pytest.mark.parametrize("style, recs, message", [
    ("judge", [{"question": "q", "answers": ["only one"]}], "list of exactly 2 strings; 1 of them"),
    ("judge", [{"question": "q", "answers": ["", ""]}], "lists '' twice"),
    ("mc", [{"question": "q", "options": ["a", " a ", "b"], "gold": 0}], "twice"),
    ("mc", [{"question": "q", "options": ["a", "b"], "gold": 2}], "gold=2 but there are 2 options"),
    ("mc", [{"question": "q", "options": ["a", "b"], "gold": 0, "labels": ["A", "A"]}], "'labels' lists 'A' twice"),
    ("mc", [{"question": "q", "options": ["a", "b"], "gold": 0}, {"question": "q", "options": ["a", "b", "c"], "gold": 0}],
     "earlier lines have 2"),
    ("judge", [{"question": "q", "answers": ["a", "b"], "preferred": 0}, {"question": "r", "answers": ["a", "b"]}],
     "some lines name the preferred answer"),
])
def test_bad_files_are_refused_in_one_line(tmp_path, style, recs, message):
    path = _write(tmp_path / "f.jsonl", recs)
    with pytest.raises(PosbiasError, match=message) as e:
        get_task(f"{style}:{path}")
    assert "\n" not in str(e.value)


def test_a_judge_file_may_hold_an_empty_response_shown_as_an_empty_answer_block(tmp_path):
    """54 pairs of a published judge set have one empty response (humans prefer the other): read, rendered as an empty
    block, scored like any pair; the length figures put the pair in the outer bin."""
    path = _write(tmp_path / "e.jsonl", [{"question": "Name a career.", "answers": ["", "Nursing."], "preferred": 1}])
    task = get_task(f"judge:{path}")
    item = task.examples(1)[0]
    assert item.candidates == ("Nursing.", "")
    user = task.build(item, 1).user
    assert "[Answer A]\n\n\n[Answer B]\nNursing." in user


def test_a_long_value_in_a_refusal_is_cut_at_a_word_and_the_fix_is_whole(tmp_path):
    long = "Some popular careers in the field include nursing, teaching and the like " * 3
    path = _write(tmp_path / "f.jsonl", [{"question": "q", "answers": [long, "b", "c"]}])
    with pytest.raises(PosbiasError) as e:
        get_task(f"judge:{path}")
    msg = str(e.value)
    assert "exactly 2 strings; 3 of them" in msg and "2 to 2" not in msg and "\n" not in msg
    assert "'Some popular careers in the field ...'" in msg  # cut after a word, marked
    assert msg.endswith('give \'answers\' as a JSON list of exactly 2 strings, e.g. ["first answer", ""]'), msg


def test_options_that_differ_only_in_case_are_different_options(tmp_path):
    """ARC's genetics item: R, rr, Rr, RR are four options (the check used to fold case and refuse 'Rr')."""
    path = _write(tmp_path / "arc.jsonl", [{"question": "Which genotype is heterozygous?", "options": ["R", "rr", "Rr", "RR"],
                                           "gold": 2}])
    item = get_task(f"mc:{path}").examples(1)[0]
    assert item.candidates == ("Rr", "R", "rr", "RR")


def test_a_file_mixing_label_sets_is_refused_and_its_own_labels_are_recorded(tmp_path):
    one = {"question": "q", "options": ["a", "b", "c", "d"], "gold": 0}
    mixed = _write(tmp_path / "mixed.jsonl", [{**one, "labels": ["1", "2", "3", "4"]}, {**one, "id": "x", "labels": list("ABCD")}])
    with pytest.raises(PosbiasError, match="labels A,B,C,D, but earlier lines have 1,2,3,4") as e:
        get_task(f"mc:{mixed}")
    assert "labels=letters" in e.value.fix
    relabelled = get_task(f"mc:{mixed}", labels="letters")  # the flag replaces every line's own labels
    assert relabelled.config()["labels"] == "letters" and relabelled.build(relabelled.examples(1)[0], 0).options == tuple("ABCD")
    own = _write(tmp_path / "own.jsonl", [{**one, "labels": ["1", "2", "3", "4"]}])
    assert get_task(f"mc:{own}").config()["labels"] == ["1", "2", "3", "4"]  # was recorded as "letters"
    half = _write(tmp_path / "half.jsonl", [one, {**one, "id": "x", "labels": list("WXYZ")}])
    with pytest.raises(PosbiasError, match="labels W,X,Y,Z, but earlier lines have none"):
        get_task(f"mc:{half}")


def test_labels_letters_replaces_multi_token_labels_as_the_refusal_advises(loaded, tmp_path):
    """'(A)' is several tokens; the refusal says `labels=letters`, which must then work (the lines' own labels used
    to override the flag)."""
    path = _write(tmp_path / "paren.jsonl", [{"question": f"q{i}", "options": ["x", "y", "z"], "gold": 1,
                                              "labels": ["(A)", "(B)", "(C)"]} for i in range(2)])
    with pytest.raises(PosbiasError, match="several tokens") as e:
        run_sweep(SweepConfig(task=f"mc:{path}", n=2), loaded=loaded, progress=False)
    assert "labels=letters" in e.value.fix
    res = run_sweep(SweepConfig(task=f"mc:{path}", task_options={"labels": "letters"}, n=2), loaded=loaded, progress=False)
    assert len(res.rows) == 6 and res.record["task"]["labels"] == "letters"


@pytest.mark.parametrize("tie", [None, "tie", "Tie"])
def test_a_tie_is_refused_saying_how_to_keep_it_out_or_dropped_and_counted(tmp_path, tie):
    lines = [{"question": "q", "answers": ["a", "b"], "preferred": 1}, {"id": "t", "question": "r", "answers": ["c", "d"],
                                                                       "preferred": tie}]
    path = _write(tmp_path / "ties.jsonl", lines)
    with pytest.raises(PosbiasError, match=":2: 'preferred' is .*a tie") as e:
        get_task(f"judge:{path}")
    assert "None" not in str(e.value) and "ties=drop" in e.value.fix
    task = get_task(f"judge:{path}", ties="drop")
    assert task.pool_size == 1 and task.config()["dropped_ties"] == 1


def test_the_judge_question_is_an_option_recorded_in_the_config(tmp_path):
    path = _write(tmp_path / "pref.jsonl", [{"question": "Write a haiku.", "answers": ["one", "two"], "preferred": 0}])
    task = get_task(f"judge:{path}")  # a preference file: which answer is better, MT-Bench style (the default)
    assert task.config()["ask"] == "preference"
    assert "Which answer is better?" in task.build(task.examples(1)[0], 0).user
    correct = get_task(f"judge:{path}", ask="correct")
    assert correct.config()["ask"] == "correct" and "Which answer is correct?" in correct.build(correct.examples(1)[0], 0).user
    assert get_task("judge-kv").config()["ask"] == "correct"
    with pytest.raises(PosbiasError, match="ask=.*preference"):
        get_task("judge-kv", ask="nicer")
    with pytest.raises(PosbiasError, match="does not take `ask`"):
        get_task("mc-kv", ask="correct")


def test_without_preferred_only_what_needs_no_right_answer_is_printed(loaded, tmp_path):
    """A judge file without "preferred" names no right answer: the curve is the rate of choosing answers[0] per slot,
    the order figures that need no right answer stay (consistency, conflict, fairness), and nothing reads as accuracy:
    no strict accuracy, RStd, chance level, best or worst (they used to be printed), in the sweep and in compare."""
    path = _write(tmp_path / "nopref.jsonl", [{"id": f"p{i}", "question": f"q{i}", "answers": ["a" * (i + 1), "bb"]}
                                              for i in range(4)])
    res = run_sweep(SweepConfig(task=f"judge:{path}", n=4), tmp_path / "s", loaded=loaded, progress=False)
    assert res.summary["measure"] == "picks answers[0]"
    assert set(res.summary["order"]) >= {"consistency", "conflict_rate", "preference_fairness", "choice_share", "flips"}
    assert not set(res.summary["order"]) & {"strict_accuracy", "rstd"}
    text = res.format()
    assert "picks answers[0]" in text.splitlines()[1] and "(no order bias: 0)" in text and "no order bias: 0.50 each" in text
    assert "length ratio (chars, answers[0] / answers[1])" in text and "nothing here is accuracy" in text
    for word in ("chance", "best", "worst", "strict accuracy", "RStd", "candidate 0"):
        assert word not in text, word
    cmp = run_compare(SweepConfig(task=f"judge:{path}", n=4), ["none", "swap"], loaded=loaded, progress=False)
    table = cmp.format()
    assert "chance" not in table.replace("no chance level", "") and "strict accuracy" not in table and "RStd" not in table
    assert all(e["collapse"]["chance"] is None and not e["collapse"]["flagged"] for e in cmp.entries)
    assert "consistency" in table and "(no order bias: 0)" in table
    assert res.summary["order"]["flips"]["items"]  # the report's flips table: candidate 0 is answers[0], no right one
    build_report([tmp_path / "s"], tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "candidate chosen per order (0: answers[0])" in page and "nothing here is accuracy" in page
    body = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page.split("<body")[-1])  # base64 may spell "best"
    for word in ("chance", "best", "worst", "strict accuracy", "RStd"):  # the report reads as the sweep prints
        assert word not in body, word


def test_a_repeated_id_names_both_lines_and_the_id_and_its_fix_works(tmp_path):
    """LogiQA 2.0 repeats ids; the refusal used to name neither a line nor the id."""
    lines = [{"id": i, "question": q, "options": ["a", "b"], "gold": 0} for i, q in (("q7", "q"), ("q8", "r"), ("q7", "s"))]
    path = _write(tmp_path / "logiqa.jsonl", lines)
    with pytest.raises(PosbiasError, match=r"logiqa.jsonl:3: id 'q7' is also the id of line 1") as e:
        get_task(f"mc:{path}")
    assert e.value.fix.startswith("give line 3 another 'id', or remove 'id' from every line")
    renamed = _write(tmp_path / "renamed.jsonl", [*lines[:2], {**lines[2], "id": "q7b"}])
    assert get_task(f"mc:{renamed}").pool_size == 3
    no_ids = _write(tmp_path / "no-ids.jsonl", [{k: v for k, v in r.items() if k != "id"} for r in lines])
    assert sorted(it.id for it in get_task(f"mc:{no_ids}").examples(3, seed=0)) == ["line1", "line2", "line3"]
    good = {"question": "q", "answers": ["a"], "documents": ["x", "y"], "gold": 0}
    qa = _write(tmp_path / "qa.jsonl", [{**good, "id": 5}, good, {**good, "id": "5"}])
    with pytest.raises(PosbiasError, match=r"qa.jsonl:3: id '5' is also the id of line 1") as e:
        get_task(f"jsonl:{qa}")
    assert "give line 3 another 'id'" in e.value.fix


def test_a_calibration_shortage_is_refused_before_anything_runs(loaded, tmp_path):
    """It used to surface after the whole `none` sweep, naming `--skip 10, --n 5`, which the user never passed."""
    path = _write(tmp_path / "mc.jsonl", [{"id": f"m{i}", "question": f"q{i}", "options": ["a", "b"], "gold": 0}
                                          for i in range(10)])
    cfg = SweepConfig(task=f"mc:{path}", n=10)
    with pytest.raises(PosbiasError, match=r"pride calibrates on 1 item after the 10 evaluated ones, and mc:.* holds 10") as e:
        run_compare(cfg, ["none", "pride"], tmp_path / "cmp", loaded=loaded, progress=False)
    assert e.value.fix.startswith("use `n=9` or fewer") and "skip" not in str(e.value)
    assert not (tmp_path / "cmp").exists()
    with pytest.raises(PosbiasError, match="after skipping 2"):
        run_sweep(SweepConfig(task=f"mc:{path}", n=8, skip=2, method="pride"), tmp_path / "s", loaded=loaded, progress=False)
    assert not (tmp_path / "s").exists()
