"""The statistics beside every curve posbias prints, each checked for its rate by simulation (analysis/coverage.py,
tests/test_statistics.py, docs/statistics.md).

- `position_test`: is there any difference between slots at all? A within-example permutation test: each example's
  outcomes are shuffled across its slots (the null: slots exchangeable within an example), the statistic the spread
  of the slot totals, sum_j (C_j - mean C)^2, which for 0/1 outcomes orders permutations exactly as Cochran's Q
  (Q's denominator does not change under such shuffles); Q itself is reported beside. Monte Carlo p-value
  (1 + #{T* >= T}) / (B + 1), exact in level for any B (Phipson & Smyth 2010). Rows constant across slots carry no
  information and are left out of the shuffling (they cannot change T).
- `gap_interval`: an interval for the curve's largest true slot difference, max_j p_j - min_j p_j. Simultaneous
  Bonferroni intervals for every pair of slots (each at 1 - alpha / m, m = k(k-1)/2 pairs); if all hold, the largest
  true difference lies in [max(0, max lower), max upper]. The point `gap` (best - worst observed) is biased upward
  (on a flat curve it is the noise's range); the interval is what to read.
- `exact_ci`: one slot's accuracy k/n (Clopper-Pearson: at least nominal at every n and p; Wilson's, which posbias
  printed before, dips to 91% at n = 10, p = 0.05). `wilson_ci` stays for the callers that want Wilson's.
- `mean_ci`: a mean of per-example values in [0, 1] (an average over slots, a share of items): Clopper-Pearson's
  interval for 0/1 values; for fractions Agresti-Coull's adjustment (z^2/2 pseudo-observations at 0 and at 1; Agresti & Coull
  1998) with the augmented data's own variance and Student's quantile on n - 1 degrees of freedom in place of z (with
  z the exact coverage fell to 0.89 at n = 3 and 0.92 at n = 5 for averages over 2 slots; with t it is at least 0.96
  over 2-5 slots, n = 3-20, accuracies 0.02-0.98, computed exactly by enumeration). No interval is zero-width at n = 3.
- `diff_ci`: a mean of per-example differences in [-1, 1] (two slots or two methods on the same examples):
  Agresti & Min (2005)'s paired adjustment (half a pseudo-pair in each cell of the 2x2 table at 95%), its weight
  scaled with z^2 as Agresti-Coull's is (z^2/8 per cell: the Bonferroni levels of the gap need more), generalised to
  fractional differences through the pseudo-data's variance.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import Sequence

import numpy as np

ALPHA = 0.05  # every interval is 1 - ALPHA; the position test's level
N_PERM = 1999  # permutations of the position test: p-values down to 0.0005
_CELLS = 2_000_000  # permuted cells held at once


def z_of(alpha: float) -> float:
    """The two-sided normal quantile for level 1 - alpha."""
    return NormalDist().inv_cdf(1 - alpha / 2)


Z95 = z_of(ALPHA)


def wilson_ci(k: int, n: int, z: float = Z95) -> tuple[float, float]:
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


@lru_cache(maxsize=64)
def _log_comb(n: int) -> np.ndarray:
    """log C(n, i) for i = 0..n."""
    lg = np.array([math.lgamma(i + 1) for i in range(n + 1)])
    return lg[n] - lg - lg[::-1]


def _binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    i = np.arange(k, n + 1)
    terms = _log_comb(n)[k:] + i * math.log(p) + (n - i) * math.log1p(-p)
    top = terms.max()
    return float(min(1.0, math.exp(top) * np.exp(terms - top).sum()))


@lru_cache(maxsize=8192)
def exact_ci(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Clopper-Pearson's exact interval for k/n: coverage at least 1 - alpha at every n and p (Wilson's dips to
    91% at n = 10, p = 0.05, below the 93% posbias holds every interval to). Bisection on the binomial tails, ~0.8 ms
    a call, so the results are kept: a curve, a compare or a coverage simulation asks for the same (k, n) often."""
    if n == 0:
        return (float("nan"), float("nan"))

    def solve(f, want: float) -> float:  # f increasing in p on [0, 1]
        lo, hi = 0.0, 1.0
        for _ in range(45):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < want else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: _binom_tail(k, n, p), alpha / 2)
    upper = 1.0 if k == n else solve(lambda p: _binom_tail(k + 1, n, p), 1 - alpha / 2)
    return (lower, upper)


