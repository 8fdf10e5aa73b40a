"""Judges in practice: what a sweep of an order task reports beyond the order figures' headline (core/order.py).

  strict_accuracy  CircularEval (OpenCompass): an item counts as right only if it is right under every order shown
                   (core.order's figures, each with its 95% interval); the accuracy-by-slot curve is printed beside it.
  flips            every item whose verdict is not the same under every order (an unread verdict, -1, counting as a
                   verdict of its own; an item unread under every order is no flip), with the causes that can explain
                   it, checked in the order of CAUSES; the first that holds is its primary cause:
                     unread    some order's verdict could not be read (choice -1)
                     cut       some order's generated verdict reached the token limit (row["cut"])
                     near_tie  teacher-forced: in some order the label margin (core.order.label_margin: the top
                               normalised label log-probability minus the second) is below `near_tie` nats (0.5)
                     length    the longest candidate has at least LONGER (2) times the characters of the shortest
                     other     none of these: a confident, read verdict that changed with the order (with two
                               candidates: the same slot chosen in both orders, the position bias itself)
                   The verdicts are those the figures count: a decision rule's where the sweep ran one (a swap's are
                   the same in every order, so it has no flips); margins and cuts are the model's own rows.
                   summary["order"]["flips"] = {"items", "of", "by_cause" (primary causes, summing to items),
                   "any_cause" (every cause that holds), "near_tie_nats", "longer_ratio"}; flips.jsonl in the sweep's
                   folder lists each flip (`write_flips`).
  by_length        the conflict rate (any k) and preference fairness (k = 2) by bins of the length ratio
                   chars(candidate 0) / chars(candidate 1) (k > 2: over the mean of the other candidates), candidate 0
                   the correct (preferred) one: LENGTH_BINS, each [lo, hi). A list of {"bin", "n", figures...};
                   point values, n says how far to trust them.
  by_score_gap     the same by |score 0 - score 1| where a judge file gives "scores" (k = 2): fixed bins GAP_BINS on the
                   scores' own scale (made for MT-Bench's 1-10 grades), each (lo, hi]: 0, (0,1], (1,3], >3.
The rows carry candidate_chars and candidate_scores (OrderTask.build's Prompt.meta); rows of older runs lack them,
and then the length cause and the bins are left out.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.order import UNREAD, candidate, format_figure, label_margin, order_figures
from ..runs import RunFolder, write_jsonl_atomic
from ..tasks import placement_key
from ..tasks.order import LABELS

UNREAD_LIMIT = 0.2  # above this share of verdicts unread, nothing is printed as measured (docs/order-bias.md)
NEAR_TIE = 0.5  # nats: a label margin below it is a near tie
LONGER = 2.0  # longest / shortest candidate in characters at or above it: a length cause
CAUSES = ("unread", "cut", "near_tie", "length", "other")
LENGTH_BINS = (("<0.5", 0.0, 0.5), ("0.5-0.8", 0.5, 0.8), ("0.8-1.25", 0.8, 1.25), ("1.25-2", 1.25, 2.0),
               (">=2", 2.0, math.inf))  # lo <= ratio < hi
GAP_BINS = (("0", -math.inf, 0.0), ("(0,1]", 0.0, 1.0), ("(1,3]", 1.0, 3.0), (">3", 3.0, math.inf))  # lo < gap <= hi
FLIPS_FILE = "flips.jsonl"
GOLD_FIGURES = ("strict_accuracy", "rstd")  # figures that need a right answer (left out without one)


def _items(rows: list[dict], positions: list, example_ids: list[str]) -> list[tuple[str, list[dict]]]:
    """(example id, its rows in the order of `positions`) per item."""
    by_key = {(r["example_id"], placement_key(r["position"])): r for r in rows}
    return [(e, [by_key[(e, placement_key(p))] for p in positions]) for e in example_ids]


def order_summary(rows: list[dict], positions: list, example_ids: list[str], k: int, near_tie: float = NEAR_TIE,
                  gold: bool = True) -> dict:
    """summary["order"]: core.order.order_figures of the rows' choices (item by placement), the flips counted by
    cause, and the figures by length ratio and by score gap where the rows carry them. gold=False (a judge file
    without "preferred"): candidate 0 is only answers[0], so the figures of a right answer (strict accuracy, RStd:
    the spread of accuracy by slot) are left out."""
    items = _items(rows, positions, example_ids)
    choices = np.array([[r.get("choice", -1) for r in rs] for _, rs in items], dtype=int).reshape(len(items), len(positions))
    out = order_figures(choices, positions, k)
    if not gold:
        out = {key: v for key, v in out.items() if key not in GOLD_FIGURES}
    out["flips"] = flip_counts(_flips(items, positions, k, near_tie), len(items), near_tie)
    chars = [rs[0].get("candidate_chars") for _, rs in items]
    if items and all(chars):
        out["by_length"] = binned(choices, positions, k, [_ratio(c) for c in chars], LENGTH_BINS, False)
    scores = [rs[0].get("candidate_scores") for _, rs in items]
    if k == 2 and items and all(s is not None for s in scores):
        out["by_score_gap"] = binned(choices, positions, k, [abs(s[0] - s[1]) for s in scores], GAP_BINS, True)
    return out


def _ratio(chars: list[int]) -> float:
    """chars(candidate 0) / the others' mean; an empty response (0 characters, a judge file may hold one) against a
    non-empty one is 0 or inf, in the outer bins."""
    rest = float(np.mean(chars[1:]))
    return chars[0] / rest if rest else math.inf


def flip_records(rows: list[dict], positions: list, example_ids: list[str], k: int,
                 near_tie: float = NEAR_TIE) -> list[dict]:
    """One record per flipped item (module docstring), in the order of `example_ids`."""
    return _flips(_items(rows, positions, example_ids), positions, k, near_tie)


def _flips(items: list[tuple[str, list[dict]]], positions: list, k: int, near_tie: float) -> list[dict]:
    return [f for e, rs in items if (f := _flip(e, rs, positions, k, near_tie)) is not None]


def _flip(example_id: str, rs: list[dict], positions: list, k: int, near_tie: float) -> dict | None:
    choices = [int(r.get("choice", -1)) for r in rs]
    chosen = [candidate(c, p, k) for c, p in zip(choices, positions)]
    if len(set(chosen)) == 1:
        return None
    margins = [label_margin(r["option_logprobs"]) if "option_logprobs" in r else None for r in rs]
    chars = rs[0].get("candidate_chars")
    hits = {"unread": -1 in chosen, "cut": any(bool(r.get("cut")) for r in rs),
            "near_tie": any(m is not None and m < near_tie for m in margins),
            "length": bool(chars) and max(chars) >= LONGER * min(chars)}
    causes = [c for c in CAUSES if hits.get(c)] or ["other"]
    rec = {"example_id": example_id, "positions": list(positions), "choices": choices, "chosen": chosen,
           "causes": causes, "primary": causes[0],
           "margins": [None if m is None else round(m, 4) if math.isfinite(m) else str(m) for m in margins],
           "candidate_chars": chars}
    if rs[0].get("candidate_scores") is not None:
        rec["candidate_scores"] = rs[0]["candidate_scores"]
    return rec


def flip_counts(flips: list[dict], n_items: int, near_tie: float = NEAR_TIE) -> dict:
    """summary["order"]["flips"]: how many items flipped, by primary cause and by every cause that holds."""
    return {"items": len(flips), "of": n_items, "by_cause": {c: sum(f["primary"] == c for f in flips) for c in CAUSES},
            "any_cause": {c: sum(c in f["causes"] for f in flips) for c in CAUSES},
            "near_tie_nats": near_tie, "longer_ratio": LONGER}


def binned(choices: np.ndarray, positions: list, k: int, values, bins, right_closed: bool) -> list[dict]:
    """The conflict rate (and for k = 2 preference fairness) of the items whose value falls in each bin: [lo, hi),
    or (lo, hi] with right_closed; None where a bin is empty."""
    v = np.asarray(values, dtype=float)
    out = []
    for name, lo, hi in bins:
        inside = (v > lo) & (v <= hi) if right_closed else (v >= lo) & ((v < hi) | ((v == hi) & (hi == math.inf)))
        row: dict = {"bin": name, "n": int(inside.sum())}
        f = order_figures(choices[inside], positions, k) if inside.any() else {}
        for key in ("conflict_rate",) + (("preference_fairness",) if k == 2 else ()):
            value = f.get(key, {}).get("value")
            row[key] = None if value is None or value != value else value
        out.append(row)
    return out


def write_flips(folder: RunFolder, record: dict, rows: list[dict]) -> None:
    """flips.jsonl in a finished order sweep's folder, written atomically (a resumed sweep writes it again)."""
    positions = record["config"]["positions_resolved"]
    ids = list(dict.fromkeys(r["example_id"] for r in rows))
    near = record["summary"]["order"].get("flips", {}).get("near_tie_nats", NEAR_TIE)
    write_jsonl_atomic(folder.file(FLIPS_FILE), flip_records(rows, positions, ids, record["task"]["n_slots"], near))


