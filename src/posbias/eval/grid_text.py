"""The text of a grid (`GridResult.format`, `posbias grid`): a depth x size table of accuracies, each size's average,
gap and position test, then the long-context lines (eval/longctx.py) of a niah grid."""

from __future__ import annotations

from ..core.stats import p_cell
from .longctx import format_long


def format_grid(rec: dict) -> str:
    """Accuracy per cell of a grid record (grid.json): rows = depth, columns = size (with its mean tokens); then each
    size's average, gap and position test's p, and the long-context lines of a niah grid."""
    option, sizes = rec["size_option"], rec["sizes"]
    acc = {(c["size"], c["depth"]): c for c in rec["cells"]}
    heads = [f"{s['size']} {option}" for s in sizes]
    w = max(12, *(len(h) + 1 for h in heads))
    lines = [f"{'depth':>6}" + "".join(f"{h:>{w}}" for h in heads),
             f"{'tokens':>6}" + "".join(f"{'~' + str(round(s['tokens']['mean'])):>{w}}" for s in sizes)]
    for d in rec["depths"]:
        cells = [acc[(s["size"], d)] for s in sizes]
        lines.append(f"{str(d) + '%':>6}" + "".join(f"{_cell(c, option):>{w}}" for c in cells))
    lines.append(f"{'avg':>6}" + "".join(f"{s['summary']['average']:>{w}.3f}" for s in sizes))
    lines.append(f"{'gap':>6}" + "".join(f"{s['summary']['gap']:>{w}.3f}" for s in sizes))
    lines.append(f"{'p':>6}" + "".join(f"{p_cell(s['summary'].get('position_test')):>{w}}" for s in sizes))
    lines.append(f"cells: accuracy{'' if option == 'tokens' else ' (slot)'}; 95% Clopper-Pearson CIs per cell in grid.json; "
                 "gap = "
                 "best - worst depth (the interval for the largest true difference in grid.json); p = the position "
                 "test's (any difference between depths; docs/statistics.md)")
    if option == "tokens":
        lines += format_long(rec)
    for s in sizes:
        for m in s["merged_depths"]:
            lines.append(f"note: at {s['size']} {option}, depths {', '.join(f'{d}%' for d in m['depths'])} "
                         f"share slot {m['position']} (same numbers)")
    return "\n".join(lines)


def _cell(c: dict, option: str) -> str:
    return f"{c['accuracy']:.2f}" if option == "tokens" else f"{c['accuracy']:.2f} ({c['position']})"