@lru_cache(maxsize=256)
def t_of(alpha: float, df: int) -> float:
    """Student's two-sided quantile for level 1 - alpha on df degrees of freedom (bisection on the cdf, whose density
    is integrated by Simpson's rule; numpy has no t distribution and scipy is not a dependency)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def tail(t: float) -> float:  # P(T > t) for t >= 0
        u = np.linspace(0.0, t, 2001)
        f = c * (1 + u * u / df) ** (-(df + 1) / 2)
        return 0.5 - float((f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()) * (u[1] - u[0]) / 3)
    lo, hi = 0.0, 700.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) > alpha / 2 else (lo, mid)
    return (lo + hi) / 2


def mean_ci(x: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Interval for the mean of per-example values in [0, 1]: Clopper-Pearson's for 0/1 values, else Agresti-Coull's
    z^2/2 pseudo-observations at 0 and 1 with the variance of the augmented data, at Student's quantile on n - 1
    degrees of freedom for the level z names (module docstring)."""
    x = np.asarray(x, dtype=float)
    if not len(x):
        return (float("nan"), float("nan"))
    alpha = 2 * (1 - NormalDist().cdf(z))
    if np.isin(x, (0.0, 1.0)).all():
        return exact_ci(int(x.sum()), len(x), alpha)
    if len(x) == 1:
        return (0.0, 1.0)  # one example's fraction says nothing of its spread
    z = t_of(round(alpha, 12), len(x) - 1)
    w = z * z / 2
    n = len(x) + 2 * w
    m = (x.sum() + w) / n
    var = ((x * x).sum() + w) / n - m * m
    half = z * math.sqrt(max(var, 0.0) / n)
    return (float(max(0.0, m - half)), float(min(1.0, m + half)))


