"""Attention Buckets (Chen et al. 2023b): several RoPE bases in one batched forward, the copies'
outputs combined. The model-side work is in models/buckets.py; this is the Method wrapper."""

from __future__ import annotations

from contextlib import AbstractContextManager

from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Method


class Buckets(Method):
    name = "buckets"

    def __init__(self, bases: tuple[float, ...] | None = None):
        if bases is not None and (not bases or any(b <= 1 for b in bases)):
            raise PosbiasError(f"RoPE bases must be numbers > 1, got {bases}", "e.g. buckets:10000,17500,20000")
        self.bases = bases

    def config(self) -> dict:
        return {"name": "buckets", "bases": list(self.bases) if self.bases else "default"}

    def apply(self, loaded: Loaded) -> AbstractContextManager:
        from ..models.buckets import attention_buckets

        if self.bases is None:
            return attention_buckets(loaded.model)
        return attention_buckets(loaded.model, bases=self.bases)


def parse(arg: str | None) -> Buckets:
    if not arg:
        return Buckets()
    try:
        return Buckets(tuple(float(x) for x in arg.split(",")))
    except ValueError:
        raise PosbiasError(f"bad bucket bases {arg!r}", "write them as buckets:B1,B2,..., e.g. buckets:10000,20000") from None
