"""Where the gold items sit: one slot (retrieval) or an ordered pair of slots (two-hop reasoning).

A placement is an int `i` (the gold item at slot i) or a pair `(i, j)` (the first-hop item at slot
i, the second-hop item at slot j, i != j). In JSON a pair is the list `[i, j]`; `key` turns either
form back into a hashable placement.

Pair specs (two-hop tasks), for `n` slots:
  connected,disconnected,reversed   the modes of the Pos2Distill paper (Table 5, 20 documents):
                                    connected [0,1] [5,6] [12,13] [17,18]; disconnected [0,8] [5,13]
                                    [6,14] [8,16]; reversed [8,0] [13,5] [14,6] [16,8]. With n != 20 the
                                    starting slots and the distance 8 are scaled by (n-1)/19.
  0:1,5:13                          explicit pairs (first hop : second hop)
  grid | grid:K                     every ordered pair on the slots 0, K, 2K, ... and n-1 (grid: K so
                                    that at most 10 slots per axis)
  all                               every ordered pair i != j
"""

from __future__ import annotations

import math
from typing import Sequence, Union

from ..errors import PosbiasError

Placement = Union[int, tuple[int, int]]
MODES = ("connected", "disconnected", "reversed")
# Table 5 / 8 of the Pos2Distill paper, 20 documents, 0-based
_PAPER_STARTS = {"connected": (0, 5, 12, 17), "disconnected": (0, 5, 6, 8), "reversed": (0, 5, 6, 8)}
_PAPER_DISTANCE, _PAPER_SLOTS = 8, 20


def key(position) -> Placement:
    """A placement from its JSON form ([i, j] -> (i, j))."""
    return tuple(position) if isinstance(position, (list, tuple)) else position


def as_json(position: Placement):
    """A placement as it is written to JSON (a pair as the list [i, j])."""
    return list(position) if isinstance(position, tuple) else position


def label(position) -> str:
    """'3' or '3:5'."""
    p = key(position)
    return f"{p[0]}:{p[1]}" if isinstance(p, tuple) else str(p)


def mode_of(pair: tuple[int, int]) -> str:
    """connected (j = i + 1), reversed (j < i) or disconnected (j > i + 1)."""
    i, j = pair
    return "connected" if j == i + 1 else "reversed" if j < i else "disconnected"


def mode_pairs(mode: str, n: int) -> list[tuple[int, int]]:
    """The paper's four placements of a mode, scaled from 20 slots to n."""
    scale = (n - 1) / (_PAPER_SLOTS - 1)
    dist = 1 if mode == "connected" else max(2, round(_PAPER_DISTANCE * scale))
    if dist > n - 1:  # a gap between the hops needs a slot between them
        raise PosbiasError(f"the {mode} placements need at least 3 slots, and this task has {n}",
                           "use `positions=connected`, `positions=all` or pairs like `positions=1:0`")
    out = []
    for s in _PAPER_STARTS[mode]:
        i = min(round(s * scale), n - 1 - dist)
        pair = (i, i + dist) if mode != "reversed" else (i + dist, i)
        if pair not in out:
            out.append(pair)
    return out


def _grid(spec: str, n: int) -> list[tuple[int, int]]:
    step_text = spec.partition(":")[2]
    try:
        step = int(step_text) if step_text else max(1, math.ceil((n - 1) / 9))
    except ValueError:
        raise PosbiasError(f"bad grid step in {spec!r}", "write it as grid or grid:K with K a whole number") from None
    if step < 1:
        raise PosbiasError(f"the grid step must be >= 1, got {step}", "write it as grid:1 or more")
    slots = sorted(set(range(0, n, step)) | {n - 1})
    return [(i, j) for i in slots for j in slots if i != j]


