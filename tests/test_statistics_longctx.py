"""The long-context intervals hold their rate (eval/longctx.py): each length's ratio to the base and the effective
length, simulated from per-example outcomes whose truth is known, under both bases (the needle alone; NoLiMa's, the
grid's own accuracy at its lengths <= 1K). Seeded; a few seconds.

A simulated grid: example i has an ability u_i ~ N(0, sigma^2) (correlated examples when sigma > 0); at length L and
depth d it answers with probability logistic(mu_L + delta_d + u_i); the needle alone with logistic(mu_0 + u_i). The
truth: acc_L = E[mean over depths], the needle-alone base E[logistic(mu_0 + u)], NoLiMa's base E[max over the short
lengths of an example's mean over depths] (exact per u, integrated over u by Gauss-Hermite quadrature). The
effective length's truth is the rule applied to the true ratios (none sits exactly on the threshold)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posbias.eval.longctx import effective_length

REPS = 400
NOMINAL = 0.93  # coverage at least 93% for a nominal 95% ...
TOL = 2.33 * math.sqrt(NOMINAL * (1 - NOMINAL) / REPS)  # ... within one-sided 99% binomial tolerance over REPS draws
SIZES = [512, 1024, 2048, 4096]
SHORT = [512, 1024]  # NoLiMa's base lengths here (<= 1K)
D5 = [0.5, -0.5, -1.0, -0.5, 0.5]  # a U over five depths
SCENARIOS = {  # mu per length, mu_0 (needle alone), depth effects, sigma
    "ceiling": ({512: 5.0, 1024: 4.5, 2048: 3.0, 4096: 1.2}, 5.0, D5, 0.0),
    "ceiling, correlated": ({512: 5.0, 1024: 4.5, 2048: 3.0, 4096: 1.2}, 5.0, D5, 1.5),
    "mid": ({512: 0.8, 1024: 0.6, 2048: 0.2, 4096: -0.6}, 0.5, D5, 1.0),
    "low": ({512: -0.8, 1024: -1.0, 2048: -1.4, 4096: -2.0}, -1.0, [0.3, 0.0, -0.3, 0.0, 0.3], 0.5),
    "near the threshold": ({512: 2.2, 1024: 2.0, 2048: 1.2, 4096: 0.9}, 2.2, D5, 1.0),
    "one depth, 0/1 scores": ({512: 1.7, 1024: 1.2, 2048: 0.5, 4096: 0.0}, 1.5, [0.0], 0.8),
}


def _logistic(x):
    return 1 / (1 + np.exp(-x))


def _truth(scenario, base: str) -> tuple[dict[int, float], float]:
    mu, mu0, depth, sigma = scenario
    x, w = np.polynomial.hermite_e.hermegauss(60)
    u, w = x * sigma, w / w.sum()
    acc = {s: float(w @ np.mean([_logistic(mu[s] + d + u) for d in depth], axis=0)) for s in SIZES}
    if base == "needle":
        return acc, float(w @ _logistic(mu0 + u))
    best = []
    for ui in u:  # E[max over the short lengths of (successes over the depths) / D]
        cdf = 1.0
        for s in SHORT:
            dist = np.array([1.0])
            for p in _logistic(mu[s] + np.array(depth) + ui):
                dist = np.convolve(dist, [1 - p, p])
            cdf = cdf * np.cumsum(dist)
        best.append(np.diff(np.r_[0.0, cdf]) @ (np.arange(len(depth) + 1) / len(depth)))
    return acc, float(w @ np.array(best))


def _draw(scenario, n: int, rng) -> tuple[dict[int, np.ndarray], np.ndarray]:
    mu, mu0, depth, sigma = scenario
    u = rng.normal(0, sigma, n)
    per = {s: (rng.random((n, len(depth))) < _logistic(mu[s] + np.array(depth)[None, :] + u[:, None])).mean(axis=1)
           for s in SIZES}
    return per, (rng.random(n) < _logistic(mu0 + u)).astype(float)


def _rule(ratios: dict[int, float], t: float = 0.85) -> int:
    k = next((j for j, s in enumerate(SIZES) if ratios[s] < t), len(SIZES))
    return SIZES[k - 1] if k else 0


def coverage(name: str, n: int, base: str, seed: int = 0) -> tuple[np.ndarray, float]:
    """(each length's ratio-interval coverage, the effective-length interval's coverage) over REPS draws."""
    acc, b = _truth(SCENARIOS[name], base)
    true = {s: acc[s] / b for s in SIZES}
    assert min(abs(r - 0.85) for r in true.values()) > 0.01  # the effective length is well defined
    length = _rule(true)
    rng = np.random.default_rng(seed)
    hits, el_hits = np.zeros(len(SIZES)), 0
    for _ in range(REPS):
        per, needle = _draw(SCENARIOS[name], n, rng)
        ref = needle if base == "needle" else np.max([per[s] for s in SHORT], axis=0)
        e = effective_length(per, ref, 0.85)
        for j, r in enumerate(e["ratios"]):
            lo, hi = r["ci"]
            hits[j] += lo - 1e-9 <= true[r["length"]] <= (math.inf if hi is None else hi + 1e-9)
        el_hits += e["ci"][0] <= length <= e["ci"][1]
    return hits / REPS, el_hits / REPS


@pytest.mark.parametrize("base", ["needle", "nolima"])
@pytest.mark.parametrize("n", [10, 20, 40])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ratio_and_effective_length_intervals_hold_95_percent(name, n, base):
    ratio, el = coverage(name, n, base)
    assert ratio.min() >= NOMINAL - TOL, (name, n, base, ratio.round(3).tolist())
    assert el >= NOMINAL - TOL, (name, n, base, el)
