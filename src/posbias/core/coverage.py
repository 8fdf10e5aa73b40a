"""Simulated curves whose truth is known, and the rate at which each interval and test posbias prints holds on them
(tests/test_statistics.py asserts it; benchmarks/coverage.py prints docs/statistics.md's table).

A curve is a vector of true slot accuracies p_j. Examples are paired across slots: with probability `rho` an example
draws one uniform for all its slots (item difficulty: it is right at every slot whose p_j exceeds it), otherwise one
per slot; either way each outcome is right with probability exactly p_j, so the truth of every statistic is a
function of p alone. `LEGACY` holds the intervals posbias printed before (percentile bootstraps), kept here only to
show that the checks fail on them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .metrics import curve_shape, selected_ci
from .order import order_figures
from .stats import ALPHA, diff_ci, gap_interval, mean_ci, position_test, z_of


def curves(k: int) -> dict[str, np.ndarray]:
    """The true curves of the grid, k slots each: flat at the floor, middle and ceiling, U, recency, a single dip,
    and linear ramps with gaps 0.1 - 0.9."""
    j = np.arange(k)
    out = {"flat 0.05": np.full(k, 0.05), "flat 0.5": np.full(k, 0.5), "flat 0.95": np.full(k, 0.95),
           "U": np.where((j == 0) | (j == k - 1), 0.8, 0.4), "recency": 0.3 + 0.5 * j / max(1, k - 1),
           "dip": np.where(j == k // 2, 0.3, 0.7)}
    for gap in (0.1, 0.3, 0.6, 0.9):
        out[f"ramp {gap}"] = 0.5 + gap * (0.5 - j / max(1, k - 1))
    return out


def simulate(p: np.ndarray, n: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """Outcomes [n, k] for true slot accuracies p (module docstring)."""
    u = rng.random((n, len(p)))
    shared = rng.random(n) < rho
    u[shared] = rng.random((int(shared.sum()), 1))
    return (u < p).astype(float)


def _old_bootstrap(values: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap of a per-example mean posbias used before."""
    idx = np.random.default_rng(seed).integers(0, len(values), (n_boot, len(values)))
    lo, hi = np.quantile(values[idx].mean(axis=1), [0.025, 0.975])
    return float(lo), float(hi)


