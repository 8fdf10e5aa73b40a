"""A sweep's curve from its rows: accuracy per placement with its exact interval, and the curve's summary."""

from __future__ import annotations

import numpy as np

from ..core.metrics import curve_shape, summarize_curve
from ..core.stats import exact_ci
from ..tasks import Placement, as_json, label, mode_of, mode_summary, placement_key


def per_position_stats(rows: list[dict], positions: list[Placement], example_ids: list[str],
                       also: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """Accuracy per placement (exact Clopper-Pearson 95% CI; the task's further metrics as rates) and the curve
    summary; for a pair sweep also the mode of each placement, the per-mode averages and the gap between modes."""
    by_key = {(r["example_id"], placement_key(r["position"])): r for r in rows}
    m = np.array([[bool(by_key[(e, p)]["correct"]) for p in positions] for e in example_ids], dtype=bool)
    per = []
    for j, p in enumerate(positions):
        k, n = int(m[:, j].sum()), m.shape[0]
        lo, hi = exact_ci(k, n)
        row = {"position": as_json(p), "n": n, "correct": k, "accuracy": k / n, "ci_low": lo, "ci_high": hi}
        if isinstance(p, tuple):
            row["mode"] = mode_of(p)
        row.update({a: sum(bool(by_key[(e, p)][a]) for e in example_ids) / n for a in also})
        per.append(row)
    summary = summarize_curve([label(p) if isinstance(p, tuple) else p for p in positions], m).as_dict()
    sh = curve_shape(positions, m, summary["position_test"])
    return per, {**summary, **(mode_summary(per) or {}), **({"shape": sh} if sh else {})}
