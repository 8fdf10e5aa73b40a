"""Attention Buckets (Chen et al. 2023b): several RoPE bases in one batched forward, the copies'
outputs combined. The model-side work is in models/buckets.py; this is the Method wrapper.

Base lists: `buckets:tool` (the original ToolBench list) and `buckets:rag` (the original RAG list), both
relative to Llama-2's theta 1e4 and scaled to the model's own; `buckets:B1,B2,...` absolute bases as given.
Plain `buckets` picks by task (`for_task`): the RAG list where the task's items are documents (nq, musique,
jsonl files), the tool list otherwise (kv-lookup, kv-uuid, kv-2hop); run records name the list chosen.
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager

from ..errors import PosbiasError
from ..models.load import Loaded
from ..tasks import Task
from .base import Active, Method, active_while
from .registry import register_method

NAMED = ("tool", "rag")  # the original code's two lists (models/buckets.py TOOLBENCH_BASES, RAG_BASES)


@register_method
class Buckets(Method):
    """Attention Buckets (Chen et al. 2023b): several RoPE bases in one batched forward, the copies' outputs combined."""

    name = "buckets"
    prefix_note = "Attention Buckets runs several RoPE copies of the whole prompt and combines them"
    usage = "buckets[:rag|:tool|:B1,B2,...]"

    def __init__(self, bases: tuple[float, ...] | str | None = None):
        """bases: None (the list chosen by task), "tool" / "rag" (a named list), or absolute RoPE bases."""
        if isinstance(bases, str):
            if bases not in NAMED:
                raise PosbiasError(f"unknown bucket base list {bases!r}", "use buckets:rag, buckets:tool or buckets:B1,B2,...")
        elif bases is not None and (not bases or any(not b > 1 for b in bases)):
            raise PosbiasError(f"RoPE bases must be numbers > 1, got {bases}", "e.g. buckets:10000,17500,20000")
        self.bases = bases

    @classmethod
    def from_spec(cls, arg: str) -> "Buckets":
        if not arg:
            return cls()
        if arg in NAMED:
            return cls(arg)
        try:
            return cls(tuple(float(x) for x in arg.split(",")))
        except ValueError:
            raise PosbiasError(f"bad bucket bases {arg!r}",
                               "write them as buckets:rag, buckets:tool or buckets:B1,B2,..., e.g. buckets:10000,20000") from None

    def for_task(self, task: Task) -> "Buckets":
        """Plain `buckets` on `task`: the RAG list where its items are documents (Task.documents), else the tool list."""
        if self.bases is not None:
            return self
        resolved = copy.copy(self)  # keeps spec and fitted_on
        resolved.bases = "rag" if getattr(task, "documents", False) else "tool"
        return resolved

    @property
    def label(self) -> str:
        return f"buckets:{self.bases}" if isinstance(self.bases, str) else "buckets"

    def config(self) -> dict:
        if isinstance(self.bases, str):  # a named list: the original code's values, scaled to the model's rope_theta
            from ..models.buckets import RAG_BASES, REFERENCE_THETA, TOOLBENCH_BASES

            listed = RAG_BASES if self.bases == "rag" else TOOLBENCH_BASES
            return {"name": "buckets", "list": self.bases, "reference_bases": list(listed),
                    "reference_theta": REFERENCE_THETA}
        if self.bases is None:  # not resolved by a task (pipelines always resolve): apply() uses the tool list
            return {"name": "buckets", "list": "by task"}
        return {"name": "buckets", "bases": list(self.bases)}

    def check(self, loaded: Loaded) -> None:
        from ..models.rope import rope_info

        rope_info(loaded.model)

    def apply(self, loaded: Loaded) -> AbstractContextManager[Active]:
        from ..models.buckets import attention_buckets, default_bases

        if self.bases is None or isinstance(self.bases, str):  # None: no task given, the original default list
            return active_while(attention_buckets(loaded.model, bases=default_bases(loaded.model, rag=self.bases == "rag")))
        return active_while(attention_buckets(loaded.model, bases=self.bases))
