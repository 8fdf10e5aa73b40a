"""The flips of an order-task sweep in the report: counts by cause (summary.order.flips) and the first FLIPS_SHOWN
items of the folder's flips.jsonl (eval/judging.py writes both; nothing is recomputed here)."""

from __future__ import annotations

import json
from pathlib import Path

from .blocks import Raw, para, table

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
        parts.append(table(["item", "candidate chosen per order", "primary cause", "causes", "label margins (nats)",
                            "candidate chars"], rows, f"the first {len(shown)} of {counts['items']} flips (flips.jsonl)"))
    elif counts["items"]:
        parts.append(para("flips.jsonl is not in the folder: the flips themselves are not shown."))
    return Raw("".join(parts))
