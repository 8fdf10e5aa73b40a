"""What `posbias compare` prints (eval/compare.py): one row per entry with its paired difference from the first, the
collapse flags, and the order and two-hop tables where the task has them."""

from __future__ import annotations

from ..core.stats import p_cell
from ..tasks import label
from .judging import GOLD_FIGURES

ORDER_COLUMNS = {"strict_accuracy": "strict accuracy", "consistency": "consistency", "conflict_rate": "conflict rate",
                 "preference_fairness": "pref. fairness",
                 "rstd": "RStd"}  # the order table's columns (a summary's `order` keys) and their headings


def _measure_line(first: dict) -> list[str]:
    """What the numbers are, and the chance level beside them (an order task: one over its options)."""
    s, chance = first["summary"], (first.get("collapse") or {}).get("chance", first["summary"].get("chance"))
    measure = s.get("measure", "accuracy")
    if measure != "accuracy":  # a judge file without "preferred" (core/order.py, format_no_gold)
        return [f"values: {measure}, the rate of choosing the file's first answer with it in each slot (the file names no "
                "preferred answer: no accuracy, no chance level); avg is the model's lean towards answers[0] over every "
                "order, gap the order effect (no order bias: 0)"]
    if not chance:
        return []
    at = f"; 'at chance': the average's 95% CI reaches down to {chance:.3f} or below" if chance else ""
    return [f"values: {measure}; chance {chance:.3f}{at}" if chance is not None else f"values: {measure}"]


def format_compare(record: dict) -> str:
    """Accuracy per position, one row per entry, then average, gap (95% interval for the largest true slot
    difference), the position test's p (any difference between slots) and the paired difference from the first."""
    rows = record["methods"]
    positions = [p["position"] for p in rows[0]["per_position"]]
    w = max(12, *(len(r["label"]) for r in rows))
    first = rows[0]["label"]
    what = "method" if record["config"].get("model") else "model"  # compare --models: entries are models
    head = (f"{what:<{w}} " + " ".join(f"{label(p):>6}" for p in positions)
            + f" {'avg':>6} {'gap':>6}  gap 95% CI        position p  avg - {first} (paired 95% CI)  detectable at 80% power")
    lines = [head]
    for r in rows:
        s = r["summary"]
        accs = " ".join(f"{p['accuracy']:>6.3f}" for p in r["per_position"])
        ci = f"[{s['gap_ci'][0]:.3f}, {s['gap_ci'][1]:.3f}]"
        t = s.get("position_test")  # older compare.json files have none
        pval = p_cell(t)
        v = r.get("vs_first")
        vs = f"{v['difference']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]" if v else ""
        if v and v.get("mde80"):  # older compare.json files have no power figure
            vs += f"  {v['mde80']:.3f}"
        c = r.get("collapse") or {}
        flag = "  COLLAPSED" if c.get("flagged") else "  at chance" if c.get("at_chance") else ""
        lines.append(f"{r['label']:<{w}} {accs} {s['average']:>6.3f} {s['gap']:>6.3f}  {ci:<16}  {pval:>10}  {vs}{flag}")
    flagged = [r for r in rows if (r.get("collapse") or {}).get("flagged")]
    lines += [f"COLLAPSED {r['label']}: {'; '.join(r['collapse']['reasons'])}" for r in flagged]
    lines += _measure_line(rows[0])
    if any((r["summary"].get("decision") or {}).get("rule") == "ensemble" for r in rows):
        lines.append("forward passes per verdict: " + "; ".join(  # an order ensemble's cost beside its gain
            f"{r['label']} {(r['summary'].get('decision') or {}).get('forward_passes_per_verdict', 1):g}" for r in rows))
    if "order" in rows[0]["summary"]:  # order tasks: consistency, conflict, fairness, RStd (95% CIs) per entry
        gold = rows[0]["summary"].get("measure", "accuracy") == "accuracy"  # else no strict accuracy, no RStd
        columns = {k: t for k, t in ORDER_COLUMNS.items() if gold or k not in GOLD_FIGURES}
        lines += ["", f"{what:<{w}} " + "  ".join(f"{t:>22}" for t in columns.values()) + "  forward passes per verdict"]
        for r in rows:
            o, dec = r["summary"]["order"], r["summary"].get("decision") or {}
            cells = [f"{o[k]['value']:.3f}" + (f" [{o[k]['ci'][0]:.2f},{o[k]['ci'][1]:.2f}]" if o[k].get("ci") else "")
                     if k in o and o[k]["value"] == o[k]["value"] else "-" for k in columns]
            cost = f"{dec.get('forward_passes_per_verdict', 1):g}"  # an adaptive swap's is a mean (1.36)
            cost += f" + {dec['calibration_forward_passes']} calibration" if "calibration_forward_passes" in dec else ""
            lines.append(f"{r['label']:<{w}} " + "  ".join(f"{c:>22}" for c in cells) + f"  {cost}")
    if "modes" in rows[0]["summary"]:  # two-hop placements: the average of each mode and the gap between modes
        modes = list(rows[0]["summary"]["modes"])
        lines += ["", f"{what:<{w}} " + " ".join(f"{m:>12}" for m in modes) + f" {'mode gap':>9}"]
        lines += [f"{r['label']:<{w}} " + " ".join(f"{r['summary']['modes'][m]:>12.3f}" for m in modes)
                  + f" {r['summary']['mode_gap']:>9.3f}" for r in rows]
    return "\n".join(lines)
