"""What a run's rows say beside their scores: counted in a sweep's summary (sweep.json) and printed under its table,
and under each length of a grid (`sweep` and `grid` print the same lines).

cut          generated answers that the generation limit stopped before a newline or the end of the turn
             (`row["cut"]`): {"rows", "of", "max_new_tokens"}; among them `loops` (only when there are some), the
             answers that repeat themselves up to the limit ("The answer is: The answer is: ..."), with
             `loop_example` (the first, shortened). The advice differs: an answer cut mid-way may need a higher
             max_new_tokens; a loop would not end with more tokens, so it is named as a loop, not as a short limit.
loop         `is_loop`: the answer's end repeats one unit (1 or more characters, white space collapsed) at least
             LOOP_REPEATS times over at least half the answer and at least LOOP_CHARS characters; the last copy may
             be cut mid-way (the limit cuts anywhere)
true_depths  niah rows (tasks/haystack.py records each needle's true depth, `needle_depths`): per asked depth
             (slot = 10 x percent), the needles' mean true depth, the one furthest from the asked depth, and how many
             lie further than tasks/depths.py's TOLERANCE from it; printed only where some do
"""

from __future__ import annotations

from ..tasks.depths import TOLERANCE

LOOP_REPEATS, LOOP_CHARS = 3, 20


def is_loop(text: str) -> bool:
    """Whether the answer ends in a repetition loop (module docstring)."""
    t = " ".join(text.split())
    n = len(t)
    for p in range(1, n // LOOP_REPEATS + 1):
        k = 0  # t[n-k-p:] has period p
        while k + p < n and t[n - 1 - k] == t[n - 1 - k - p]:
            k += 1
        if k + p >= max(LOOP_REPEATS * p, LOOP_CHARS, (n + 1) // 2):
            return True
    return False


def row_notes(rows: list[dict], max_new_tokens: int | None) -> dict:
    """The summary's `cut` (generated rows) and `true_depths` (niah rows) entries, each only where rows carry it."""
    out: dict = {}
    generated = [r for r in rows if "cut" in r]
    if generated:
        cut = [r for r in generated if r["cut"]]
        out["cut"] = {"rows": len(cut), "of": len(generated), "max_new_tokens": max_new_tokens}
        loops = [r for r in cut if is_loop(r.get("prediction") or "")]
        if loops:
            example = " ".join(loops[0]["prediction"].split())
            out["cut"].update(loops=len(loops), loop_example=example[:60] + (" ..." if len(example) > 60 else ""))
    depths = true_depths(rows)
    if depths:
        out["true_depths"] = depths
    return out


def true_depths(rows: list[dict]) -> list[dict]:
    """Per asked slot of niah rows: asked depth, mean true depth, the furthest, rows and rows beyond the tolerance."""
    per: dict[int, list[float]] = {}
    for r in rows:
        if r.get("needle_depths") and isinstance(r.get("position"), int):
            per.setdefault(r["position"], []).append(r["needle_depths"][0])
    out = []
    for p, ds in sorted(per.items()):
        asked = p / 10
        worst = max(ds, key=lambda d: (abs(d - asked), d))
        out.append({"position": p, "asked": asked, "mean": round(sum(ds) / len(ds), 2), "worst": worst, "n": len(ds),
                    "off": sum(abs(d - asked) > TOLERANCE for d in ds)})
    return out


def format_cut(c: dict | None) -> list[str]:
    """The advice on answers the limit cut: those cut mid-way, and those that loop."""
    if not c or not c.get("rows"):
        return []
    lines, loops = [], c.get("loops", 0)
    if c["rows"] > loops:
        lines.append(f"{c['rows'] - loops} of {c['of']} answers reached the {c['max_new_tokens']}-token limit unfinished: "
                     "raise max_new_tokens (--max-new-tokens) if they were cut mid-answer")
    if loops:
        lines.append(f"{loops} of {c['of']} answers reached the {c['max_new_tokens']}-token limit repeating themselves "
                     f"(e.g. {c['loop_example']!r}): they loop, and more tokens would not end them, so raising "
                     "max_new_tokens does not help (the prompt, its chat template or answer prefix sets the model "
                     "looping); they are scored as they stand")
    return lines


def format_depths(depths: list[dict] | None) -> list[str]:
    """One line per asked depth with needles further than the tolerance from it, with their true depths."""
    return [f"depth {d['asked']:g}%: {d['off']} of {d['n']} needles sit more than {TOLERANCE:g} points away (true "
            f"depth {d['mean']:g}% on average, furthest {d['worst']:g}%): no sentence ends nearer "
            "(docs/long-context.md, depth)" for d in depths or () if d["off"]]


def format_notes(summary: dict) -> list[str]:
    """The lines `sweep` prints under its table (and `grid` under each length): cut answers, needles off depth."""
    return format_cut(summary.get("cut")) + format_depths(summary.get("true_depths"))
