"""An order task's blocks in the report: its figures per entry (`order_table`), and its flips: counts by cause
(summary.order.flips) and the first FLIPS_SHOWN items of the folder's flips.jsonl (eval/judging.py writes both;
nothing is recomputed here)."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.order import format_figure
from .blocks import Raw, fmt, para, table

FLIPS_SHOWN = 20


def _first_flips(path: Path, limit: int = FLIPS_SHOWN) -> list[dict]:
    """The first `limit` records of flips.jsonl ([] without the file or where a line cannot be read)."""
    out: list[dict] = []
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            if len(out) == limit:
                break
            try:
                out.append(json.loads(line))
            except ValueError:
                break
    return out


def flips_block(path: Path, summary: dict) -> Raw:
    """The flips table of a sweep folder whose summary has order.flips (empty markup otherwise)."""
    counts = (summary.get("order") or {}).get("flips")
    if not counts:
        return Raw("")
    causes = list(counts["by_cause"])
    parts = [table(["", *(c.replace("_", " ") for c in causes), "items flipped", "of"],
                   [["primary cause", *(counts["by_cause"][c] for c in causes), counts["items"], counts["of"]],
                    ["any cause", *(counts.get("any_cause", {}).get(c) for c in causes), None, None]],
                   f"flips: items whose verdict differs between orders (near tie: label margin < "
                   f"{counts.get('near_tie_nats')} nats; length: longest / shortest >= {counts.get('longer_ratio')})")]
    shown = _first_flips(path / "flips.jsonl")
    if shown:
        rows = [[f["example_id"], " ".join(map(str, f["chosen"])), f["primary"], ", ".join(f["causes"]),
                 " ".join("-" if m is None else str(m) for m in f.get("margins") or []),
                 " ".join(map(str, f.get("candidate_chars") or []))] for f in shown]
        zero = "the correct one" if summary.get("measure", "accuracy") == "accuracy" else "answers[0]"  # no preferred
        parts.append(table(["item", f"candidate chosen per order (0: {zero})", "primary cause", "causes",
                            "label margins (nats)", "candidate chars"], rows, f"the first {len(shown)} of {counts['items']} flips (flips.jsonl)"))
    elif counts["items"]:
        parts.append(para("flips.jsonl is not in the folder: the flips themselves are not shown."))
    return Raw("".join(parts))


ORDER_FIGURES = (("strict_accuracy", "strict accuracy"), ("consistency", "consistency"), ("conflict_rate", "conflict rate"),
                 ("preference_fairness", "preference fairness"), ("rstd", "RStd"))
NEEDS_GOLD = ("strict_accuracy", "rstd")  # undefined without a right answer (a judge file without "preferred")


def order_cells(s: dict, figures=ORDER_FIGURES) -> list:
    """An order task's figures as '0.620 [0.55, 0.70]' cells ('-' where not defined), then the choice shares."""
    o = s["order"]
    cells = [format_figure(o[k]) if k in o and o[k]["value"] == o[k]["value"] else "-" for k, _ in figures]
    dec = s.get("decision") or {}
    cost = str(dec.get("forward_passes_per_verdict", 1)) + (f" + {dec['calibration_forward_passes']} calibration"
                                                            if "calibration_forward_passes" in dec else "")
    return [*cells, " ".join(f"{fmt(v)}" for v in o["choice_share"]), cost]


def order_table(entries: list[tuple[str, dict]]) -> Raw:
    """Order figures (95% intervals over items) per entry: how the candidates' order moves the verdict."""
    gold = any(s.get("measure", "accuracy") == "accuracy" for _, s in entries)
    figures = tuple(f for f in ORDER_FIGURES if gold or f[0] not in NEEDS_GOLD)
    return table(["entry", *(name for _, name in figures), "chosen by slot", "forward passes per verdict"],
                 [[label, *order_cells(s, figures)] for label, s in entries],
                 "order of the candidates (95% intervals over items" + ("; RStd without one)" if gold else ")"))
