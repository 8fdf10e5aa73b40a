"""Attention capture: full per-layer matrices (small prompts, the rollout) and cheap per-span masses.

`layer_attentions` returns every layer's head-averaged N x N attention (eager backend, output_attentions).

`span_attention` measures, for a few selected query rows, how much attention each layer and head puts on
each span of keys (items, first token, rest), reduced *inside* the attention computation: nothing of
size L x H x T x T, or even H x T x T for one layer, is kept. How it hooks into transformers (5.23):
the model is switched to a registered attention function ("posbias_spans_<backend>") that

  1. computes the layer's output with the original backend (sdpa / eager) on the same arguments, so
     the model's outputs are bit-identical to a plain forward;
  2. for the selected rows only, recomputes softmax(q k^T * scaling + mask) -> [B, H, q, T] (GQA: query
     head h reads KV head h // G, transformers' repeat_kv order; the mask is the one the layer received,
     so sliding-window layers and padding are respected; logit softcapping is applied if the layer has
     it), averages the rows with the given weights and sums over each span -> [B, H, n_spans].

The original backend's mask function is registered under the same name (AttentionMaskInterface),
otherwise padding would be silently ignored. A RoPE pre-hook (models/rope.py: pi, layers, lpes) rewrites
position_embeddings before q/k are rotated, i.e. before this function runs, so it composes. Ms-PoE and
Attention Buckets install their own attention function / several copies of the sequence and are refused.
On exit the original attention implementation is set back.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..errors import PosbiasError
from .attn_hooks import register_attention

_BACKENDS = ("sdpa", "eager")
# self_attn module -> the SpanCapture of the model it belongs to, while `span_attention` is active.
_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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


# ----------------------------------------------------------------------------- cheap per-span capture


@dataclass
class SpanCapture:
    """Handle yielded by `span_attention`. Before each forward call `set_batch`; after it `masses[layer]` is
    [B, H, n_spans] float32 on the CPU: the weighted mean over the selected query rows of the attention mass
    on each span (rows of one sequence sum to one over the spans when every key has a span)."""

    masses: dict[int, torch.Tensor] = field(default_factory=dict)
    _batch: tuple | None = field(default=None, repr=False)

    def set_batch(self, span_of: torch.Tensor, n_spans: int, queries: torch.Tensor, weights: torch.Tensor) -> None:
        """span_of: [B, T] long, the span id of every key column (n_spans or more: not counted, e.g. padding);
        queries: [B, q] long, the query columns; weights: [B, q] float, each row's weights (e.g. 1/q, 0 for filler)."""
        if span_of.dim() != 2 or queries.dim() != 2 or weights.shape != queries.shape or queries.shape[0] != span_of.shape[0]:
            raise PosbiasError("span capture: span_of [B, T], queries [B, q] and weights [B, q] must match",
                               "pass one row per sequence of the batch")
        self._batch = (span_of.long(), int(n_spans), queries.long(), weights.float())
        self.masses = {}


def _row_bias(mask, cols: torch.Tensor, s: int, dtype) -> torch.Tensor:
    """Additive mask [B, 1|H, q, S] of the selected query columns, from any of the backends' mask formats."""
    b, q = cols.shape
    if mask is None:  # sdpa without padding: plain causal
        keys = torch.arange(s, device=cols.device)
        return torch.where(keys[None, None, None, :] <= cols[:, None, :, None], 0.0, float("-inf")).to(dtype)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        raise PosbiasError(f"span capture cannot read an attention mask of type {type(mask).__name__}",
                           "load the model with the sdpa or eager attention implementation")
    idx = cols[:, None, :, None].expand(b, mask.shape[1], q, s)
    rows = mask[..., :s].expand(b, -1, -1, -1).gather(2, idx)  # [B, 1|H, q, S]
    if rows.dtype == torch.bool:
        return torch.zeros(rows.shape, dtype=dtype, device=rows.device).masked_fill(~rows, float("-inf"))
    return rows.to(dtype)


