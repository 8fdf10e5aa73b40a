"""Attention Buckets (Chen et al. 2023b): several RoPE bases in one batched forward, the copies'
outputs combined. The model-side work is in models/buckets.py; this is the Method wrapper."""

from __future__ import annotations

from contextlib import AbstractContextManager

from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Active, Method, active_while
from .registry import register_method


@register_method
class Buckets(Method):
    name = "buckets"
    usage = "buckets[:B1,B2,...]"

    def __init__(self, bases: tuple[float, ...] | None = None):
        if bases is not None and (not bases or any(not b > 1 for b in bases)):
            raise PosbiasError(f"RoPE bases must be numbers > 1, got {bases}", "e.g. buckets:10000,17500,20000")
        self.bases = bases

    @classmethod
    def from_spec(cls, arg: str) -> "Buckets":
        if not arg:
            return cls()
        try:
            return cls(tuple(float(x) for x in arg.split(",")))
        except ValueError:
            raise PosbiasError(f"bad bucket bases {arg!r}", "write them as buckets:B1,B2,..., e.g. buckets:10000,20000") from None

    def config(self) -> dict:
        return {"name": "buckets", "bases": list(self.bases) if self.bases else "default"}

    def check(self, loaded: Loaded) -> None:
        from ..models.rope import rope_info

        rope_info(loaded.model)

    def apply(self, loaded: Loaded) -> AbstractContextManager[Active]:
        from ..models.buckets import attention_buckets

        if self.bases is None:
            return active_while(attention_buckets(loaded.model))
        return active_while(attention_buckets(loaded.model, bases=self.bases))
