"""Item spans: which tokens of an encoded prompt belong to each item (fact / document / pair).

The prompt is rendered exactly as `encode` renders it (chat template, answer prefix), tokenised with
the offset mapping, and each item text (`Task.items`, prompt order) is searched for verbatim in the
rendered text, left to right, so repeated texts map in order. A token belongs to an item when its
characters overlap the item's; the first token (the attention sink) and everything else (instruction,
question, chat template, answer prefix) are two more spans. Span ids per token:

    0 .. n_items-1   the items, in prompt order (slot k)
    n_items          FIRST: the first token
    n_items + 1      OTHER: every remaining token
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PosbiasError
from ..tasks.arrange import char_ranges
from ..tasks.base import Prompt
from .encode import render


@dataclass(frozen=True)
class Spans:
    """Token ids of one prompt and the span id of every token (module docstring)."""

    ids: list[int]
    span_of: list[int]  # one span id per token
    n_items: int

    @property
    def first(self) -> int:
        return self.n_items

    @property
    def other(self) -> int:
        return self.n_items + 1

    @property
    def n_spans(self) -> int:
        return self.n_items + 2

    def tokens(self, span: int) -> list[int]:
        """Token indices of one span."""
        return [k for k, s in enumerate(self.span_of) if s == span]


def item_spans(tokenizer, prompt: Prompt, items: list[str], chat: bool) -> Spans:
    """Spans of `items` (in prompt order) in the prompt as `encode(tokenizer, prompt, chat)` tokenises it."""
    if not items:
        raise PosbiasError(f"example {prompt.example_id} has no items", "give the task at least one item")
    text = render(tokenizer, prompt, chat)
    enc = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    user_at = text.find(prompt.user)
    ranges = char_ranges(text, items, max(user_at, 0), prompt.example_id)
    n = len(items)
    span_of = [n + 1] * len(ids)
    k = 0
    for t, (s, e) in enumerate(offsets):
        if e <= s:
            continue  # special tokens carry an empty range
        while k < n and ranges[k][1] <= s:
            k += 1
        if k < n and ranges[k][0] < e:  # overlaps item k (the first item it touches, so spans stay disjoint)
            span_of[t] = k
    span_of[0] = n  # the first token is the sink span whatever it holds
    missing = [j for j in range(n) if j not in span_of]
    if missing:
        raise PosbiasError(f"item {missing[0]} of example {prompt.example_id} covers no token of its own",
                           "use items of at least a few characters, separated by other text")
    return Spans(ids, span_of, n)
