"""Order bias: what a judge or multiple-choice model picks as the order of its candidates changes.

The design (tasks/order.py): an item has k candidates, candidate 0 the correct one; placement p shows them in
the cyclic order that puts the correct one in slot p, so slot s holds candidate (s - p) mod k. For k = 2 this
is the swap of MT-Bench and FairEval; for k options the cyclic permutations PriDe averages over. A row's
`choice` is the slot it picked, -1 when no option could be read from a generated verdict (unread), -2 (TIE) when a
judge template's tie label was read: a verdict, read, naming neither slot (right nowhere, consistent with another
tie, neither primacy nor recency).

Figures (each a mean over items with its 95% interval, `order_figures`; rstd without one):
  consistency          share of items whose chosen candidate is the same under every order shown (items with
                       an unread verdict left out, as "Judging the Judges" leaves out failed extractions)
  conflict_rate        share of (item, pair of orders) whose choices differ (FairEval's conflict rate; for
                       k = 2 it is 1 - consistency)
  preference_fairness  k = 2 only. "Judging the Judges" (Shi et al.), authors' code: primacy-preferred pairs P
                       (slot A chosen in both orders), recency-preferred R (slot B in both), raw score
                       R * R/(P+R) - P * P/(P+R), rescaled from [-n, n] (n pairs) to [-1, 1]: which is (R - P) / n.
                       0 = fair, -1 = always the first, +1 = always the last.
  rstd                 PriDe's RStd: the standard deviation of the recall of each option label; the gold sits
                       under label s exactly when it is placed at slot s, so this is the std of accuracy by slot
  strict_accuracy      CircularEval (OpenCompass, MMBench): share of items right under every order shown (an
                       unread verdict counts as wrong); the per-slot accuracy curve beside it is the lenient view
  choice_share         how often each slot is chosen (all rows; an unbiased model chooses each 1/k of the time)
`label_margin`: how decided one teacher-forced verdict is (top label minus the second, in nats).
PriDe (Zheng et al., ICLR 2024): `pride_prior` (Eqs. 5-6) and `pride_choice`; balanced position calibration
(FairEval) / swap-and-average: `balanced_choice`.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from .stats import diff_ci, mean_ci

UNREAD, TIE = -1, -2  # a row's choice: no verdict read; a tie verdict (tasks/judge_template.py)


def candidate(choice: int, placement: int, k: int) -> int:
    """The candidate a choice of slot `choice` names when the correct one sits at `placement` (UNREAD and TIE stay
    as they are)."""
    return choice if choice < 0 else (choice - placement) % k


def parse_choice(text: str, labels: Sequence[str]) -> int:
    """The slot a generated verdict names: `[[X]]` (MT-Bench's format) first, else the first label standing on its
    own (not inside a word or number); -1 if none."""
    alts = "|".join(re.escape(lb) for lb in sorted(labels, key=len, reverse=True))
    for pattern in (rf"\[\[\s*({alts})\s*\]\]", rf"(?<![A-Za-z0-9])({alts})(?![A-Za-z0-9])"):
        m = re.search(pattern, text)
        if m:
            return list(labels).index(m.group(1))
    return -1


def _log_normalize(logp: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis (the option labels)."""
    m = logp.max(axis=-1, keepdims=True)
    return logp - (m + np.log(np.exp(logp - m).sum(axis=-1, keepdims=True)))


def label_margin(logp: Sequence[float]) -> float:
    """The margin of a teacher-forced verdict: the top option's log-probability minus the second's, over the k
    labels after log-normalising them (nats; 0 = a tie, large = decided)."""
    lp = np.sort(_log_normalize(np.asarray(logp, dtype=float)))
    return float(lp[-1] - lp[-2]) if len(lp) > 1 else float("inf")


def pride_prior(logp: np.ndarray) -> np.ndarray:
    """PriDe's option-ID prior from calibration items, as log-probabilities [k].

    logp [Q, P, k]: log P(label s | item q, order j) for every order j of each calibration item (any scale: they
    are normalised over the k labels here). An item's prior is the softmax of its mean log-probability over the
    orders (the content moves, the label stays; the paper's per-sample prior, the authors' debias_utils.simple:
    `softmax(np.log(observed).mean(axis=0))`); the global prior is the arithmetic mean of the items' prior
    probabilities, as the authors' code/debias_pride.py takes it (`np.mean(all_priors, axis=0)`). Until 2026-11 this
    was the softmax of the items' mean log-prior (a geometric mean), which decides 91 of 2,000 random rows
    differently (4 options, 3 calibration items, logits N(0, 2^2); tests/test_order.py)."""
    per_item = _log_normalize(_log_normalize(logp).mean(axis=1))  # [Q, k], each row a log-distribution
    return np.log(np.exp(per_item).mean(axis=0))  # [k]: the mean of the probabilities, a distribution again


def pride_choice(logp: Sequence[float], log_prior: np.ndarray) -> int:
    """PriDe's debiased choice (Eq. 7): argmax over labels of log P(label) - log prior(label)."""
    return int(np.argmax(_log_normalize(np.asarray(logp, dtype=float)) - log_prior))


def balanced_choice(placements: Sequence[int], k: int, logps: Sequence[Sequence[float]] | None = None,
                    choices: Sequence[int] | None = None) -> int:
    """The candidate chosen after seeing every order (FairEval's balanced position calibration; MT-Bench's swap).

    With logps (one list of k label logprobs per order): each candidate's mean normalised log-probability over
    the orders, the best wins. With choices only (generated verdicts): a vote over the orders; a tie for the most
    votes, or a verdict not read, is no decision (-1), as MT-Bench counts a disagreement between orders a tie."""
    if logps is not None:
        lp = _log_normalize(np.asarray(logps, dtype=float))  # [P, k]
        score = [np.mean([lp[j, (c + p) % k] for j, p in enumerate(placements)]) for c in range(k)]
        return int(np.argmax(score))
    cands = [candidate(c, p, k) for c, p in zip(choices or [], placements)]
    if UNREAD in cands or TIE in cands:  # MT-Bench: a tie in either order is a tie
        return UNREAD if UNREAD in cands else TIE
    votes = np.bincount(cands, minlength=k)
    best = np.flatnonzero(votes == votes.max())
    return int(best[0]) if len(best) == 1 else -1


def _consistency(cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per item: read (every choice read; a tie is read) and consistent (one candidate, or a tie, under every order)."""
    read = (cand != UNREAD).all(axis=1)
    return read, read & (cand == cand[:, :1]).all(axis=1)


def _conflicts(cand: np.ndarray) -> np.ndarray:
    """Per item: share of its order pairs whose (read) choices differ (NaN with no read pair)."""
    a, b = np.triu_indices(cand.shape[1], 1)
    valid = (cand[:, a] != UNREAD) & (cand[:, b] != UNREAD)  # [E, pairs]
    differ = (cand[:, a] != cand[:, b]) & valid
    with np.errstate(invalid="ignore", divide="ignore"):
        return differ.sum(axis=1) / valid.sum(axis=1)


def format_figure(fig: dict, digits: int = 3) -> str:
    """One order figure as printed: `0.620 [0.550, 0.700]`, or the value alone where it has no interval (rstd)."""
    v, ci = fig["value"], fig.get("ci")
    return f"{v:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def _per_item(choices: np.ndarray, placements: list[int], k: int) -> dict[str, np.ndarray]:
    """Each figure's per-item values (the figure is their mean): 0/1, shares in [0, 1], or -1/0/+1 for fairness;
    items a figure cannot read (an unread verdict) left out."""
    cand = np.where(choices < 0, choices, (choices - np.asarray(placements)[None, :]) % k)
    read, consistent = _consistency(cand)
    conflicts = _conflicts(cand)
    right = choices == np.asarray(placements)[None, :]  # [items, orders]
    out = {"strict_accuracy": right.all(axis=1).astype(float), "consistency": consistent[read].astype(float),
           "conflict_rate": conflicts[~np.isnan(conflicts)]}
    if k == 2 and sorted(placements) == [0, 1]:
        a = choices[:, placements.index(0)]  # the slot chosen with the correct candidate first, and second
        b = choices[:, placements.index(1)]
        # "Judging the Judges": recency-preferred (slot B both times) minus primacy-preferred (slot A both times)
        out["preference_fairness"] = ((a == 1) & (b == 1)).astype(float) - ((a == 0) & (b == 0))
    return out


def order_figures(choices: np.ndarray, placements: Sequence[int], k: int) -> dict:
    """The module's figures for a choice matrix [items, orders] (slot chosen, -1 unread), each as {"value", "ci"}:
    a mean over items with its 95% interval (core/stats: Clopper-Pearson for shares of items, Agresti-Min for fairness's
    -1/0/+1; never zero-width at a handful of items); rstd without an interval (a spread of slot accuracies is biased
    upward like the gap: the curve's position test says whether the slots differ). Plus choice_share and unread."""
    choices = np.asarray(choices, dtype=int)
    placements = list(placements)
    out = {}
    for name, vals in _per_item(choices, placements, k).items():
        interval = diff_ci if name == "preference_fairness" else mean_ci
        v = float(vals.mean()) if len(vals) else float("nan")
        out[name] = {"value": v, "ci": [float(c) for c in interval(vals)] if len(vals) else [v, v]}
    acc = (choices == np.asarray(placements)[None, :]).mean(axis=0)
    out["rstd"] = {"value": float(np.std(acc)) if len(placements) == k and len(choices) else float("nan"), "ci": None}
    flat = choices.ravel()
    out["choice_share"] = [float((flat == s).mean()) for s in range(k)]
    out["unread"] = float((flat == UNREAD).mean())
    if (flat == TIE).any():  # a template with a tie label: the share of tie verdicts
        out["tie"] = float((flat == TIE).mean())
    return out


def format_no_gold(s: dict) -> list[str]:
    """The summary of a judge file without "preferred" (sweep's `measure` "picks answers[0]"): the rate of choosing
    answers[0] over every order (the model's lean towards it, the order balanced out) and the gap between the slots
    (the order effect: 0 without order bias); no chance level, best or worst, as nothing is right."""
    ci = lambda c: f" [{c[0]:.3f}, {c[1]:.3f}]" if c else ""  # noqa: E731 - two uses
    return [f"picks answers[0] {s['average']:.3f}{ci(s.get('average_ci'))} over every order (its lean towards "
            f"answers[0]) | gap between slots {s['gap']:.3f}{ci(s.get('gap_ci'))} (no order bias: 0)",
            f"values: {s['measure']}, the rate of choosing the file's first answer with it in each slot (the file names "
            "no preferred answer, so nothing here is accuracy)"]
