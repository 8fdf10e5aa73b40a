"""The one place posbias follows transformers' releases, so every supported release computes the same numbers.

transformers 5.24 renamed the KV-cache argument and output field `past_key_values` to `cache` (the old name warns
until 5.40, and inside an attention module it is no longer read at all): code that hands a cache to a model, or
takes it from a self_attn call, asks here for the name. Earlier releases (5.19, which vLLM's CPU build pins) copy
a grouped-query model's keys and values to every query head at each decode step, and every release copies them
under a mask (its rule for letting SDPA group the heads is CUDA's): `install_grouped_sdpa` gives every release
5.24's packed single-query attention and, on CPU, SDPA's own head grouping under a mask: the same arithmetic
without the copies."""

from __future__ import annotations

import inspect
from contextvars import ContextVar
from functools import lru_cache
from typing import Callable

CACHE_KEYS = ("cache", "past_key_values")  # newest first

# An attention of posbias's own for the forward in progress (models/prefix.py's split attention sets it around one
# model call): hook(module, query, key, value, attention_mask, kwargs) -> (output, None), for every layer's call
ATTEND: ContextVar[Callable | None] = ContextVar("posbias_attend", default=None)


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


def _sdpa_groups_heads() -> bool:
    """Whether torch's scaled_dot_product_attention takes `enable_gqa` (torch 2.5 and later)."""
    import torch
    from packaging.version import Version

    return Version(torch.__version__.split("+")[0]) >= Version("2.5")


def grouped_sdpa(stock: Callable, use_gqa: Callable, pack: bool = True) -> Callable:
    """An `sdpa` attention function that reads a grouped-query model's keys and values as they are where `stock`
    (transformers' sdpa_attention_forward) would copy them to every query head (`repeat_kv`):

      one query token (pack=True: releases before 5.24)   packed per KV group, [B, H, 1, D] -> [B, H / n_rep, n_rep, D]
      several query tokens under a mask, on CPU,          torch's SDPA told `enable_gqa=True`. Stock lets SDPA group
      no gradient                                          the heads only without a mask (CUDA's rule: a masked grouped
                                                           call falls back to the math kernel there); torch's CPU flash
                                                           kernel takes a mask and groups heads itself, bit for bit the
                                                           copied keys' result (tests/test_compat.py), without the copy
                                                           of every key and value per layer and forward (the shared
                                                           path's branches: 15% of attention at 8K keys, docs/sweep.md)

    A hook set in ATTEND for the forward in progress comes first (the shared path's split attention, models/prefix.py).
    Every other call (no grouping, a position bias, a softcap, extra positional arguments, a case where `use_gqa(mask,
    key, value)` lets SDPA group the heads itself, an accelerator, training) goes to `stock` unchanged."""
    import torch

    masked_ok = _sdpa_groups_heads()

    def grouped(module, query, key, value, attention_mask, *args, **kwargs):
        hook = ATTEND.get()
        if hook is not None:  # every call of the forward in progress is the hook's (key, value hold only its columns)
            if args:
                raise RuntimeError(f"posbias's attention hook takes no positional arguments beyond the mask: {len(args)}")
            return hook(module, query, key, value, attention_mask, kwargs)
        n_rep = getattr(module, "num_key_value_groups", 1)
        if (n_rep <= 1 or args or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
                or use_gqa(attention_mask, key, value)):
            return stock(module, query, key, value, attention_mask, *args, **kwargs)
        if query.shape[2] == 1:
            if not pack:
                return stock(module, query, key, value, attention_mask, *args, **kwargs)
            b, h, _, d = query.shape
            mask = attention_mask
            if mask is not None and mask.shape[1] != 1:  # a per-head mask [B, H, 1, K] packed alike
                mask = mask.reshape(mask.shape[0], h // n_rep, n_rep, mask.shape[-1])
            out, _ = stock(_OneGroup(module), query.reshape(b, h // n_rep, n_rep, d), key, value, mask,
                           **{**kwargs, "is_causal": False})  # n_rep rows of one query position: nothing to hide
            # stock returns its packed output transposed, [B, n_rep, H / n_rep, D]: back to [B, 1, H, D]
            return out.transpose(1, 2).reshape(b, h, 1, d).transpose(1, 2).contiguous(), None
        if (not masked_ok or attention_mask is None or query.device.type != "cpu" or torch.is_grad_enabled()
                or kwargs.get("output_attentions")):
            return stock(module, query, key, value, attention_mask, *args, **kwargs)
        # stock with a mask: is_causal False, keys uncropped; the same call with the heads grouped by SDPA
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=kwargs.get("dropout", 0.0),
            scale=kwargs.get("scaling"), enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None

    grouped.__wrapped__ = stock
    grouped.takes_hook = True  # ATTEND is read (models/prefix.py asks before it sets one)
    return grouped


def takes_hook() -> bool:
    """Whether the registered `sdpa` reads ATTEND (install_grouped_sdpa has run)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return bool(getattr(ALL_ATTENTION_FUNCTIONS.get("sdpa"), "takes_hook", False))


def release_packs_single_query() -> bool:
    """Whether the installed transformers' `sdpa` packs a single query token per KV group itself (5.24 does)."""
    from transformers.integrations import sdpa_attention

    return hasattr(sdpa_attention, "pack_gqa")


def install_grouped_sdpa() -> dict:
    """Register `grouped_sdpa` as `sdpa` (once): decode steps on a release whose `sdpa` copies a grouped-query model's
    keys and values to every query head at each step (5.19 does; 5.24 packs the query itself: its `pack_gqa`) cost
    what they cost on 5.24 (12.1 -> 4.5 CPU s of decode for 100 kv-lookup rows of SmolLM2, docs/backends.md) and give
    5.24's texts; masked multi-token forwards on CPU read the keys in place. -> the attention record a run keeps:
    what reads the grouped heads at one query and at several."""
    from transformers import AttentionInterface
    from transformers.integrations import sdpa_attention as sdpa
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    stock = sdpa.sdpa_attention_forward
    pack = not release_packs_single_query()
    if getattr(ALL_ATTENTION_FUNCTIONS.get("sdpa"), "__wrapped__", None) is not stock:
        AttentionInterface.register("sdpa", grouped_sdpa(stock, sdpa.use_gqa_in_sdpa, pack))
    return attention_record()


def attention_record() -> dict:
    """How the registered `sdpa` reads a grouped-query model's heads (a run's backend record; the arithmetic is the
    stock function's, so it is not part of a run's fingerprint)."""
    return {"sdpa_one_query": "packed per KV group" + (" (backport)" if not release_packs_single_query() else ""),
            "sdpa_masked_queries": "enable_gqa on CPU" if _sdpa_groups_heads() else "keys copied per head (torch < 2.5)"}
