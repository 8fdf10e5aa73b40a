"""Where a needle goes in a haystack (tasks/haystack.py): the boundaries it may take, the one nearest an asked depth,
how far that may be from the depth asked, and asked depths that land on one place.

boundary   j = before the haystack's unit j (0: before the first, len: after the last). A needle goes only where a
           sentence has ended: after a unit ending in . ! or ? (closing quotes and brackets kept with it), at the
           haystack's start or end, or where a document starts (a file of a haystack folder, the seam where a
           one-file haystack wraps round to its title page, an nq passage). Never after a title or heading, a colon
           or a dash ("... wrote to the Board as follows:--"), so never inside the passage such a line introduces;
           the haystack itself ends on a sentence's end (a window's last title, colon paragraph or cut passage is
           left out, so a needle at 100% follows a sentence too).
depth      the allowed boundary whose token offset is nearest the asked share of the haystack's tokens; the row
           records the true depth (`needle_depths`)
tolerance  TOLERANCE points of depth: a needle further than that from its asked depth is printed with its true
           depth (the notes under a sweep's table and a grid's, eval/rownotes.py). Measured with SmolLM2's tokenizer
           at 1K tokens, depths 0-100% by 10 over 40 windows: worst 3.5 points on hard-wrapped prose
           (tests/data/keeper.txt, with a title page, a paragraph ending in a colon and a quoted letter, beside
           tests/data/essays; 2.3 on the essays alone, 1.2 at 2K), 4.9 on nq passages (10 windows; 0.9 at 4K, 0.7
           at 8K). The tests' one-character tokenizer is far coarser: 1K tokens hold 540-780 characters of
           keeper.txt (6-12 sentences), the worst is 20.0 points (the title page and the colon's paragraph take no
           needle) and 105 of 440 placements lie beyond the tolerance: what the notes are there to say
distinct   two asked depths that land on one boundary of an example would score one prompt twice under two depths:
           `shared` finds them, and the task (sweep) and the grid refuse them before any row is scored, naming a
           length at which the boundaries lie closer than the depths asked
"""

from __future__ import annotations

import math
import re
from typing import Callable

from ..errors import PosbiasError

TOLERANCE = 5.0  # points of depth (% of the haystack's tokens); measured worst at 1K tokens: 3.6 and 4.9
_ENDS = re.compile(r"[.!?][\"'\u201d\u2019)\]]*$")


def ends_sentence(unit: str) -> bool:
    """Whether a haystack unit ends a sentence (., ! or ?, closing quotes and brackets after it)."""
    return bool(_ENDS.search(unit))


def allowed(units: list[str], starts: set[int]) -> list[int]:
    """The boundaries a needle may take (module docstring): after a sentence's end, at either edge, before a
    document's start (starts: the indices of units that begin one)."""
    n = len(units)
    return [j for j in range(n + 1) if j in (0, n) or j in starts or ends_sentence(units[j - 1])]


def nearest(offsets: list[int], bounds: list[int], pct: float) -> int:
    """The allowed boundary whose token offset is nearest pct% of the haystack's tokens (ties: the earlier)."""
    target = pct / 100 * offsets[-1]
    return min(bounds, key=lambda j: (abs(offsets[j] - target), j))


def shared(offsets: list[int], bounds: list[int], slots: list[int]) -> dict | None:
    """The first asked slots (0.1% steps) that land on one boundary, with what the refusal says: the depths, the true
    depth, the widest gap between allowed boundaries (tokens) and the closest asked spacing (points); None if every
    asked slot has a place of its own."""
    on: dict[int, list[int]] = {}
    for s in sorted(set(slots)):
        on.setdefault(nearest(offsets, bounds, s / 10), []).append(s)
    clash = next((ss for ss in on.values() if len(ss) > 1), None)
    if clash is None:
        return None
    asked = sorted(set(slots))
    spacing = min(b - a for a, b in zip(asked, asked[1:])) / 10
    gap = max(offsets[b] - offsets[a] for a, b in zip(bounds, bounds[1:]))
    return {"depths": [s / 10 for s in clash], "true": round(100 * offsets[nearest(offsets, bounds, clash[0] / 10)]
                                                             / offsets[-1], 2),
            "gap": gap, "haystack": offsets[-1], "spacing": spacing}


def longer(tokens: int, info: dict) -> int:
    """A length at which the boundaries of this haystack lie closer than the asked depths: the widest gap under the
    closest spacing (rounded up to 64 tokens)."""
    need = tokens - info["haystack"] + math.ceil(100 * info["gap"] / info["spacing"]) + 1
    return 64 * math.ceil(max(need, tokens + 1) / 64)


def apart(tokens: int, info: dict, clash: Callable[[int], dict | None]) -> int:
    """A length at which the asked depths land apart: `longer`'s estimate, checked (clash(t): the clash at length t,
    or None) and raised again up to 4 times (a longer window can reach a longer stretch without a sentence end)."""
    for _ in range(4):
        tokens = longer(tokens, info)
        try:
            info = clash(tokens)
        except PosbiasError:  # the haystack cannot fill that length: the fix's other choices stand
            return tokens
        if info is None:
            break
    return tokens


def shared_problem(ex_id: str, tokens: int, info: dict) -> str:
    """The refusal's problem: which depths share a place, where, and why."""
    depths = " and ".join(f"{d:g}%" for d in info["depths"])
    return (f"at {tokens} tokens the depths {depths} put the needle of {ex_id} at one place ({info['true']:g}% of the "
            f"haystack): a needle goes only after a sentence's end, and here those lie up to {info['gap']} tokens "
            f"({100 * info['gap'] / info['haystack']:.0f}% of the haystack) apart, the depths asked only "
            f"{info['spacing']:g}% apart")


def joined(units: list[str], seams: set[int], inserts: dict[int, list[str]]) -> str:
    """The haystack's text: its units joined by spaces, a paragraph break before each unit in `seams` (a file's
    start), and the texts `inserts[j]` before unit j (j = len(units): after the last); a needle at a seam goes
    before the break, after the sentence that ends the file."""
    out = []
    for j in range(len(units) + 1):
        out += [" " + t for t in inserts.get(j, ())]
        if j < len(units):
            out.append(("\n\n" if j in seams else " ") + units[j])
    return "".join(out).lstrip()


def sigmoid_depths(n: int) -> list[float]:
    """NIAH's sigmoid spacing (gkamradt/LLMTest_NeedleInAHaystack, `logistic`): n points, denser at both ends,
    0% and 100% kept exact, rounded to the 0.1% slots."""
    xs = [100 * i / (n - 1) for i in range(n)]
    return [x if x in (0, 100) else round(100 / (1 + math.exp(-0.1 * (x - 50))), 1) for x in xs]