def _adjusted(d: np.ndarray, z: float, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of paired differences in [-1, 1] after Agresti-Min's pseudo-pairs, scaled with z as
    Agresti-Coull's are: z^2/8 at +1, z^2/8 at -1 and z^2/4 at 0 (at z = 1.96 their half a pair per cell)."""
    w = z * z / 8
    n = d.shape[axis] + 4 * w
    m = d.sum(axis=axis) / n
    var = ((d * d).sum(axis=axis) + 2 * w) / n - m * m
    return m, np.sqrt(np.maximum(var, 0.0) / n)


def diff_ci(d: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Interval for the mean of paired differences in [-1, 1] (`_adjusted`: Agresti-Min's pseudo-pairs, the variance
    that of the augmented data, so fractional differences are handled too)."""
    d = np.asarray(d, dtype=float)
    if not len(d):
        return (float("nan"), float("nan"))
    m, se = _adjusted(d, z)
    return (float(max(-1.0, m - z * se)), float(min(1.0, m + z * se)))


def diff_se(d: Sequence[float]) -> float:
    """The standard error `diff_ci` uses at 95% (never 0: the pseudo-pairs keep a floor of spread)."""
    return float(_adjusted(np.asarray(d, dtype=float), Z95)[1])


def cochran_q(x: np.ndarray) -> float:
    """Cochran's Q for 0/1 outcomes [examples, slots] (0 where no example varies across slots)."""
    k = x.shape[1]
    c, r = x.sum(axis=0), x.sum(axis=1)
    total = c.sum()
    den = k * total - (r * r).sum()
    return float((k - 1) * (k * (c * c).sum() - total * total) / den) if den > 0 else 0.0


def position_test(correct: np.ndarray, n_perm: int = N_PERM, seed: int = 0) -> dict:
    """Any difference between slots? Within-example permutation test (module docstring).

    correct: [examples, slots], 0/1 or scores in [0, 1]. Returns name, statistic (Cochran's Q for 0/1 data, else
    the spread of slot totals), p, n (examples varying across slots: the informative ones) and permutations."""
    x = np.asarray(correct, dtype=float)
    binary = bool(np.isin(x, (0.0, 1.0)).all())
    name = "Cochran's Q, within-example permutation" if binary else "slot spread, within-example permutation"
    x = x[x.std(axis=1) > 0]
    stat = cochran_q(x) if binary else float(((x.sum(axis=0) - x.sum() / x.shape[1]) ** 2).sum())
    out = {"name": name, "statistic": stat, "n": int(len(x)), "permutations": int(n_perm)}
    if len(x) == 0 or x.shape[1] < 2:
        return {**out, "p": 1.0}
    spread = lambda c: ((c - c.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)  # noqa: E731 - two uses
    t_obs = spread(x.sum(axis=0))
    rng = np.random.default_rng(seed)
    chunk = max(1, _CELLS // x.size)
    hits, done = 0, 0
    while done < n_perm:
        b = min(chunk, n_perm - done)
        order = rng.random((b, *x.shape)).argsort(axis=2)
        shuffled = np.take_along_axis(np.broadcast_to(x, (b, *x.shape)), order, axis=2)
        hits += int((spread(shuffled.sum(axis=1)) >= t_obs - 1e-9).sum())
        done += b
    return {**out, "p": (1 + hits) / (n_perm + 1)}


def format_p(p: float) -> str:
    """A p-value as printed: three decimals, or `< 0.001`."""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def p_cell(test: dict | None) -> str:
    """A position test's p as a table cell (`< 0.001`, `0.412`), `-` for a summary written before the test."""
    return "-" if not test else format_p(test["p"]).removeprefix("p ").removeprefix("= ")


def pairs_z(k: int, alpha: float = ALPHA) -> float:
    """The Bonferroni z for simultaneous intervals over all k(k-1)/2 pairs of k slots."""
    return z_of(alpha / max(1, k * (k - 1) // 2))


def gap_interval(correct: np.ndarray, alpha: float = ALPHA) -> tuple[float, float]:
    """Interval for the largest true slot difference (module docstring): [max(0, max lower), max upper] over the
    simultaneous paired intervals of every pair of slots. correct: [examples, slots]."""
    x = np.asarray(correct, dtype=float)
    k = x.shape[1]
    if k < 2 or not len(x):
        return (0.0, 0.0) if k < 2 else (float("nan"), float("nan"))
    z = pairs_z(k, alpha)
    m, se = _adjusted(x[:, :, None] - x[:, None, :], z)  # [k, k]: slot j minus slot l, every pair at once
    return (float(max(0.0, (m - z * se).max())), float(min(1.0, (m + z * se).max())))  # (j, l) and (l, j) both in


def n_for_gap(gap: float, k: int, p: float = 0.5, power: float = 0.8, alpha: float = ALPHA) -> int:
    """Examples per slot for the gap interval to exclude 0 with the given power when two slots differ by `gap` around
    accuracy p, independent outcomes (a normal approximation: n = ((z_pairs + z_power) sd / gap)^2,
    sd^2 = p_hi(1 - p_hi) + p_lo(1 - p_lo)); docs/statistics.md tabulates it."""
    hi, lo = min(1.0, p + gap / 2), max(0.0, p - gap / 2)
    sd = math.sqrt(hi * (1 - hi) + lo * (1 - lo)) or 1e-9
    zp = NormalDist().inv_cdf(power)
    return math.ceil(((pairs_z(k, alpha) + zp) * sd / gap) ** 2)
