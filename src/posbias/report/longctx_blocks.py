"""The report's blocks for a depth x length grid in tokens (task niah, eval/longctx.py): the closed-book and
needle-alone references and NoLiMa's base, each length's fill of the window, its ratio to each base and curve shape,
RULER's partial credit where several values are asked, and the effective length under each base. Numbers as
grid.json holds them; nothing is recomputed."""

from __future__ import annotations

from .blocks import Raw, fmt, para, table

BASE_NAMES = {"nolima_base": "NoLiMa base", "needle_alone": "needle alone"}  # grid.json key -> its name everywhere


def effective_bases(eff: dict | None) -> dict[str, dict]:
    """grid.json's `effective` per base ({"nolima_base": ..., "needle_alone": ...}); a grid written before there
    were two bases held the needle-alone one alone, and reads as that."""
    if not eff:
        return {}
    if "needle_alone" in eff or "nolima_base" in eff:
        return {k: eff[k] for k in BASE_NAMES if eff.get(k)}
    return {"needle_alone": {**eff, "base": eff.get("short_context")}}


def long_blocks(record: dict) -> str:
    """The niah blocks of a grid record; "" for any other grid (lengths not in tokens, or no references)."""
    refs = record.get("references")
    if record.get("size_option") != "tokens" or not isinstance(refs, dict):
        return ""
    bases = effective_bases(record.get("effective"))
    return "".join([references_table(refs, bases), lengths_table(record["sizes"], bases),
                    *(para(effective_sentence(b, record, BASE_NAMES[k])) for k, b in bases.items()),
                    *([] if bases else [para("Effective length: not in grid.json.")])])


def _ci(lo, hi, signed: bool = False) -> str:
    f = (lambda v: "-" if v is None else f"{v:+.3f}") if signed else fmt
    return f"[{f(lo)}, {f(hi)}]"


def references_table(refs: dict, bases: dict | None = None) -> Raw:
    """Closed-book (no context), needle alone (no haystack) with 95% Wilson intervals, and NoLiMa's base (the grid's
    own accuracy at its lengths <= 1K, each example's best) with its 95% interval."""
    rows = [[name, r.get("accuracy"), _ci(r.get("ci_low"), r.get("ci_high")), r.get("n"), r.get("correct")]
            for name, r in (("closed-book", refs.get("closed")), ("needle alone", refs.get("needle"))) if r]
    nolima = (bases or {}).get("nolima_base")
    if nolima:
        at = ", ".join(map(str, nolima.get("base_lengths") or [])) or "none <= 1K: unavailable"
        rows.append([f"NoLiMa base (lengths {at})", nolima.get("base"), _ci(*(nolima.get("base_ci") or [None, None])),
                     nolima.get("n"), "-"])
    return table(["reference", "accuracy", "95% CI", "n", "correct"], rows,
                 "references: closed-book (no context), the needle alone (no haystack), and NoLiMa's base (the task "
                 "itself at the grid's lengths <= 1K tokens, each example's best length, averaged)")


def _contrast(c: dict | None) -> str:
    if not c:
        return "-"
    lo, hi = (c.get("ci") or [None, None])[:2]
    return f"{c['difference']:+.3f} {_ci(lo, hi, signed=True)}"


def lengths_table(sizes: list[dict], bases: dict) -> Raw:
    """Per length: tokens, fill of the window, average accuracy (all-or-nothing), RULER's partial credit where
    several values are asked, then per base the ratio [95% CI] and whether it keeps the threshold, and the curve's
    shape with its two contrasts (first - interior, last - interior)."""
    partial = any("partial" in s for s in sizes)
    ratios = {k: {r["length"]: r for r in b.get("ratios") or []} for k, b in bases.items()}
    rows = []
    for s in sizes:
        summ = s.get("summary") or {}
        sh, fill = summ.get("shape") or {}, s.get("fill")
        row = [s["size"], round((s.get("tokens") or {}).get("mean") or 0), "-" if fill is None else f"{fill:.1%}",
               summ.get("average")] + ([s.get("partial")] if partial else [])
        for k in bases:
            r = ratios[k].get(s["size"], {})
            hi = (r.get("ci") or [None, None])[1]
            row += [r.get("ratio"), _ci((r.get("ci") or [None])[0], hi) if r else "[-, -]", r.get("keeps")]
        rows.append(row + [sh.get("shape", "-"), _contrast(sh.get("first")), _contrast(sh.get("last"))])
    head = ["length (tokens)", "prompt tokens (mean)", "fill of window", "average accuracy (all-or-nothing)"]
    head += ["RULER partial credit (share of values found)"] if partial else []
    for k, b in bases.items():
        t = b.get("threshold")
        head += [f"ratio to {BASE_NAMES[k]}", "95% CI", f"keeps ≥{t:.0%} of {BASE_NAMES[k]}" if t else "keeps"]
    head += ["shape", "first − interior [95% CI]", "last − interior [95% CI]"]
    return table(head, rows, "per length: accuracy relative to each base, and the shape of the depth curve")


def effective_sentence(eff: dict, record: dict, name: str = "needle alone") -> str:
    """One sentence: the effective length against one base (`name`) with its 95% CI, or why there is none."""
    if not eff:
        return f"Effective length vs {name}: not in grid.json."
    threshold = eff.get("threshold", 0.85)
    window = f" of the model's {record['window']}-token window" if record.get("window") else ""
    length = eff.get("effective_length")
    if length is None:
        return f"Effective length vs {name}: none — {eff.get('note') or f'no {name} score to relate the lengths to'}."
    ci = eff.get("ci") or [None, None]
    rule = f"the longest length that, with every shorter one, keeps ≥{threshold:.0%} of the {name} score of " \
           f"{fmt(eff.get('base'))}"
    if length == 0:
        return (f"Effective length vs {name} ({rule}): 0 tokens — no length keeps {threshold:.0%} of the {name} "
                f"score; 95% CI [{ci[0]}, {ci[1]}] tokens.")
    return (f"Effective length vs {name} ({rule}): {length} tokens{window}, 95% CI [{ci[0]}, {ci[1]}] tokens "
            "(0 = below the shortest length).")
