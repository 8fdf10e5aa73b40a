"""PINE (Wang et al., ICLR 2025, arXiv:2407.01100): position-invariant inference over a prompt's items, as a
training-free Method. The attention is models/pine.py (Sec. 3.3: bidirectional between documents, causal within,
positions re-assigned by importance computed without RoPE, each document last when it queries); models/pine_hook.py
puts it in every layer of a RoPE model. This wrapper tells the model which tokens are which item.

    pine                  the method
    pine:reversed         more important items further from the query (Sec. 3.4; the paper's "reversed" ablation)
    pine:fixed            bidirectional, no re-assignment (the paper's "none" ablation)
    pine:causal           re-assignment on the causal mask (the mask left out; not in the paper: the check that
                          the proof needs it)
    pine:nia              no inter-document attention (NIA)
    pcw is pine:pcw       Parallel Context Windows (Ratner et al. 2023): masked, every item at the same positions

Token classes (`token_classes`): an item's tokens are one document; tokens before the first item are the prefix,
after the last the suffix (question, answer prefix, answer). The separator between two items (the "\n" between two
facts) is a document of its own: the separators are the same tokens between every pair, so moving the items only
permutes the documents (items and separators), which PINE's output does not depend on. (Attaching a separator to an
item instead would leave one item without it, the first or the last, and that item would change with its slot.)
Items whose text carries its slot (a judge's "[Answer A]" label, NQ's "Document [3]") change with the order, and so
do the outputs: PINE removes the order's effect, not the labels'.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ..errors import PosbiasError
from ..models.load import Loaded
from ..models.pine import VARIANTS
from ..models.pine_plan import IDENTITY, PREFIX, SUFFIX, canonical_order
from ..tasks import Task
from .base import Active, Method, refuse_without_items
from .registry import register_method


def token_classes(span_of: list[int], n_items: int, n_prompt: int) -> list[int]:
    """Each prompt token's class (module docstring) from scoring/spans.py's span ids (items 0..n-1, then the first
    token and the rest); n_prompt: the encoded prompt's length (tokens past the spans' are SUFFIX). The separator
    between items k and k+1 is document n + k."""
    items = [t for t, s in enumerate(span_of) if s < n_items]
    lo, hi = items[0], items[-1]
    out, last = [], -1
    for t, s in enumerate(span_of):
        if s < n_items:
            out.append(s)
            last = s
        else:
            out.append(PREFIX if t < lo else SUFFIX if t > hi else n_items + last)  # between items: a separator
    return out + [SUFFIX] * (n_prompt - len(out))


def row_classes(row, view) -> list[int]:
    """A row's (scoring.encode.Encoded) prompt token classes, from its item spans as the Scorer encodes it."""
    spans = view.item_spans(row.prompt)
    return token_classes(spans.span_of, spans.n_items, len(row.prompt_ids))


def shape(classes: list[int], ids: list[int]) -> tuple:
    """A prompt's classes in PINE's canonical column order (models/pine_plan.canonical_order), as (class, run
    length) pairs: what sizes its key blocks and plan."""
    cls = torch.tensor([classes])
    got = canonical_order(cls, torch.tensor([ids]), max(1, max(classes) + 1), cls.shape[1])
    values, counts = torch.unique_consecutive((cls if got is IDENTITY else got[1])[0], return_counts=True)
    return tuple(zip(values.tolist(), counts.tolist()))


@register_method
class Pine(Method):
    """PINE (Wang et al. 2025): bidirectional attention between items, positions re-assigned by importance; the
    outputs do not depend on the items' order."""

    name = "pine"
    usage = "pine[:reversed|fixed|causal|nia|pcw]"
    prefix_note = "PINE lets each item attend to the others and re-assigns positions per prompt"
    reads_attention = True  # it replaces the model's attention: in process only

    def __init__(self, variant: str = "pine"):
        if variant not in VARIANTS:
            raise PosbiasError(f"unknown PINE variant {variant!r}", f"write pine or pine:{'|'.join(VARIANTS[1:])}")
        self.variant = variant
        self._known: dict = {}  # tuple(prompt ids) -> classes, from batch_keys, until the row's batch runs

    @classmethod
    def from_spec(cls, arg: str) -> "Pine":
        return cls(arg or "pine")

    @property
    def label(self) -> str:
        return "pine" if self.variant == "pine" else f"pine:{self.variant}"

    def config(self) -> dict:
        return {"name": "pine", "variant": self.variant}

    def check_task(self, task: Task, positions=None, engine: str | None = None) -> None:
        refuse_without_items(self, task)

    def check(self, loaded: Loaded) -> None:
        from ..models.pine_hook import check_model

        check_model(loaded.model)

    def batch_keys(self, rows, view) -> list:
        """Each row's shape in the canonical order (models/pine.py: the documents by their token ids): its prefix's,
        documents' and suffix's lengths. Rows of one shape (and length) share a padded batch, as one example's orders
        do, and change nothing of each other's computation; rows of another shape would resize the key blocks."""
        out = []
        for r in rows:  # the classes kept for the batch's set_rows (the spans re-tokenize the prompt)
            key = tuple(r.prompt_ids)
            if key not in self._known:
                self._known[key] = row_classes(r, view)
            out.append(shape(self._known[key], r.prompt_ids))
        return out

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        from ..models.pine_hook import pine

        self._known = {}
        try:
            with pine(loaded.model, self.variant) as handle:
                yield _PineActive(handle, self._known)
        finally:
            self._known = {}


class _PineActive(Active):
    """Before each batch: every prompt's token classes, keyed by its token ids (the hook matches the rows)."""

    def __init__(self, handle, known: dict):
        self.handle, self.known = handle, known

    def set_rows(self, rows, view=None) -> None:
        self.handle.prompts = {}
        for r in rows:
            key = tuple(r.prompt_ids)
            self.handle.prompts[key] = self.known.pop(key, None) or row_classes(r, view)
