"""The one place posbias follows transformers' renames, so every supported release computes the same numbers.

transformers 5.24 renamed the KV-cache argument and output field `past_key_values` to `cache` (the old name warns
until 5.40, and inside an attention module it is no longer read at all): code that hands a cache to a model, or
takes it from a self_attn call, asks here for the name."""

from __future__ import annotations

import inspect
from functools import lru_cache

CACHE_KEYS = ("cache", "past_key_values")  # newest first


@lru_cache(maxsize=None)
def _cache_key(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_key(model) -> str:
    """The keyword this model's forward takes its KV cache by."""
    return _cache_key(type(model))


def cache_kwargs_key(kwargs: dict) -> str:
    """The keyword a self_attn call carries its KV cache by (the newest name when neither is present)."""
    return next((k for k in CACHE_KEYS if k in kwargs), CACHE_KEYS[0])


def output_cache(out):
    """The KV cache a forward returned, under either name."""
    return out["cache"] if "cache" in out else out["past_key_values"]
