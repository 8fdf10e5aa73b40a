"""The report's blocks for a depth x length grid in tokens (task niah, eval/longctx.py): the closed-book and
needle-alone references, each length's fill of the window, ratio to the needle alone and curve shape, and the
effective length. Numbers as grid.json holds them; nothing is recomputed."""

from __future__ import annotations

from .blocks import Raw, fmt, para, table


def long_blocks(record: dict) -> str:
    """The niah blocks of a grid record; "" for any other grid (lengths not in tokens, or no references)."""
    refs = record.get("references")
    if record.get("size_option") != "tokens" or not isinstance(refs, dict):
        return ""
    eff = record.get("effective") or {}
    return "".join([references_table(refs), lengths_table(record["sizes"], eff), para(effective_sentence(eff, record))])


def _ci(lo, hi, signed: bool = False) -> str:
    f = (lambda v: "-" if v is None else f"{v:+.3f}") if signed else fmt
    return f"[{f(lo)}, {f(hi)}]"


def references_table(refs: dict) -> Raw:
    """Closed-book (no context) and needle alone (no haystack): accuracy with its 95% Wilson interval."""
    rows = [[name, r.get("accuracy"), _ci(r.get("ci_low"), r.get("ci_high")), r.get("n"), r.get("correct")]
            for name, r in (("closed-book", refs.get("closed")), ("needle alone", refs.get("needle"))) if r]
    return table(["reference", "accuracy", "95% CI", "n", "correct"], rows,
                 "references: closed-book (no context) and the needle alone (no haystack)")


def _contrast(c: dict | None) -> str:
    if not c:
        return "-"
    lo, hi = (c.get("ci") or [None, None])[:2]
    return f"{c['difference']:+.3f} {_ci(lo, hi, signed=True)}"


def lengths_table(sizes: list[dict], eff: dict) -> Raw:
    """Per length: tokens, fill of the window, average accuracy, ratio to the needle alone [95% CI], whether it keeps
    the threshold, the curve's shape with its two contrasts (first - interior, last - interior)."""
    threshold = eff.get("threshold")
    ratio = {r["length"]: r for r in eff.get("ratios") or []}
    rows = []
    for s in sizes:
        summ, r = s.get("summary") or {}, ratio.get(s["size"], {})
        sh = summ.get("shape") or {}
        fill = s.get("fill")
        rows.append([s["size"], round((s.get("tokens") or {}).get("mean") or 0), "-" if fill is None else f"{fill:.1%}",
                     summ.get("average", r.get("accuracy")), r.get("ratio"), _ci(*(r.get("ci") or [None, None])[:2]),
                     r.get("keeps"), sh.get("shape", "-"), _contrast(sh.get("first")), _contrast(sh.get("last"))])
    keeps = f"keeps ≥{threshold:.0%}" if threshold is not None else "keeps threshold"
    head = ["length (tokens)", "prompt tokens (mean)", "fill of window", "average accuracy", "ratio to needle alone",
            "ratio 95% CI", keeps, "shape", "first − interior [95% CI]", "last − interior [95% CI]"]
    return table(head, rows, "per length: accuracy relative to the needle alone, and the shape of the depth curve")


def effective_sentence(eff: dict, record: dict) -> str:
    """One sentence: the effective length with its 95% CI, or why there is none."""
    if not eff:
        return "Effective length: not in grid.json."
    threshold = eff.get("threshold", 0.85)
    window = f" of the model's {record['window']}-token window" if record.get("window") else ""
    length = eff.get("effective_length")
    if length is None:
        return f"Effective length: none — {eff.get('note') or 'no needle-alone score to relate the lengths to'}."
    ci = eff.get("ci") or [None, None]
    rule = (f"the longest length that, with every shorter one, keeps ≥{threshold:.0%} of the needle-alone score "
            f"of {fmt(eff.get('short_context'))}")
    if length == 0:
        return (f"Effective length ({rule}): 0 tokens — no length keeps {threshold:.0%} of the needle-alone score; "
                f"95% CI [{ci[0]}, {ci[1]}] tokens (paired bootstrap over examples).")
    return (f"Effective length ({rule}): {length} tokens{window}, 95% CI [{ci[0]}, {ci[1]}] tokens "
            "(paired bootstrap over examples; 0 = below the shortest length).")
