"""Coverage of every curve interval posbias prints, and the false-call rates of its position test and shape, on
simulated curves whose truth is known (core/coverage.py): the intervals posbias prints now beside the ones it printed
before (percentile bootstraps). Then the examples per slot the gap interval needs to exclude 0 at 80% power, with the
power simulated at that n. docs/statistics.md holds the output.

    .venv/bin/python benchmarks/coverage.py [--reps 400]

Pure numpy, seeded: the same numbers on every machine (the CPU kind is printed for the timing line only).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from posbias.core.coverage import coverage, curves, judge_coverage, paired_coverage, simulate
from posbias.core.stats import gap_interval, n_for_gap
from posbias.measure import cpu_kind

GRID = [(k, n, name) for k, n in ((3, 10), (5, 30), (10, 30), (10, 100), (20, 20), (20, 200), (30, 20))
        for name in ("flat 0.05", "flat 0.5", "flat 0.95", "U", "recency", "dip", "ramp 0.3", "ramp 0.9")]
KEYS = ("slot 0", "best", "worst", "average", "gap", "first - interior", "effect found", "shape called")


def table(reps: int, rho: float) -> list[str]:
    head = f"{'slots':>5} {'n':>4}  {'curve':<10}" + "".join(f"{k:>18}" for k in KEYS)
    lines = [f"coverage now / before, {reps} simulated curves per row, examples correlated (rho {rho}); "
             "'effect found' and 'shape called' are rates (on flat curves: false calls)", head]
    worst: dict[str, float] = {}
    for k, n, name in GRID:
        new = coverage(curves(k)[name], n, reps, rho=rho, seed=k * 7919 + n)
        old = coverage(curves(k)[name], n, reps, rho=rho, seed=k * 7919 + n, legacy=True)
        cells = []
        for key in KEYS:
            a, b = new.get(key), old.get(key)
            cells.append("-" if a is None else f"{a:.3f} / {b:.3f}" if b is not None else f"{a:.3f} / -")
            if a is not None and key not in ("effect found", "shape called"):
                worst[key] = min(worst.get(key, 1.0), a)
            if a is not None and name.startswith("flat") and key in ("effect found", "shape called"):
                worst[f"false {key}"] = max(worst.get(f"false {key}", 0.0), a)
        lines.append(f"{k:>5} {n:>4}  {name:<10}" + "".join(f"{c:>18}" for c in cells))
    lines.append("worst now: " + ", ".join(f"{key} {v:.3f}" for key, v in worst.items()))
    return lines


def others(reps: int) -> list[str]:
    lines = ["", f"compare's paired difference (method b = a + 0.1, 5 slots), {reps} draws: coverage"]
    lines += [f"  n {n:>3}: {paired_coverage(n, reps, seed=n):.3f}" for n in (10, 30, 100, 200)]
    lines += ["", f"pairwise judge figures (right with p_a first, p_b second), {reps} draws: coverage"]
    for a, b, n in ((0.9, 0.5, 10), (0.7, 0.7, 30), (0.95, 0.2, 60), (0.6, 0.6, 200)):
        c = judge_coverage(a, b, n, reps, seed=n)
        lines.append(f"  p_a {a} p_b {b} n {n:>3}: " + ", ".join(f"{k} {v:.3f}" for k, v in c.items()))
    return lines


def power(reps: int) -> list[str]:
    lines = ["", "examples per slot for the gap interval to exclude 0 at 80% power (two slots differ by the gap around "
             "0.5, the rest at 0.5; formula core/stats.n_for_gap) and the power simulated at that n"]
    lines.append(f"{'slots':>5}" + "".join(f"{'gap ' + str(g):>18}" for g in (0.1, 0.2, 0.3, 0.5)))
    rng = np.random.default_rng(0)
    for k in (2, 5, 10, 20):
        cells = []
        for g in (0.1, 0.2, 0.3, 0.5):
            n = n_for_gap(g, k)
            p = np.full(k, 0.5)
            p[0], p[-1] = 0.5 + g / 2, 0.5 - g / 2
            hit = sum(gap_interval(simulate(p, n, 0.0, rng))[0] > 0 for _ in range(reps // 2))
            cells.append(f"{n} ({hit / (reps // 2):.2f})")
        lines.append(f"{k:>5}" + "".join(f"{c:>18}" for c in cells))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    a = ap.parse_args()
    t0, c0 = time.time(), time.process_time()
    out = [*table(a.reps, 0.0), "", *table(a.reps, 0.6), *others(a.reps), *power(a.reps)]
    print("\n".join(out))
    print(f"\n{time.time() - t0:.0f} s wall, {time.process_time() - c0:.0f} CPU s on {cpu_kind().describe()}")


if __name__ == "__main__":
    main()