def unread_record(rows: list[dict], positions: list, task) -> dict | None:
    """summary["unread"] for an order sweep with verdicts it could not read (None without): how many of how many,
    by slot (in `positions` order), whether the run counts as measured (share <= UNREAD_LIMIT), the labels and the
    verdict pattern the prompt asks for, and one unread reply."""
    missing = [r for r in rows if r.get("choice", UNREAD) == UNREAD]
    if not missing:
        return None
    tpl = getattr(task, "template", None)
    named = task.config().get("labels")  # a file's or template's own labels, or the name of a label set
    labels = list(named) if isinstance(named, (list, tuple)) else list(LABELS.get(named, ()))[: task.n_slots]
    by_slot = [sum(placement_key(r["position"]) == placement_key(p) for r in missing) for p in positions]
    return {"verdicts": len(missing), "of": len(rows), "share": len(missing) / len(rows), "limit": UNREAD_LIMIT,
            "measured": len(missing) / len(rows) <= UNREAD_LIMIT, "by_slot": by_slot, "labels": labels,
            "verdict": tpl.verdict if tpl is not None else None, "tie": tpl.tie if tpl is not None else None,
            "example": str(missing[0].get("prediction", ""))[:80]}


def unread_lines(u: dict | None) -> list[str]:
    """The first line(s) of a sweep's printout when verdicts went unread: how many, what the prompt asks for, a
    reply, and the fix; above the limit, that nothing below is measured."""
    if not u:
        return []
    labels = [*u["labels"], *([u["tie"]] if u["tie"] else [])]
    asks = ", ".join(u["verdict"].replace("{label}", lb) for lb in labels) if u["verdict"] else " or ".join(labels)
    head = (f"{u['verdicts']} of {u['of']} verdicts could not be read ({u['share']:.0%}): the replies name none of "
            f"{asks} (one reply: {u['example']!r})")
    fix = ("use --engine teacher-forced (it scores the labels where the prompt asks for them), or a template whose "
           "\"verdict\" pattern and \"max_new_tokens\" fit the replies (docs/order-bias.md)")
    if u["measured"]:
        return [f"warning: {head} -- {fix}"]
    return [f"NOT MEASURED: {head}; above {u['limit']:.0%} unread, no average, gap, position test or order figure "
            f"is printed -- {fix}"]


