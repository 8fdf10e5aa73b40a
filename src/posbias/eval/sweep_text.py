"""The sweep's printed table and summary (eval/sweep.py's SweepResult.text): accuracy per placement, the curve's
figures, and for an order task its figures; a run whose verdicts went unread says so first (eval/judging.py)."""

from __future__ import annotations

from ..core.metrics import format_effect, format_gap, format_shape
from ..core.order import format_no_gold
from ..tasks import label
from .judging import format_order, not_measured, unread_lines
from .rownotes import format_notes


def format_table(per: list[dict], summary: dict, head: str | None = None) -> str:
    """Accuracy per placement with its CI (and the further metrics), then the summary (and per-mode averages); a
    `head` line above the table, under the unread verdicts' line (the printout's first) where verdicts went unread."""
    extra = [k for k in per[0] if k not in ("position", "n", "correct", "accuracy", "ci_low", "ci_high", "mode")]
    measure = summary.get("measure", "accuracy")  # a judge file without "preferred": how often answers[0] is picked
    s = summary
    u = s.get("unread")  # verdicts not read: said first; above the limit nothing below is printed as measured
    lines = ([head] if head else []) + [f"{'position':>8}  {measure:>8}  {'95% CI':>15}  {'n':>5}" + "".join(f"  {k:>8}" for k in extra)
             + ("  mode" if "mode" in per[0] else "") + ("  unread" if u else "")]
    for j, r in enumerate(per):  # an unread verdict counts as wrong in its slot's accuracy; the column says how many
        lines.append(f"{label(r['position']):>8}  {r['accuracy']:>8.3f}  [{r['ci_low']:.3f}, {r['ci_high']:.3f}]  {r['n']:>5}"
                     + "".join(f"  {r[k]:>8.3f}" for k in extra) + (f"  {r['mode']}" if "mode" in r else "")
                     + (f"  {u['by_slot'][j]:>6}" if u else ""))
    if u and not u["measured"]:
        return "\n".join(unread_lines(u) + lines + not_measured(u) + _cut_lines(s))
    lines = unread_lines(u) + lines
    avg_ci = f" [{s['average_ci'][0]:.3f}, {s['average_ci'][1]:.3f}]" if "average_ci" in s else ""
    if len(per) == 1:  # one slot: no best, worst, gap or position test to speak of
        return "\n".join(lines + [f"average {s['average']:.3f}{avg_ci} at the one slot measured ({label(per[0]['position'])}): no best, worst, gap "
                                   "or position test (measure two slots or more)"] + _cut_lines(s)
                          + (format_order(s["order"], s.get("decision"), gold=measure == "accuracy", orders=1)
                             if "order" in s and u is None else []))
    chance = f" (chance {s['chance']:.3f})" if s.get("chance") else ""
    lines += [  # a judge file without "preferred": no right answer, so no chance, best or worst (eval/judging.py)
        f"average {s['average']:.3f}{avg_ci}{chance} | best {s['best']:.3f} (pos {s['best_position']}) | worst {s['worst']:.3f} "
        f"(pos {s['worst_position']}) | {format_gap(s)} | std {s['std']:.3f}"
    ] if measure == "accuracy" else format_no_gold(s)
    lines += [effect] if (effect := format_effect(s)) else []
    if "modes" in s:
        modes = " | ".join(f"{m} {v:.3f}" for m, v in s["modes"].items())
        lines.append(f"modes: {modes} | gap between modes {s['mode_gap']:.3f}")
    lines += [format_shape(s["shape"])] if s.get("shape") else []  # primacy, recency, U, flat, middle (core.metrics)
    lines += _cut_lines(s)
    if "order" in s:
        lines += format_order(s["order"], s.get("decision"), gold=measure == "accuracy", orders=len(per))
    return "\n".join(lines)


def _cut_lines(s: dict) -> list[str]:
    """The rows the generation limit cut short, and the advice (cut mid-answer, or looping); niah needles further
    than the tolerance from their asked depth (eval/rownotes.py)."""
    return format_notes(s)
