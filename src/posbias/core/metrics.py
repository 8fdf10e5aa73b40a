"""Answer metrics and curve statistics (pure Python/numpy).

`normalize_answer` and `best_subspan_em` follow the *Lost in the Middle* study
(Liu et al., 2023), which takes the normalisation of the SQuAD evaluation script.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .stats import ALPHA, diff_ci, diff_se, format_p, gap_interval, mean_ci, position_test, z_of

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower-case, strip punctuation, drop the articles a/an/the, collapse white space."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def first_line(prediction: str) -> str:
    """The study scores the prediction cut at its first newline."""
    return prediction.split("\n", 1)[0]


def best_subspan_em(prediction: str, answers: Sequence[str]) -> bool:
    """True iff some normalised gold answer is a substring of the normalised prediction."""
    pred = normalize_answer(first_line(prediction))
    return any(normalize_answer(a) in pred for a in answers)


def substring_match(prediction: str, answers: Sequence[str]) -> bool:
    """KV retrieval metric of the study: the gold value occurs in the (first line of the) answer."""
    pred = first_line(prediction)
    return any(a in pred for a in answers)


# Pos2Distill's reasoning template ends with "The answer is:" (App. C, Table 7): the explicit marker, colon included
# (markdown emphasis may sit between "is" and the colon), in any case. A colon-less "the answer is ..." is prose.
_ANSWER = re.compile(r"the answer is\s*[*_]*\s*:", re.IGNORECASE)
_LAYOUT = "*_#>` \t"  # markdown emphasis, heading, quote and code marks around an answer line


def final_answer(prediction: str) -> str | None:
    """The answer after the last "The answer is:" (any case): its first non-empty line, wherever the model put it
    (the same line, or a later one after blank lines), with markdown marks (**, __, #, >, `) and spaces stripped
    from both ends. None if the marker is absent; "" if nothing follows it."""
    hits = list(_ANSWER.finditer(prediction))
    if not hits:
        return None
    lines = (line.strip(_LAYOUT) for line in prediction[hits[-1].end():].splitlines())
    return next((line for line in lines if line), "")


def reasoning_em(prediction: str, answers: Sequence[str]) -> bool:
    """Pos2Distill App. C: exact match (normalised) of the part after the last "The answer is:" with a gold answer."""
    ans = final_answer(prediction)
    return bool(ans) and normalize_answer(ans) in {normalize_answer(a) for a in answers}


def subspan(prediction: str, answers: Sequence[str]) -> bool:
    """Retrieval-style score of a multi-line answer: a normalised gold answer occurs in the normalised whole text."""
    pred = normalize_answer(prediction)
    return any(normalize_answer(a) in pred for a in answers)


def ruler_all(prediction: str, answers: Sequence[str]) -> bool:
    """RULER's match for several asked values (multi-value / multi-query needles), all-or-nothing: every value occurs
    in the answer, a case-insensitive substring with no punctuation stripped, so "1,234,567" does not hold 1234567
    (NVIDIA/RULER string_match_all; its partial credit, the share found, is kept beside: tasks/haystack.py)."""
    pred = prediction.lower()
    return all(a.lower() in pred for a in answers)


METRICS = {"best_subspan_em": best_subspan_em, "substring": substring_match, "reasoning_em": reasoning_em,
           "subspan": subspan, "ruler_all": ruler_all}


@dataclass(frozen=True)
class CurveSummary:
    average: float
    best: float
    best_position: int | str  # a slot, or "i:j" for a two-hop placement
    worst: float
    worst_position: int | str
    gap: float
    std: float
    gap_ci: tuple[float, float]
    average_ci: tuple[float, float] = (float("nan"), float("nan"))
    best_ci: tuple[float, float] = (float("nan"), float("nan"))
    worst_ci: tuple[float, float] = (float("nan"), float("nan"))
    position_test: dict | None = None

    def as_dict(self) -> dict:
        d = self.__dict__.copy()
        for key in ("gap_ci", "average_ci", "best_ci", "worst_ci"):
            d[key] = list(d[key])
        return d


def summarize_curve(positions: Sequence[int], correct: np.ndarray, seed: int = 0) -> CurveSummary:
    """Summary of a paired accuracy curve (core/stats.py says how each interval is built and docs/statistics.md
    what it covers).

    correct: [n_examples, n_positions] 0/1 (or scores in [0, 1]); column j is position positions[j].
    gap = best - worst observed slot (biased upward: on a flat curve it is the noise's range) and gap_ci an interval
    for the largest TRUE slot difference (simultaneous paired intervals over all slot pairs); best_ci / worst_ci the
    true accuracy of the slot observed best (worst): Clopper-Pearson at the Bonferroni level 1 - ALPHA/k, so that all
    k slots' intervals hold together at 95% and the one the data selected holds with them (a selected slot's own
    95% interval covered its truth 62% of the time on flat curves at 20 slots and 20 examples); average_ci the average's (mean of each example's average over slots, what the
    chance-aware collapse rule reads); position_test whether the slots differ at all (the test the policy's
    `separable`, the shape and the reports read); std the population std of the per-position accuracies.
    """
    correct = np.asarray(correct, dtype=float)
    acc = correct.mean(axis=0)
    b, w = int(np.argmax(acc)), int(np.argmin(acc))
    slot_ci = lambda j: selected_ci(correct, j)  # noqa: E731 - simultaneous over the k slots
    return CurveSummary(
        average=float(acc.mean()),
        best=float(acc[b]),
        best_position=_label(positions[b]),
        worst=float(acc[w]),
        worst_position=_label(positions[w]),
        gap=float(acc[b] - acc[w]),
        std=float(acc.std()),
        gap_ci=gap_interval(correct),
        average_ci=mean_ci(correct.mean(axis=1)),
        best_ci=slot_ci(b),
        worst_ci=slot_ci(w),
        position_test=position_test(correct, seed=seed),
    )


def selected_ci(correct: np.ndarray, j: int) -> tuple[float, float]:
    """An interval for slot j's true accuracy that holds although j was selected from the same data (the best or the
    worst observed slot): each slot's interval (Clopper-Pearson for 0/1 outcomes) at 1 - ALPHA/k, simultaneous over
    the k slots by Bonferroni, so that whichever slot is selected its interval holds with the others."""
    correct = np.asarray(correct, dtype=float)
    return mean_ci(correct[:, j], z_of(ALPHA / correct.shape[1]))


def curve_shape(slots: Sequence[int], correct: np.ndarray, test: dict | None = None, seed: int = 0) -> dict | None:
    """The shape of a depth curve: primacy, recency, U, middle (the inverse of U), uneven, or flat.

    slots: the curve's slots (at least 3; their order in `correct`'s columns); correct: [n_examples, n_slots].
    Flat unless the position test (`test`, computed when not given) finds a difference between slots (p < ALPHA):
    the shape's false-call rate on a flat curve is the test's level. Then, per example, `first` is the outcome at
    the lowest slot minus the mean over the interior slots, `last` the same for the highest slot, each with a
    paired interval (diff_ci) at 1 - ALPHA/2 (Bonferroni over the two edges). An edge is "up" when its interval lies
    above 0, "down" when below. U: both up; primacy / recency: that edge up, the other not; middle: both down;
    uneven: slots differ but not by this edge pattern (one edge down alone, or a difference inside). None for fewer
    than 3 slots or slots without a depth order (two-hop pairs).
    """
    if len(slots) < 3 or not all(isinstance(x, (int, np.integer)) for x in slots):
        return None
    correct = np.asarray(correct, dtype=float)[:, np.argsort(slots)]
    test = test or position_test(correct, seed=seed)
    interior = correct[:, 1:-1].mean(axis=1)
    z = z_of(ALPHA / 2)
    out, way = {}, {}
    for name, d in {"first": correct[:, 0] - interior, "last": correct[:, -1] - interior}.items():
        lo, hi = diff_ci(d, z)
        out[name] = {"difference": float(d.mean()), "ci": [float(lo), float(hi)]}
        way[name] = "up" if lo > 0 else "down" if hi < 0 else ""
    ups = {k for k, v in way.items() if v == "up"}
    if test["p"] >= ALPHA:
        shape = "flat"
    else:
        shape = ("U" if len(ups) == 2 else "primacy" if ups == {"first"} else "recency" if ups == {"last"}
                 else "middle" if set(way.values()) == {"down"} else "uneven")
    return {"shape": shape, "p": test["p"], **out}


def format_shape(shape: dict) -> str:
    """One line: the shape and its two edge contrasts with their intervals (97.5% each: two edges)."""
    part = lambda k: f"{k} - interior {shape[k]['difference']:+.3f} [{shape[k]['ci'][0]:+.3f}, {shape[k]['ci'][1]:+.3f}]"  # noqa: E731
    return f"shape {shape['shape']} ({part('first')}; {part('last')})"


def format_gap(s: dict) -> str:
    """The gap as printed: `gap 0.880 [0.747, 0.978]`; the interval (gap_ci) is for the largest true slot difference
    (simultaneous over slot pairs), the point the observed best - worst (biased upward)."""
    ci = s.get("gap_ci")
    return f"gap {s['gap']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def format_effect(s: dict) -> str:
    """The position test as printed: `position effect p < 0.001 (Cochran's Q 400.0, 99 examples vary)`, or
    `no position effect (p = 0.41, ...)`; '' for a summary written before the test existed."""
    t = s.get("position_test")
    if not t:
        return ""
    what = "position effect" if t["p"] < ALPHA else "no position effect"
    stat = f"Cochran's Q {t['statistic']:.1f}, " if t["name"].startswith("Cochran") else ""
    return f"{what} ({format_p(t['p'])}; {stat}{t['n']} examples vary across slots, {t['permutations']} permutations)"


def _label(position):
    """A slot as an int; another label (a two-hop pair "i:j") as it is."""
    return position if isinstance(position, str) else int(position)


def paired_difference(a: np.ndarray, b: np.ndarray) -> dict:
    """Average accuracy of b minus a on the same examples, with a paired 95% interval (diff_ci, Agresti-Min).

    a, b: arrays [n_examples, n_positions], rows the same examples in the same order. Also the standard error of
    the mean per-example difference (diff_se: never 0, so three identical examples do not claim certainty) and
    `mde80`, the smallest true difference this many examples would detect with 80% power at two-sided alpha 0.05
    if the per-example spread stayed as observed: (z_0.975 + z_0.8) * se = 2.80 * se (normal approximation).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    d = (b - a).mean(axis=1)  # per-example difference, averaged over positions
    lo, hi = diff_ci(d)
    se = diff_se(d)
    return {"difference": float(d.mean()), "ci": [float(lo), float(hi)], "se": se, "mde80": 2.8016 * se}
