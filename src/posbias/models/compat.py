"""The one place posbias follows transformers' releases, so every supported release computes the same numbers.

transformers 5.24 renamed the KV-cache argument and output field `past_key_values` to `cache` (the old name warns
until 5.40, and inside an attention module it is no longer read at all): code that hands a cache to a model, or
takes it from a self_attn call, asks here for the name. Earlier releases (5.19, which vLLM's CPU build pins) copy
a grouped-query model's keys and values to every query head at each decode step; `backport_single_query_gqa`
gives them 5.24's packed single-query attention, the same arithmetic at a third of the decode cost."""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Callable

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


class _OneGroup:
    """A self_attn module as seen by an attention function told that keys and values already have one head per
    query head (num_key_value_groups 1); every other attribute is the module's."""

    num_key_value_groups = 1

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def packed_sdpa(stock: Callable, use_gqa: Callable) -> Callable:
    """An `sdpa` attention function that runs `stock` (transformers' sdpa_attention_forward) with a single query
    token packed per KV group: [B, H, 1, D] -> [B, H / n_rep, n_rep, D], so the keys and values are read as they
    are instead of copied to every query head. Every other call (several query tokens, no grouping, a position
    bias, or a case where `use_gqa(mask, key, value)` lets SDPA group the heads itself) goes to `stock` unchanged."""

    def packed(module, query, key, value, attention_mask, *args, **kwargs):
        n_rep = getattr(module, "num_key_value_groups", 1)
        if (query.shape[2] != 1 or n_rep <= 1 or args or kwargs.get("position_bias") is not None
                or use_gqa(attention_mask, key, value)):
            return stock(module, query, key, value, attention_mask, *args, **kwargs)
        b, h, _, d = query.shape
        mask = attention_mask
        if mask is not None and mask.shape[1] != 1:  # a per-head mask [B, H, 1, K] packed alike
            mask = mask.reshape(mask.shape[0], h // n_rep, n_rep, mask.shape[-1])
        out, _ = stock(_OneGroup(module), query.reshape(b, h // n_rep, n_rep, d), key, value, mask,
                       **{**kwargs, "is_causal": False})  # n_rep rows of one query position: nothing to hide
        # stock returns its packed output transposed, [B, n_rep, H / n_rep, D]: back to [B, 1, H, D]
        return out.transpose(1, 2).reshape(b, h, 1, d).transpose(1, 2).contiguous(), None

    packed.__wrapped__ = stock
    return packed


def release_packs_single_query() -> bool:
    """Whether the installed transformers' `sdpa` packs a single query token per KV group itself (5.24 does)."""
    from transformers.integrations import sdpa_attention

    return hasattr(sdpa_attention, "pack_gqa")


def backport_single_query_gqa() -> bool:
    """On a transformers release whose `sdpa` attention copies a grouped-query model's keys and values to every
    query head at each decode step (`repeat_kv`; 5.19 does, 5.24 packs the query instead: its `pack_gqa`), register
    `packed_sdpa` as `sdpa`, what later releases do. Decode steps then cost on 5.19 what they cost on 5.24 (12.1 ->
    4.5 CPU s of decode for 100 kv-lookup rows of SmolLM2, docs/backends.md) and give 5.24's generated texts. A
    no-op where the release packs itself; -> whether the backport is in place."""
    from transformers import AttentionInterface
    from transformers.integrations import sdpa_attention as sdpa
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if release_packs_single_query():
        return False
    stock = sdpa.sdpa_attention_forward
    if getattr(ALL_ATTENTION_FUNCTIONS.get("sdpa"), "__wrapped__", None) is not stock:
        AttentionInterface.register("sdpa", packed_sdpa(stock, sdpa.use_gqa_in_sdpa))
    return True