def _old_gap(x: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The old gap interval: a bootstrap of max - min that re-selects best and worst in every resample."""
    boot = x[np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))].mean(axis=1)
    lo, hi = np.quantile(boot.max(axis=1) - boot.min(axis=1), [0.025, 0.975])
    return float(lo), float(hi)


def _old_shape_flat(x: np.ndarray) -> bool:
    """The old shape rule's call on a curve: True when it calls any shape (two uncorrected bootstrap edges)."""
    inner = x[:, 1:-1].mean(axis=1)
    return any(lo > 0 or hi < 0 for lo, hi in (_old_bootstrap(x[:, e] - inner) for e in (0, -1)))


def intervals(x: np.ndarray, legacy: bool = False) -> dict[str, tuple[float, float]]:
    """Each curve interval posbias prints, for outcomes x [n, k] (the old ones with legacy=True)."""
    if legacy:
        out = {"average": _old_bootstrap(x.mean(axis=1)), "gap": _old_gap(x), "slot 0": _old_bootstrap(x[:, 0])}
    else:
        out = {"average": mean_ci(x.mean(axis=1)), "gap": gap_interval(x), "slot 0": mean_ci(x[:, 0])}
    if x.shape[1] >= 3:  # the shape's first edge (core/metrics.curve_shape: two edges, each at 1 - ALPHA/2)
        d = x[:, 0] - x[:, 1:-1].mean(axis=1)
        out["first - interior"] = _old_bootstrap(d) if legacy else diff_ci(d, z_of(ALPHA / 2))
    return out


def selected(x: np.ndarray, legacy: bool = False) -> dict[str, tuple[int, tuple[float, float]]]:
    """The best and worst observed slots with their intervals (sweep.json's best_ci, worst_ci), as {name: (slot,
    interval)}: the truth they estimate is the selected slot's true accuracy. legacy=True: the selected slot's own
    95% interval, which posbias printed before (it ignores the selection)."""
    acc = x.mean(axis=0)
    out = {}
    for name, j in (("best", int(np.argmax(acc))), ("worst", int(np.argmin(acc)))):
        out[name] = (j, mean_ci(x[:, j]) if legacy else selected_ci(x, j))
    return out


def truths(p: np.ndarray) -> dict[str, float]:
    """What each interval of `intervals` estimates, from the true curve."""
    out = {"average": float(p.mean()), "gap": float(p.max() - p.min()), "slot 0": float(p[0])}
    return {**out, "first - interior": float(p[0] - p[1:-1].mean())} if len(p) >= 3 else out


def coverage(p: np.ndarray, n: int, reps: int, rho: float = 0.3, seed: int = 0, legacy: bool = False) -> dict:
    """Share of `reps` simulated curves whose interval holds the truth, per interval; with the position test's and
    the shape's rate of calling a difference (on a flat p: their false-call rates)."""
    rng = np.random.default_rng(seed)
    truth, held = truths(p), {}
    effect = shaped = 0
    for r in range(reps):
        x = simulate(p, n, rho, rng)
        for name, (lo, hi) in intervals(x, legacy).items():
            held[name] = held.get(name, 0) + (lo - 1e-12 <= truth[name] <= hi + 1e-12)
        for name, (j, (lo, hi)) in selected(x, legacy).items():  # the truth is the selected slot's
            held[name] = held.get(name, 0) + (lo - 1e-12 <= p[j] <= hi + 1e-12)
        if legacy:
            shaped += len(p) >= 3 and _old_shape_flat(x)
            continue
        test = position_test(x, n_perm=199, seed=r)
        effect += test["p"] < ALPHA
        shaped += len(p) >= 3 and curve_shape(list(range(len(p))), x, test)["shape"] != "flat"
    out = {name: h / reps for name, h in held.items()}
    return {**out, "shape called": shaped / reps, **({} if legacy else {"effect found": effect / reps})}


def paired_coverage(n: int, reps: int, delta: float = 0.1, k: int = 5, seed: int = 0,
                    interval: Callable = diff_ci) -> float:
    """Coverage of `compare`'s paired difference (method b minus method a, averaged over slots) when b's curve is a's
    raised by delta; the two methods share each example's difficulty half the time."""
    rng = np.random.default_rng(seed)
    pa = np.linspace(0.3, 0.6, k)
    pb = np.clip(pa + delta, 0, 1)
    held = 0
    for _ in range(reps):
        u = rng.random((n, k))
        u2 = np.where(rng.random((n, 1)) < 0.5, u, rng.random((n, k)))
        d = ((u2 < pb).astype(float) - (u < pa)).mean(axis=1)
        lo, hi = interval(d)
        held += lo - 1e-12 <= pb.mean() - pa.mean() <= hi + 1e-12
    return held / reps


def judge_coverage(a: float, b: float, n: int, reps: int, seed: int = 0) -> dict:
    """Coverage of the pairwise judge's figures (core/order.py) when the judge is right with probability a with the
    correct answer first and b with it second, independently: consistency ab + (1-a)(1-b), strict accuracy ab,
    preference fairness b - a."""
    rng = np.random.default_rng(seed)
    truth = {"consistency": a * b + (1 - a) * (1 - b), "strict_accuracy": a * b, "preference_fairness": b - a}
    held = dict.fromkeys(truth, 0)
    for _ in range(reps):
        first = np.where(rng.random(n) < a, 0, 1)  # slot chosen when the correct answer sits at slot 0
        second = np.where(rng.random(n) < b, 1, 0)  # ... at slot 1
        figs = order_figures(np.stack([first, second], axis=1), [0, 1], 2)
        for name, t in truth.items():
            lo, hi = figs[name]["ci"]
            held[name] += lo - 1e-12 <= t <= hi + 1e-12
    return {name: h / reps for name, h in held.items()}
