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

from ..errors import PosbiasError
from ..models.load import Loaded
from ..models.pine import VARIANTS
from ..models.pine_plan import PREFIX, SUFFIX
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

    def batch_keys(self, rows, reader) -> list:
        """Each row's shape in the canonical order (models/pine.py: the documents by their token ids): its prefix's,
        documents' and suffix's lengths. Rows of one shape (and length) share a padded batch, as one example's orders
        do, and change nothing of each other's computation; rows of another shape would resize the key blocks."""
        out = []
        for r in rows:
            spans = reader.item_spans(r.prompt)
            cls = token_classes(spans.span_of, spans.n_items, len(r.prompt_ids))
            docs: dict = {}
            for t, c in zip(r.prompt_ids, cls):
                docs.setdefault(c, []).append(t)
            lengths = [len(docs[c]) for c in sorted((c for c in docs if c >= 0), key=lambda c: (docs[c], c))]
            out.append((len(docs.get(PREFIX, ())), tuple(lengths), len(docs.get(SUFFIX, ()))))
        return out

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        from ..models.pine_hook import pine

        with pine(loaded.model, self.variant) as handle:
            yield _PineActive(handle)


class _PineActive(Active):
    """Before each batch: every prompt's token classes, keyed by its token ids (the hook matches the rows)."""

    def __init__(self, handle):
        self.handle = handle

    def set_rows(self, rows, reader=None) -> None:
        self.handle.prompts = {}
        for r in rows:
            spans = reader.item_spans(r.prompt)
            self.handle.prompts[tuple(r.prompt_ids)] = token_classes(spans.span_of, spans.n_items, len(r.prompt_ids))
