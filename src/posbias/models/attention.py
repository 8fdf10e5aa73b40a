"""Attention capture: per-layer attention matrices of a real model, averaged over heads."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def eager_attention(model):
    """Temporarily switch to eager attention (the only backend that returns weights)."""
    old = model.config._attn_implementation
    if old == "eager":
        yield model
        return
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(old)


@torch.inference_mode()
def layer_attentions(model, input_ids: list[int]) -> torch.Tensor:
    """Head-averaged attention of every layer for one sequence: (L, N, N), float64.

    Row i of layer l is the attention distribution of query i over keys j <= i at that
    layer (rows sum to one). Heads are averaged with equal weight.
    """
    ids = torch.tensor([input_ids], device=next(model.parameters()).device)
    with eager_attention(model):
        out = model(input_ids=ids, output_attentions=True, use_cache=False, logits_to_keep=1)
    return torch.stack([a[0].double().mean(0).cpu() for a in out.attentions])  # (L, N, N)