def _pair(part: str, n: int) -> tuple[int, int]:
    a, sep, b = part.partition(":")
    try:
        i, j = int(a), int(b)
    except ValueError:
        raise PosbiasError(f"bad pair {part!r} in `positions`",
                           "write pairs as FIRST:SECOND slots, e.g. `positions=0:1`") from None
    if not sep:
        raise PosbiasError(f"bad pair {part!r} in `positions`", "write pairs as FIRST:SECOND slots, e.g. `positions=0:1`")
    if i == j:
        raise PosbiasError(f"pair {part} puts both hops in slot {i}", "give the two hops different slots")
    if not (0 <= i < n and 0 <= j < n):
        raise PosbiasError(f"pair {part} is out of range: this task has {n} slots (0..{n - 1})",
                           f"use slots between 0 and {n - 1}")
    return i, j


def positions_spec(value) -> str | None:
    """`positions` as given in Python -> the spec string the tasks read (None stays None: the task's default).

    Accepts the CLI string (`"0,5,9"`, `"all"`, `"0%,50%,100%"`, `"connected"`, `"0:1,8:9"`), one slot (`5`), a
    list or tuple of slots (`[0, 5, 9]`) and, for two-hop tasks, a list of pairs (`[(0, 1), (8, 9)]`)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        value = None  # a bool is an int to Python, never a slot
    elif isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ",".join(map(str, value))
        if all(isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(i, int) for i in v) for v in value):
            return ",".join(f"{i}:{j}" for i, j in value)
    raise PosbiasError(f"`positions` must be slots or a spec string, got {value!r}",
                       "pass a list like [0, 5, 9], one slot like 5, or a string like \"all\" or \"0%,50%,100%\"")


def resolve_pairs(spec: str, n: int) -> list[tuple[int, int]]:
    """A pair spec (module docstring) -> the ordered list of placements, each once."""
    if not spec.strip():
        raise PosbiasError("`positions` is empty", "name the placements, e.g. `positions=connected` or `positions=0:1`")
    out: list[tuple[int, int]] = []
    for part in (p.strip() for p in spec.split(",")):
        if part in MODES:
            new = mode_pairs(part, n)
        elif part == "all":
            new = [(i, j) for i in range(n) for j in range(n) if i != j]
        elif part.startswith("grid"):
            new = _grid(part, n)
        else:
            new = [_pair(part, n)]
        out += [p for p in new if p not in out]
    if not out:
        raise PosbiasError(f"no placements in {spec!r}", "use connected,disconnected,reversed, 0:1,5:13 or grid")
    return out


def resolve_positions(spec: str, n_slots: int) -> list[int]:
    """'all' | '0,4,9' | '0%,50%,100%' (percent of the last slot, rounded) -> sorted slot list."""
    spec = spec.strip()
    if not spec:
        raise PosbiasError("`positions` is empty", "name the slots, e.g. `positions=all` or `positions=0,1`")
    if ":" in spec:
        raise PosbiasError(f"the placements {spec} are pairs of slots (two hops), and this task places one gold item",
                           "name single slots instead (`positions=0,1`), or use a two-hop task such as `task=kv-2hop`")
    if spec == "all":
        return list(range(n_slots))
    out = []
    for part in (p.strip() for p in spec.split(",")):
        try:
            if part.endswith("%"):
                pct = float(part[:-1])
                if not 0 <= pct <= 100:
                    raise ValueError
                out.append(int(round(pct / 100 * (n_slots - 1))))
            else:
                out.append(int(part))
        except ValueError:
            raise PosbiasError(
                f"bad position '{part}' in `positions` {spec}", "use all, a list like 0,4,9, or percents like 0%,50%,100%"
            ) from None
        if not 0 <= out[-1] < n_slots:
            raise PosbiasError(
                f"position {out[-1]} is out of range: this task has {n_slots} slots (0..{n_slots - 1})",
                f"use positions between 0 and {n_slots - 1}",
            )
    return sorted(set(out))


def mode_summary(per: Sequence[dict]) -> dict | None:
    """Per-mode average accuracy of a pair sweep and the gap between the best and worst mode (None for slots)."""
    modes: dict[str, list[float]] = {}
    for r in per:
        p = key(r["position"])
        if isinstance(p, tuple):
            modes.setdefault(mode_of(p), []).append(r["accuracy"])
    if not modes:
        return None
    avg = {m: sum(v) / len(v) for m, v in modes.items()}
    return {"modes": avg, "mode_gap": max(avg.values()) - min(avg.values())}
