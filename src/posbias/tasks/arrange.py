"""Rearranging a prompt's items without rebuilding it: the items (`Prompt.items`, verbatim in the user text, in slot
order) are found left to right and written back in another order, or one of them replaced by a content-free
item. What lies between the items (the instruction, separators, the question) stays as it is, and so does a slot's
label (`Task.slot_label`, e.g. the "Document [3]" of a search-result line): only the bodies move.

    arrange(prompt, order, label)        slot s shows the body that slot order[s] showed
    with_dummy(prompt, slot, label, d)   slot `slot` shows the body d (attention calibration's dummy document)

`position` (the row key: where the task put the gold) is kept, so a reordered row is reported at the slot the
gold was given at; `gold_slot` says where it went.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from ..errors import PosbiasError
from .base import Prompt


def char_ranges(text: str, items: Sequence[str], start: int, example_id: str) -> list[tuple[int, int]]:
    """(begin, end) of each item in `text`, searched in order from `start` (so repeated texts map in order); an
    error if one is missing. The one item finder: scoring/spans.py maps the same ranges to tokens."""
    out, cursor = [], start
    for k, item in enumerate(items):
        a = text.find(item, cursor) if item else -1
        if a < 0:
            raise PosbiasError(
                f"item {k} of example {example_id} is not found verbatim in its prompt ({item[:40]!r})",
                "make `Task.items` return the item texts exactly as `build` writes them, in prompt order",
            )
        out.append((a, a + len(item)))
        cursor = a + len(item)
    return out


def _ranges(prompt: Prompt) -> list[tuple[int, int]]:
    if not prompt.items:
        raise PosbiasError(f"example {prompt.example_id} lists no items to rearrange",
                           "use a task that lists its items (kv-lookup, kv-uuid, nq, jsonl:PATH)")
    return char_ranges(prompt.user, prompt.items, 0, prompt.example_id)


def split_label(item: str, label: str | None) -> tuple[str, str]:
    """(the slot's label, the body) of an item; no label pattern (or no match): ("", item)."""
    m = re.match(label, item) if label else None
    return (item[: m.end()], item[m.end():]) if m else ("", item)


def _rebuild(prompt: Prompt, items: list[str]) -> Prompt:
    ranges, parts, last = _ranges(prompt), [], 0
    for (a, b), item in zip(ranges, items):
        parts += [prompt.user[last:a], item]
        last = b
    return replace(prompt, user="".join(parts) + prompt.user[last:], items=tuple(items))


def arrange(prompt: Prompt, order: Sequence[int], label: str | None = None) -> Prompt:
    """The prompt with slot s showing the body slot order[s] showed (order: a permutation of the slots)."""
    n = len(prompt.items)
    if sorted(order) != list(range(n)):
        raise PosbiasError(f"{list(order)} is not an order of {n} slots", "pass a permutation of 0..n-1")
    parts = [split_label(t, label) for t in prompt.items]
    return _rebuild(prompt, [parts[s][0] + parts[order[s]][1] for s in range(n)])


def with_dummy(prompt: Prompt, slot: int, label: str | None, dummy: str) -> Prompt:
    """The prompt with the body of `slot` replaced by the content-free `dummy` (its label kept)."""
    items = list(prompt.items)
    head, _ = split_label(items[slot], label)
    items[slot] = head + (" " if head and not dummy.startswith((" ", "(")) else "") + dummy
    return _rebuild(prompt, items)


def gold_slot(position: int, order: Sequence[int]) -> int:
    """Where the body first shown at slot `position` is after `arrange(..., order)`."""
    return list(order).index(position)
