"""Plumbing shared by the methods that install their own attention function (Ms-PoE, MoICE, the span capture):
register a wrapper of the model's attention backend under a new implementation name, and a self_attn pre-hook
state that takes RoPE and the KV cache away from the stock code so the wrapper can rotate q/k itself."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from ..errors import PosbiasError
from .compat import cache_kwargs_key


def register_attention(model, attn, tag: str, make_attention: Callable, who: str) -> tuple[str, str]:
    """Register make_attention(backend) (and the backend's mask function) as `posbias_<tag>_<impl>`
    -> (old implementation name, new name). `attn`: one self_attn module (for the eager backend's module)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    old = model.config._attn_implementation
    backend = sys.modules[type(attn).__module__].eager_attention_forward if old == "eager" else ALL_ATTENTION_FUNCTIONS.get(old)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(old)
    if backend is None or mask_fn is None:
        raise PosbiasError(f"{who}: unsupported attention implementation {old!r}", "load the model with sdpa or eager")
    name = f"posbias_{tag}_{old}"
    AttentionInterface.register(name, make_attention(backend))
    AttentionMaskInterface.register(name, mask_fn)
    return old, name


def take_rope_and_cache(st, module, kwargs: dict, who: str) -> dict:
    """In a self_attn pre-hook: record on `st` whether this is a prefill and the real cache (st.prefill, st.cache),
    give the stock code identity RoPE (cos 1, sin 0: q and k pass un-rotated, exactly) and no cache."""
    if kwargs.get("position_ids") is None or "position_embeddings" not in kwargs:
        raise PosbiasError(f"{who}: self_attn was called without position_ids/position_embeddings", "use a supported model")
    key = cache_kwargs_key(kwargs)
    cache = kwargs.get(key)
    st.prefill = cache is None or cache.get_seq_length(module.layer_idx) == 0
    st.cache = cache
    cos = kwargs["position_embeddings"][0]
    one = torch.ones((1, 1, 1), dtype=cos.dtype, device=cos.device)
    kwargs["position_embeddings"] = (one, torch.zeros_like(one))
    if key in kwargs:
        kwargs[key] = None
    return kwargs


@contextmanager
def patched_attention(model, old: str, name: str, states: dict, active, pre_hook) -> Iterator[None]:
    """Inside: every self_attn in `states` has its state in `active` and `pre_hook` installed, and the model runs
    the registered implementation `name`; on exit hooks, states and the implementation `old` are restored."""
    hooks = []
    try:
        for attn, st in states.items():
            active[attn] = st
            hooks.append(attn.register_forward_pre_hook(pre_hook, with_kwargs=True))
        model.set_attn_implementation(name)
        yield
    finally:
        for h in hooks:
            h.remove()
        for attn in states:
            active.pop(attn, None)
        if model.config._attn_implementation != old:
            model.set_attn_implementation(old)
