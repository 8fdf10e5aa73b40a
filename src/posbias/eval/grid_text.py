"""The text of a grid (`GridResult.format`, `posbias grid`): a depth x size table of accuracies (a niah cell adds its
needles' mean true depth), each size's average, gap and position test, then the long-context lines (eval/longctx.py)
of a niah grid, and each size's notes as `sweep` prints them (eval/rownotes.py: answers cut at the limit or looping,
needles further than the tolerance from their asked depth)."""

from __future__ import annotations

from ..core.stats import p_cell
from .longctx import format_long
from .rownotes import format_cut, format_notes


def format_grid(rec: dict) -> str:
    """Accuracy per cell of a grid record (grid.json): rows = depth, columns = size (with its mean tokens); then each
    size's average, gap and position test's p, and the long-context lines of a niah grid."""
    option, sizes = rec["size_option"], rec["sizes"]
    acc = {(c["size"], c["depth"]): c for c in rec["cells"]}
    heads = [f"{s['size']} {option}" for s in sizes]
    w = max(12 + 3 * any("true_depth" in c for c in rec["cells"]), *(len(h) + 1 for h in heads))
    lines = [f"{'depth':>6}" + "".join(f"{h:>{w}}" for h in heads),
             f"{'tokens':>6}" + "".join(f"{'~' + str(round(s['tokens']['mean'])):>{w}}" for s in sizes)]
    for d in rec["depths"]:
        cells = [acc[(s["size"], d)] for s in sizes]
        lines.append(f"{str(d) + '%':>6}" + "".join(f"{_cell(c, option):>{w}}" for c in cells))
    lines.append(f"{'avg':>6}" + "".join(f"{s['summary']['average']:>{w}.3f}" for s in sizes))
    lines.append(f"{'gap':>6}" + "".join(f"{s['summary']['gap']:>{w}.3f}" for s in sizes))
    lines.append(f"{'p':>6}" + "".join(f"{p_cell(s['summary'].get('position_test')):>{w}}" for s in sizes))
    true = " (the needles' mean true depth, % of the haystack)" if any("true_depth" in c for c in rec["cells"]) else ""
    lines.append(f"cells: accuracy{true if option == 'tokens' else ' (slot)'}; 95% Clopper-Pearson CIs per cell in grid.json; "
                 "gap = "
                 "best - worst depth (the interval for the largest true difference in grid.json); p = the position "
                 "test's (any difference between depths; docs/statistics.md)")
    if option == "tokens":
        lines += format_long(rec)
    for s in sizes:
        for m in s["merged_depths"]:
            lines.append(f"note: at {s['size']} {option}, depths {', '.join(f'{d}%' for d in m['depths'])} "
                         f"share slot {m['position']} (same numbers)")
        lines += [f"note: at {s['size']} {option}, {line}" for line in format_notes(s["summary"])]
    for name, ref in (rec.get("references") or {}).items():  # the references' own generated answers
        what = {"closed": "closed-book", "needle": "needle-alone"}.get(name, name)
        lines += [f"note: {what} reference, {line}" for line in format_cut(ref.get("cut"))]
    return "\n".join(lines)


def _cell(c: dict, option: str) -> str:
    if option != "tokens":
        return f"{c['accuracy']:.2f} ({c['position']})"
    return f"{c['accuracy']:.2f}" + (f" ({c['true_depth']:.1f})" if "true_depth" in c else "")
