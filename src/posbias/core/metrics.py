"""Answer metrics and curve statistics (pure Python/numpy).

`normalize_answer` and `best_subspan_em` follow the *Lost in the Middle* study
(Liu et al., 2023), which takes the normalisation of the SQuAD evaluation script.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from typing import Sequence

import numpy as np

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


def all_subspan(prediction: str, answers: Sequence[str]) -> bool:
    """RULER's multi-value / multi-query score made all-or-nothing: every gold answer occurs in the normalised
    whole text (the answers are several values asked at once, not aliases)."""
    pred = normalize_answer(prediction)
    return all(normalize_answer(a) in pred for a in answers)


METRICS = {"best_subspan_em": best_subspan_em, "substring": substring_match, "reasoning_em": reasoning_em,
           "subspan": subspan, "all_subspan": all_subspan}


def wilson_ci(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n (95% by default)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


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
    average_ci: tuple[float, float] = (float("nan"), float("nan"))  # the average's, from the same bootstrap

    def as_dict(self) -> dict:
        d = self.__dict__.copy()
        d["gap_ci"], d["average_ci"] = list(self.gap_ci), list(self.average_ci)
        return d


def summarize_curve(
    positions: Sequence[int], correct: np.ndarray, n_boot: int = 1000, seed: int = 0
) -> CurveSummary:
    """Summary of a paired accuracy curve.

    correct: bool array [n_examples, n_positions]; column j is position positions[j].
    std is the population std of the per-position accuracies. gap_ci is a paired
    bootstrap (resampling examples, keeping their row across positions) 95% interval
    of best - worst, re-selecting best and worst in each resample; average_ci the same
    bootstrap's interval of the average (what the chance-aware collapse rule reads).
    """
    correct = np.asarray(correct, dtype=float)
    acc = correct.mean(axis=0)
    b, w = int(np.argmax(acc)), int(np.argmin(acc))
    rng = np.random.default_rng(seed)
    n = correct.shape[0]
    idx = rng.integers(0, n, size=(n_boot, n))
    boot = correct[idx].mean(axis=1)  # [n_boot, n_positions]
    gaps = boot.max(axis=1) - boot.min(axis=1)
    lo, hi = np.quantile(gaps, [0.025, 0.975])
    avg_lo, avg_hi = np.quantile(boot.mean(axis=1), [0.025, 0.975])
    return CurveSummary(
        average=float(acc.mean()),
        best=float(acc[b]),
        best_position=_label(positions[b]),
        worst=float(acc[w]),
        worst_position=_label(positions[w]),
        gap=float(acc[b] - acc[w]),
        std=float(acc.std()),
        gap_ci=(float(lo), float(hi)),
        average_ci=(float(avg_lo), float(avg_hi)),
    )


def curve_shape(slots: Sequence[int], correct: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict | None:
    """The shape of a depth curve: primacy, recency, U, flat, or middle (the inverse of U), from paired contrasts.

    slots: the curve's slots (at least 3; their order in `correct`'s columns); correct: bool [n_examples, n_slots].
    Per example, `first` is the accuracy at the lowest slot minus the mean over the interior slots (neither the
    lowest nor the highest), `last` the same for the highest slot; each contrast's 95% interval comes from a paired
    bootstrap over examples. An edge is "up" when its interval lies above 0 and "down" when below. U: both up;
    primacy / recency: only the first / last up; middle: an edge down and none up; flat: no edge either way (at the
    floor or the ceiling a curve is flat: nothing can be told apart). None for fewer than 3 slots.
    """
    if len(slots) < 3 or not all(isinstance(x, (int, np.integer)) for x in slots):  # two-hop pairs: no depth order
        return None
    correct = np.asarray(correct, dtype=float)[:, np.argsort(slots)]
    interior = correct[:, 1:-1].mean(axis=1)
    contrasts = {"first": correct[:, 0] - interior, "last": correct[:, -1] - interior}
    idx = np.random.default_rng(seed).integers(0, correct.shape[0], size=(n_boot, correct.shape[0]))
    out, way = {}, {}
    for name, d in contrasts.items():
        lo, hi = np.quantile(d[idx].mean(axis=1), [0.025, 0.975])
        out[name] = {"difference": float(d.mean()), "ci": [float(lo), float(hi)]}
        way[name] = "up" if lo > 0 else "down" if hi < 0 else ""
    ups = {k for k, v in way.items() if v == "up"}
    shape = ("U" if len(ups) == 2 else "primacy" if ups == {"first"} else "recency" if ups == {"last"}
             else "middle" if "down" in way.values() else "flat")
    return {"shape": shape, **out}


def format_shape(shape: dict) -> str:
    """One line: the shape and its two edge contrasts with their intervals."""
    part = lambda k: f"{k} - interior {shape[k]['difference']:+.3f} [{shape[k]['ci'][0]:+.3f}, {shape[k]['ci'][1]:+.3f}]"  # noqa: E731
    return f"shape {shape['shape']} ({part('first')}; {part('last')})"


def _label(position):
    """A slot as an int; another label (a two-hop pair "i:j") as it is."""
    return position if isinstance(position, str) else int(position)


def paired_difference(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, seed: int = 0) -> dict:
    """Average accuracy of b minus a on the same examples, with a paired bootstrap 95% interval.

    a, b: bool arrays [n_examples, n_positions], rows the same examples in the same order.
    Resamples examples (whole rows), so the interval respects the paired design. Also the standard error
    of the mean per-example difference and `mde80`, the smallest true difference this many examples would
    detect with 80% power at two-sided alpha 0.05 if the per-example spread stayed as observed:
    (z_0.975 + z_0.8) * se = 2.80 * se (normal approximation; the power statement the LPES docs report).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    d = (b - a).mean(axis=1)  # per-example difference, averaged over positions
    idx = np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))
    lo, hi = np.quantile(d[idx].mean(axis=1), [0.025, 0.975])
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
    return {"difference": float(d.mean()), "ci": [float(lo), float(hi)], "se": se, "mde80": 2.8016 * se}