def not_measured(u: dict) -> list[str]:
    """What stands in place of the figures of a run above the unread limit."""
    return [f"average, best, worst, gap, position test: not measured ({u['verdicts']} of {u['of']} verdicts unread)",
            f"order figures (consistency, conflict rate, fairness, flips): not measured ({u['verdicts']} of {u['of']} "
            "verdicts unread)"]


# ----------------------------------------------------------------------------- printing


def format_order(o: dict, decision: dict | None = None, gold: bool = True, orders: int | None = None) -> list[str]:
    """The order figures (core/order.py) with their 95% CIs, the choice share per slot, the flips by cause, the
    figures by length ratio and score gap, and a decision's cost (and an adaptive swap's early stops). gold=False:
    a judge file without "preferred", whose candidate 0 is answers[0] (no figure of a right answer is printed).
    orders: how many placements the sweep scored; with every one of the k, an even choice share is the mark of no
    order bias (each candidate visits each slot once), and the line says so."""
    names = (("strict_accuracy", "strict accuracy"), ("consistency", "consistency"), ("conflict_rate", "conflict rate"),
             ("preference_fairness", "preference fairness"), ("rstd", "RStd"))
    figs = [f"{text} {format_figure(o[k])}" for k, text in names
            if k in o and o[k]["value"] == o[k]["value"] and (gold or k not in GOLD_FIGURES)]  # NaN: not defined here
    shares = " ".join(f"{s}:{v:.2f}" for s, v in enumerate(o["choice_share"]))
    k = len(o["choice_share"])
    even = f" (no order bias: {1 / k:.2f} each)" if orders == k else ""
    ties = f" | ties {o['tie']:.3f}" if "tie" in o else ""  # a template's tie label, read
    out = ["order: " + " | ".join(figs), f"chosen by slot: {shares}{even} | unread verdicts {o['unread']:.3f}{ties}"]
    out += _flip_line(o.get("flips"))
    ratio = "candidate 0 / 1" if gold else "answers[0] / answers[1]"
    for key, what in (("by_length", f"length ratio (chars, {ratio})"), ("by_score_gap", "|score gap|")):
        out += _bin_table(o[key], what) if o.get(key) else []
    return out + (_decision_lines(decision) if decision else [])