def span_masses(query, key, mask, scaling: float, softcap, cols, weights, span_of, n_spans: int) -> torch.Tensor:
    """Attention mass of the selected rows on each span. query [B, Hq, T, D], key [B, Hk, S, D], cols/weights
    [B, q], span_of [B, S] -> [B, Hq, n_spans] float32 (rows averaged with `weights`)."""
    b, hq, _, d = query.shape
    hk, s = key.shape[1], key.shape[2]
    q = cols.shape[1]
    q_sel = query.gather(2, cols[:, None, :, None].expand(b, hq, q, d)).float()  # [B, Hq, q, D]
    logits = torch.einsum("bkgqd,bksd->bkgqs", q_sel.view(b, hk, hq // hk, q, d), key.float())
    logits = logits.reshape(b, hq, q, s) * scaling  # [B, Hq, q, S]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    probs = torch.softmax(logits + _row_bias(mask, cols, s, logits.dtype), dim=-1)  # [B, Hq, q, S]
    probs = (probs * weights[:, None, :, None].to(probs)).sum(2)  # [B, Hq, S]
    ids = span_of[:, None, :].clamp(max=n_spans).expand(b, hq, s)
    out = torch.zeros(b, hq, n_spans + 1, dtype=probs.dtype, device=probs.device).scatter_add_(2, ids, probs)
    return out[..., :n_spans]


def _capture(cap: SpanCapture, module, query, key, mask, kwargs) -> None:
    if cap._batch is None:
        raise PosbiasError("span capture: a forward ran without `set_batch`", "call set_batch before each forward")
    span_of, n_spans, cols, weights = (t.to(query.device) if isinstance(t, torch.Tensor) else t for t in cap._batch)
    if span_of.shape != (query.shape[0], key.shape[2]):
        raise PosbiasError(f"span capture: the batch has {tuple(query.shape[:1]) + tuple(key.shape[2:3])} "
                           f"(rows, keys) but set_batch described {tuple(span_of.shape)}",
                           "capture one prompt forward without a KV cache, with set_batch for that batch")
    scaling = kwargs.get("scaling") or module.head_dim**-0.5
    softcap = kwargs.get("softcap") or getattr(module, "attn_logit_softcapping", None)
    out = span_masses(query, key, mask, scaling, softcap, cols, weights, span_of, n_spans)
    cap.masses[module.layer_idx] = out.cpu()


def _make_attention(backend):
    def attention(module, query, key, value, attention_mask, **kwargs):
        out = backend(module, query, key, value, attention_mask, **kwargs)
        cap = _ACTIVE.get(module)
        if cap is not None:
            with torch.no_grad():
                _capture(cap, module, query, key, attention_mask, kwargs)
        return out

    return attention


def _register(model, attns) -> tuple[str, str]:
    """Register the capture attention + mask functions for the model's backend -> (old, new) names."""
    old = model.config._attn_implementation
    if old not in _BACKENDS:
        raise PosbiasError(f"attention capture needs the sdpa or eager attention implementation, the model runs {old!r}"
                           " (Ms-PoE and other methods that install their own attention function cannot be captured)",
                           "load the model with sdpa or eager, and use a method that only rescales RoPE (pi, layers, lpes)")
    return register_attention(model, attns[0], "spans", _make_attention, "attention capture")


def _self_attns(model) -> list:
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    layers = getattr(base, "layers", None)
    attns = [getattr(layer, "self_attn", None) for layer in layers or []]
    if not attns or any(a is None or not hasattr(a, "layer_idx") for a in attns):
        raise PosbiasError(f"attention capture needs decoder layers with a self_attn module "
                           f"(model type {getattr(model.config, 'model_type', '?')!r})",
                           "use a Llama/Qwen2/Mistral/Gemma-family model")
    return attns


@contextmanager
def span_attention(model):
    """Capture per-span attention masses inside the block (module docstring); restore the model on exit."""
    attns = _self_attns(model)
    if any(a in _ACTIVE for a in attns):
        raise PosbiasError("attention capture is already active on this model", "do not nest span_attention")
    cap = SpanCapture()
    old, name = _register(model, attns)
    try:
        for a in attns:
            _ACTIVE[a] = cap
        model.set_attn_implementation(name)
        yield cap
    finally:
        for a in attns:
            _ACTIVE.pop(a, None)
        if model.config._attn_implementation != old:
            model.set_attn_implementation(old)
