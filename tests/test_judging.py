"""Judges in practice (eval/judging.py, core/order.py, methods/decision.py `aswap`): CircularEval's strict accuracy,
flip forensics and flips.jsonl, the figures by length ratio and score gap, and the adaptive swap, against hand counts
on constructed rows and in sweeps of the tiny model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from posbias import PosbiasError, SweepConfig, build_report, get_method, get_task, run_compare, run_sweep
from posbias.core.order import label_margin, order_figures
from posbias.eval.judging import binned, flip_counts, flip_records, format_order, order_summary
from posbias.eval.sweep import SWEEP_FILES
from posbias.methods.decision import AdaptiveSwap, Swap, first_placements

pytestmark = pytest.mark.usefixtures("one_thread")
KV = {"options": 3, "facts": 2, "digits": 3}


def _row(e: str, p: int, choice: int, logps=None, chars=(10, 10), **kw) -> dict:
    row = {"example_id": e, "position": p, "choice": choice, "correct": choice == p, "candidate_chars": list(chars), **kw}
    return row if logps is None else {**row, "option_logprobs": list(logps)}


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


# --- strict accuracy -----------------------------------------------------------------------------------------------

def test_strict_accuracy_counts_an_item_only_if_right_under_every_order():
    ch = np.array([[0, 1], [0, 0], [1, 1], [0, -1], [0, 1]])  # right both times: items 0 and 4
    f = order_figures(ch, [0, 1], 2)
    assert f["strict_accuracy"]["value"] == pytest.approx(2 / 5)
    lo, hi = f["strict_accuracy"]["ci"]
    assert lo <= 0.4 <= hi
    three = np.array([[0, 1, 2], [0, 1, 0], [1, 1, 2]])
    assert order_figures(three, [0, 1, 2], 3)["strict_accuracy"]["value"] == pytest.approx(1 / 3)


def test_label_margin_is_top_minus_second_after_normalising():
    assert label_margin([math.log(0.6), math.log(0.3), math.log(0.1)]) == pytest.approx(math.log(2))
    assert label_margin([5.0, 5.0]) == 0 and label_margin([1.0, -1.0]) == pytest.approx(2.0)
    assert label_margin([11.0, 9.0]) == pytest.approx(label_margin([1.0, -1.0]))  # any scale


# --- flips ---------------------------------------------------------------------------------------------------------

def _flip_rows() -> list[dict]:
    sure, unsure = (0.0, -3.0), (0.0, -0.2)  # margins 3 and 0.2 nats
    return [
        _row("same", 0, 0, sure), _row("same", 1, 1, sure[::-1]),  # candidate 0 both times: no flip
        _row("unread", 0, 0), _row("unread", 1, -1, cut=True),  # unread (and cut): primary unread
        _row("cut", 0, 0, cut=False), _row("cut", 1, 0, cut=True),  # slot A twice: candidates 0, 1
        _row("tie", 0, 0, unsure, chars=(10, 40)), _row("tie", 1, 0, sure, chars=(10, 40)),  # near tie and length
        _row("long", 0, 0, sure, chars=(10, 25)), _row("long", 1, 0, sure, chars=(10, 25)),
        _row("other", 0, 1, sure[::-1], chars=(10, 19)), _row("other", 1, 1, sure[::-1], chars=(10, 19)),
        _row("blank", 0, -1), _row("blank", 1, -1),  # unread in every order: no flip
    ]


def test_flips_are_classified_by_cause_with_the_primary_first():
    ids = ["same", "unread", "cut", "tie", "long", "other", "blank"]
    flips = {f["example_id"]: f for f in flip_records(_flip_rows(), [0, 1], ids, 2)}
    assert list(flips) == ["unread", "cut", "tie", "long", "other"]
    assert flips["unread"]["causes"] == ["unread", "cut"] and flips["unread"]["chosen"] == [0, -1]
    assert flips["cut"]["causes"] == ["cut"] and flips["cut"]["chosen"] == [0, 1] and flips["cut"]["margins"] == [None, None]
    assert flips["tie"]["causes"] == ["near_tie", "length"] and flips["tie"]["primary"] == "near_tie"
    assert flips["tie"]["margins"] == pytest.approx([0.2, 3.0]) and flips["tie"]["candidate_chars"] == [10, 40]
    assert flips["long"]["causes"] == ["length"] and flips["other"]["primary"] == "other"
    assert flips["other"]["choices"] == [1, 1] and flips["other"]["chosen"] == [1, 0]
    counts = flip_counts(list(flips.values()), len(ids))
    assert counts["items"] == 5 and counts["of"] == 7
    assert counts["by_cause"] == {"unread": 1, "cut": 1, "near_tie": 1, "length": 1, "other": 1}
    assert counts["any_cause"] == {"unread": 1, "cut": 2, "near_tie": 1, "length": 2, "other": 1}


def test_the_near_tie_threshold_is_a_parameter():
    ids = ["tie"]
    assert flip_records(_flip_rows(), [0, 1], ids, 2, near_tie=0.1)[0]["causes"] == ["length"]
    assert flip_records(_flip_rows(), [0, 1], ids, 2, near_tie=5)[0]["causes"] == ["near_tie", "length"]
    summary = order_summary(_flip_rows(), [0, 1], ["long", "other"], 2, near_tie=5)  # every margin (3) below 5
    assert summary["flips"]["by_cause"]["near_tie"] == 2 and summary["flips"]["near_tie_nats"] == 5


def test_format_order_prints_strict_accuracy_flips_and_bins():
    ids = ["same", "unread", "cut", "tie", "long", "other", "blank"]
    o = order_summary(_flip_rows(), [0, 1], ids, 2)
    text = "\n".join(format_order(o))
    assert "strict accuracy 0.143" in text  # only "same" is right in both orders
    assert "flips: 5 of 7 items: unread 1, cut 1, near tie 1, length 1, other 1 (primary cause)" in text
    assert "length ratio" in text and "pref. fairness" in text and "score gap" not in text


# --- bins ------------------------------------------------------------------------------------------------------------

def test_length_bins_by_hand():
    # ratio chars(candidate 0) / chars(candidate 1) per item; choices (correct first, correct second)
    rows = []
    items = [("a", (10, 40), 0, 0), ("b", (10, 30), 1, 1), ("c", (10, 10), 0, 1), ("d", (12, 10), 0, 0),
             ("e", (10, 10), 1, 1), ("f", (50, 10), 0, 1)]
    for e, chars, c0, c1 in items:
        rows += [_row(e, 0, c0, chars=chars), _row(e, 1, c1, chars=chars)]
    bins = {b["bin"]: b for b in order_summary(rows, [0, 1], [i[0] for i in items], 2)["by_length"]}
    assert list(bins) == ["<0.5", "0.5-0.8", "0.8-1.25", "1.25-2", ">=2"]
    assert {k: b["n"] for k, b in bins.items()} == {"<0.5": 2, "0.5-0.8": 0, "0.8-1.25": 3, "1.25-2": 0, ">=2": 1}
    assert bins["<0.5"]["conflict_rate"] == 1.0 and bins["<0.5"]["preference_fairness"] == 0.0  # one A-A, one B-B
    assert bins["0.8-1.25"]["conflict_rate"] == pytest.approx(2 / 3)
    assert bins["0.8-1.25"]["preference_fairness"] == pytest.approx((1 - 1) / 3)  # d primacy, e recency
    assert bins["0.5-0.8"]["conflict_rate"] is None and bins[">=2"]["conflict_rate"] == 0.0


def test_score_gap_bins_are_fixed_and_right_closed():
    ch = np.array([[0, 0], [0, 1], [1, 1], [0, 0], [1, 0]])
    out = binned(ch, [0, 1], 2, [0.0, 1.0, 1.5, 3.0, 7.0],
                 (("0", -math.inf, 0.0), ("(0,1]", 0.0, 1.0), ("(1,3]", 1.0, 3.0), (">3", 3.0, math.inf)), True)
    assert [b["n"] for b in out] == [1, 1, 2, 1]
    assert out[2]["preference_fairness"] == 0.0 and out[2]["conflict_rate"] == 1.0
    rows = [r for e, s, c in (("x", (7, 7), 0), ("y", (9, 4), 1)) for r in
            (_row(e, 0, c, candidate_scores=list(s)), _row(e, 1, c, candidate_scores=list(s)))]
    gap = {b["bin"]: b["n"] for b in order_summary(rows, [0, 1], ["x", "y"], 2)["by_score_gap"]}
    assert gap == {"0": 1, "(0,1]": 0, "(1,3]": 0, ">3": 1}


def test_conflict_by_length_for_k_options_without_fairness():
    rows = [_row("q", p, 0, chars=(4, 2, 2)) for p in range(3)]  # slot 0 always: candidates 0, 2, 1
    bins = order_summary(rows, [0, 1, 2], ["q"], 3)["by_length"]
    assert [b for b in bins if b["n"]] == [{"bin": ">=2", "n": 1, "conflict_rate": 1.0}]


# --- the task's meta and scores -------------------------------------------------------------------------------------

def test_rows_carry_candidate_lengths_and_a_judge_files_scores(tmp_path):
    path = _write(tmp_path / "s.jsonl", [{"id": "p", "question": "q", "answers": ["short", "a longer answer"],
                                           "preferred": 1, "scores": [3, 8.5]}])
    task = get_task(f"judge:{path}")
    meta = task.prompt(task.examples(1)[0], 1).meta
    assert meta == {"candidate_chars": [15, 5], "candidate_scores": [8.5, 3.0]}  # candidate order: preferred first
    assert "candidate_scores" not in get_task("mc-kv", **KV).build(get_task("mc-kv", **KV).examples(1)[0], 0).meta


@pytest.mark.parametrize("style, rec, message", [
    ("judge", {"question": "q", "answers": ["a", "b"], "scores": [1]}, "'scores' must be a list of 2 numbers"),
    ("judge", {"question": "q", "answers": ["a", "b"], "scores": [1, "x"]}, "'scores' must be a list of 2 numbers"),
    ("judge", {"question": "q", "answers": ["a", "b"], "scores": [True, 2]}, "'scores' must be a list of 2 numbers"),
    ("mc", {"question": "q", "options": ["a", "b"], "gold": 0, "scores": [1, 2]}, "judge files only"),
])
def test_bad_scores_are_refused_in_one_line(tmp_path, style, rec, message):
    with pytest.raises(PosbiasError, match=message) as e:
        get_task(f"{style}:{_write(tmp_path / 'f.jsonl', [rec])}")
    assert "\n" not in str(e.value)


# --- flips.jsonl in a sweep ------------------------------------------------------------------------------------------

def test_flips_jsonl_is_written_owned_and_rewritten_on_resume(loaded, tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"id": f"p{i}", "question": f"What is {i} plus {i}?",
                                           "answers": [f"It is {2 * i}.", f"{2 * i + 1}" + " indeed" * (i % 3)],
                                           "preferred": 0, "scores": [8, 8 - i]} for i in range(6)])
    cfg = SweepConfig(task=f"judge:{path}", n=6)
    out = tmp_path / "s"
    res = run_sweep(cfg, out, loaded=loaded, progress=False)
    o = res.summary["order"]
    logged = [json.loads(x) for x in (out / "flips.jsonl").read_text().splitlines()]
    assert len(logged) == o["flips"]["items"] == sum(o["flips"]["by_cause"].values())
    assert logged == json.loads(json.dumps(flip_records(res.rows, [0, 1], [e.id for e in get_task(cfg.task).examples(6)], 2)))
    assert sum(b["n"] for b in o["by_length"]) == 6 and sum(b["n"] for b in o["by_score_gap"]) == 6
    assert "strict_accuracy" in o and "flips:" in res.format()
    first = (out / "flips.jsonl").read_text()
    (out / "flips.jsonl").write_text("stale\n")
    run_sweep(cfg, out, loaded=loaded, resume=True, progress=False)
    assert (out / "flips.jsonl").read_text() == first  # the resumed sweep writes it again
    assert "flips.jsonl" in SWEEP_FILES  # owned: a new run into the folder removes it
    run_sweep(SweepConfig(task_options={"facts": 3}, n=1, positions="0"), out, loaded=loaded, overwrite=True, progress=False)
    assert not (out / "flips.jsonl").exists()


def test_the_report_shows_the_flips_table(loaded, tmp_path):
    out = tmp_path / "s"
    res = run_sweep(SweepConfig(task="judge-kv", task_options=KV, n=4), out, loaded=loaded, progress=False)
    page = build_report([out], tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert page.sections == 1 and "primary cause" in html and "strict accuracy" in html
    if res.summary["order"]["flips"]["items"]:
        assert "candidate chosen per order" in html


# --- the adaptive swap -----------------------------------------------------------------------------------------------

def _random_rows(n: int, k: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        for p in range(k):
            lp = rng.normal(size=k) * 1.5
            rows.append(_row(f"i{i}", p, int(np.argmax(lp)), lp.tolist()))
    return rows


def _item(e: str, first: int, by_order: dict[int, list[float]]) -> list[dict]:
    """An item's two rows from each order's logprobs over the candidates (k = 2): slot s holds candidate (s - p) % 2."""
    rows = []
    for p, cand in by_order.items():
        slots = [cand[(s - p) % 2] for s in range(2)]
        rows.append(_row(e, p, int(np.argmax(slots)), slots))
    return rows


def test_the_first_order_is_balanced_reproducible_and_blind_to_the_gold():
    ids = [f"i{j}" for j in range(101)]
    shown = first_placements(ids, 3)
    assert sorted(np.bincount(list(shown.values())).tolist()) == [33, 34, 34]
    assert shown == first_placements(list(reversed(ids)), 3)
    # a judge that always names slot A: placement 0 would make it always right; the drawn orders, about 1/k
    always_a = [_row(e, p, 0, [0.0, -5.0]) for e in ids[:100] for p in range(2)]
    _, rec = AdaptiveSwap(1.0).decide(always_a, [], 2)
    assert rec["early_stop_share"] == 1.0 and rec["accuracy"] == pytest.approx(0.5) and rec["first_placements"] == [50, 50]


@pytest.mark.parametrize("k", [2, 4])
def test_aswap_at_zero_is_the_first_order_and_at_inf_the_swap(k):
    rows = _random_rows(30, k)
    shown = first_placements([f"i{i}" for i in range(30)], k)
    zero, rec0 = AdaptiveSwap(0.0).decide(rows, [], k)
    first = {r["example_id"]: (r["choice"] - r["position"]) % k for r in rows if r["position"] == shown[r["example_id"]]}
    assert all(r["choice"] == (first[r["example_id"]] + r["position"]) % k for r in zero)
    assert rec0["forward_passes_per_verdict"] == 1 and rec0["early_stop_share"] == 1.0
    assert rec0["accuracy"] == pytest.approx(np.mean([first[e] == 0 for e in first]))
    full, rec = AdaptiveSwap(math.inf).decide(rows, [], k)
    swapped, _ = Swap().decide(rows, [], k)
    assert [r["choice"] for r in full] == [r["choice"] for r in swapped]
    assert rec["forward_passes_per_verdict"] == k and rec["early_items"] == 0 and rec["agreement_with_swap"] == 1.0
    assert rec["early_agreement"] is None and rec["accuracy"] == rec["swap_accuracy"]


def test_aswap_in_between_by_hand():
    # logprobs of (candidate 0, candidate 1) in each order; the first order's margin decides who stops
    shown = first_placements(["a", "b", "c"], 2)
    other = {e: 1 - p for e, p in shown.items()}
    rows = (_item("a", shown["a"], {shown["a"]: [0.0, -2.0], other["a"]: [0.0, -1.0]})  # margin 2: stops, says 0 = swap
            + _item("b", shown["b"], {shown["b"]: [-1.5, 0.0], other["b"]: [0.0, -3.0]})  # 1.5: stops, says 1; swap 0
            + _item("c", shown["c"], {shown["c"]: [-0.3, 0.0], other["c"]: [0.0, -2.0]}))  # 0.3: the swap decides, 0
    out, rec = AdaptiveSwap(1.0).decide(rows, [], 2)
    verdict = {r["example_id"]: (r["choice"] - r["position"]) % 2 for r in out}
    assert verdict == {"a": 0, "b": 1, "c": 0}
    assert rec["forward_passes_per_verdict"] == pytest.approx(round((1 + 1 + 2) / 3, 4))
    assert rec["early_items"] == 2 and rec["early_stop_share"] == pytest.approx(2 / 3)
    assert rec["early_agreement"] == 0.5 and rec["agreement_with_swap"] == pytest.approx(2 / 3)
    assert rec["accuracy"] == pytest.approx(2 / 3) and rec["swap_accuracy"] == 1.0
    assert all("raw_choice" in r for r in out)
    _, strict = AdaptiveSwap(1.6).decide(rows, [], 2)  # b's margin 1.5 no longer stops it
    assert strict["early_items"] == 1 and strict["early_agreement"] == 1.0 and strict["accuracy"] == 1.0
    # the record's table: what other thresholds would have done on the same rows (margins 2, 1.5, 0.3)
    table = {t["threshold"]: t for t in rec["thresholds"]}
    assert table[0.25]["early_stop_share"] == 1 and table[0.25]["early_agreement"] == pytest.approx(1 / 3)  # c says 1
    assert table[1.0]["forward_passes_per_verdict"] == rec["forward_passes_per_verdict"]
    assert table[2.0]["early_stop_share"] == pytest.approx(1 / 3) and table[2.0]["early_agreement"] == 1.0
    assert table[4.0]["early_agreement"] is None and table[4.0]["forward_passes_per_verdict"] == 2


def test_aswap_with_generated_verdicts_trusts_a_read_uncut_first_verdict():
    shown = first_placements(["a", "b", "c"], 2)

    def gen(e, cand_first, cand_other, cut_first=False):  # the candidate each order names (-1 unread)
        p = shown[e]
        slot = lambda c, q: -1 if c < 0 else (c + q) % 2  # noqa: E731
        return [_row(e, p, slot(cand_first, p), cut=cut_first), _row(e, 1 - p, slot(cand_other, 1 - p), cut=False)]

    rows = gen("a", 1, 0) + gen("b", 1, 0, cut_first=True) + gen("c", -1, 1)  # read / cut / unread first verdicts
    out, rec = AdaptiveSwap(5.0).decide(rows, [], 2)
    verdict = {r["example_id"]: (r["choice"] - r["position"]) % 2 if r["choice"] >= 0 else -1 for r in out}
    assert verdict == {"a": 1, "b": -1, "c": -1}  # a stops on its first verdict; b and c go to the vote: a tie, unread
    assert rec["early_items"] == 1 and rec["no_verdict_items"] == 2
    _, full = AdaptiveSwap(math.inf).decide(rows, [], 2)
    assert full["early_items"] == 0 and full["forward_passes_per_verdict"] == 2


def test_aswap_spec_forms_and_bad_thresholds():
    assert get_method("aswap").config() == {"name": "aswap", "threshold": 1.0}
    assert get_method("aswap:0.5").threshold == 0.5 and get_method("aswap:threshold=2").threshold == 2.0
    assert get_method("aswap:inf").threshold == math.inf
    for bad in ("aswap:-1", "aswap:nan", "aswap:soon", "aswap:threshold=soon"):
        with pytest.raises(PosbiasError) as e:
            get_method(bad)
        assert "\n" not in str(e.value) and e.value.fix


def test_aswap_in_a_comparison(model_dir, tmp_path):
    cfg = SweepConfig(model=str(model_dir), task="judge-kv", task_options=KV, n=6, dtype="fp32")
    res = run_compare(cfg, ["none", "swap", "aswap:0.5"], tmp_path / "c", progress=False)
    none, swap, aswap = res.entries
    dec = aswap["summary"]["decision"]
    assert dec["rule"] == "aswap" and 1 <= dec["forward_passes_per_verdict"] <= 3
    assert dec["forward_passes_per_verdict"] == pytest.approx(round(1 + 2 * (1 - dec["early_stop_share"]), 4))
    assert aswap["summary"]["order"]["consistency"]["value"] == 1.0  # one candidate per item in every order
    text = res.format()
    assert "strict accuracy" in text and f"{dec['forward_passes_per_verdict']:g}" in text
    sweep_text = run_sweep(SweepConfig(model=str(model_dir), task="judge-kv", task_options=KV, n=6, dtype="fp32",
                                       method="aswap:0.5"), progress=False).format()
    assert "stopped early on" in sweep_text