def _flip_line(flips: dict | None) -> list[str]:
    if not flips:
        return []
    causes = ", ".join(f"{c.replace('_', ' ')} {n}" for c, n in flips["by_cause"].items() if n)
    return [f"flips: {flips['items']} of {flips['of']} items" + (f": {causes} (primary cause)" if causes else "")]


def _bin_table(bins: list[dict], what: str) -> list[str]:
    fair, w = "preference_fairness" in bins[0], max(38, len(what))
    lines = [f"  {what:<{w}} {'n':>5}  {'conflict':>8}" + (f"  {'pref. fairness':>14}" if fair else "")]
    cell = lambda v, w: f"{v:>{w}.3f}" if v is not None else f"{'-':>{w}}"  # noqa: E731 - two uses
    for b in bins:
        lines.append(f"  {b['bin']:<{w}} {b['n']:>5}  {cell(b['conflict_rate'], 8)}"
                     + (f"  {cell(b['preference_fairness'], 14)}" if fair else ""))
    return lines


def _decision_lines(decision: dict) -> list[str]:
    cost = f"{decision['forward_passes_per_verdict']} forward pass(es) per verdict"
    if "calibration_forward_passes" in decision:
        cost += f" + {decision['calibration_forward_passes']} on calibration items"
    prior = f" | prior by slot {' '.join(f'{p:.2f}' for p in decision['prior'])}" if "prior" in decision else ""
    out = [f"decision {decision['rule']}: {cost}{prior}"]
    if decision.get("rule") == "aswap" and decision.get("items"):
        d = decision
        rate = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731 - five uses
        out.append(f"  margin >= {d['threshold']:g} nats stopped early on {d['early_items']} of {d['items']} items "
                   f"({rate(d['early_stop_share'])}); agreement with the full swap {rate(d['early_agreement'])} on them, "
                   f"{rate(d['agreement_with_swap'])} on all; accuracy {rate(d['accuracy'])} (swap {rate(d['swap_accuracy'])})")
    return out
