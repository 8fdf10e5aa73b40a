"""Attention calibration, the model side (Found-in-the-Middle, Hsieh et al. 2024, Sec. 4.1): in the chosen layers,
every head's attention from the answer-producing queries (the last prompt token onwards, and every decode step) is
redistributed over the items so that each item's mean per-token attention becomes proportional to its weight
alpha_k = softmax(rel_k / t), the total attention on the items unchanged (the paper's normalising constant C):

    attn'(x_{k,i}) = alpha_k / Attn(k) * attn(x_{k,i}) * C,   Attn(k) = mean_i attn(x_{k,i}),
    C = sum_k N_k Attn(k) / sum_k N_k alpha_k           (N_k: item k's tokens; other tokens keep their attention)

The model is switched to a registered attention function ("posbias_calib_<backend>") that runs the original
backend, then recomputes the selected query rows eagerly (softmax(q k^T * scaling + mask), the layer's own mask, so
padding and sliding windows hold; GQA: query head h reads KV head h // G), rescales them, and writes p' v back into
those rows. Rows not selected, and layers not chosen, are the backend's output bit for bit.

The caller (methods/calibration.py) gives, per sequence of the next forward, the span id of each prompt token (items
0..n-1, anything else n), alpha, and the column of the last prompt token (teacher forcing; generation's prefill puts
it in the last column). On exit the original attention implementation is set back.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterator

import torch

from ..errors import PosbiasError
from .attention import _row_bias, _self_attns
from .attn_hooks import register_attention

_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # self_attn -> CalibState


class CalibState:
    """What the next forward calibrates: set(spans, alpha, end) per sequence; clear() turns it off."""

    def __init__(self, model, old: str, name: str):
        self.model, self.old, self.name = model, old, name
        self.clear()

    def clear(self) -> None:
        self.spans: list[list[int]] | None = None
        self.alpha: torch.Tensor | None = None
        self.end: torch.Tensor | None = None
        self._table: tuple | None = None
        self.total = 0

    def set(self, spans: list[list[int]], alpha: torch.Tensor, end: torch.Tensor | None = None) -> None:
        """spans[b]: the span id of each prompt token of sequence b (items 0..n-1, else n); alpha: [B, n];
        end: [B] the column of each sequence's last prompt token (None: the last column of the prefill)."""
        if len(spans) != alpha.shape[0] or (end is not None and len(end) != len(spans)):
            raise PosbiasError("attention calibration: spans, alpha and prompt ends must describe the same sequences",
                               "give one of each per sequence of the batch")
        self.spans, self.alpha, self.end, self._table = spans, alpha.float(), end, None

    def count(self, module, args, kwargs) -> None:
        """Model forward pre-hook: the sequence length so far (prefill: the input; a decode step adds its tokens)."""
        from .compat import cache_key

        ids = kwargs.get("input_ids", args[0] if args else None)
        t = ids.shape[1] if ids is not None else kwargs["inputs_embeds"].shape[1]
        cache = kwargs.get(cache_key(self.model))
        self.total = t if cache is None or cache.get_seq_length() == 0 else self.total + t
    def span_table(self, width: int, device) -> torch.Tensor:
        """[B, width] span id of every key column of the prefill layout (prompt b ends at column end[b])."""
        if self._table is None or self._table[0] != width:
            n = self.alpha.shape[1]
            end = self.end if self.end is not None else torch.full((len(self.spans),), width - 1)
            table = torch.full((len(self.spans), width), n, dtype=torch.long)
            for b, ids in enumerate(self.spans):
                e = int(end[b]) + 1
                table[b, e - len(ids): e] = torch.tensor(ids)
            self._table = (width, table.to(device), end.to(device))
        return self._table[1], self._table[2]

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """The model without calibration inside (a measurement forward)."""
        self.model.set_attn_implementation(self.old)
        try:
            yield
        finally:
            self.model.set_attn_implementation(self.name)


def _calibrate(st: CalibState, module, query, key, value, mask, kwargs, out) -> torch.Tensor:
    b, hq, t, d = query.shape  # query [B, Hq, T, D], key/value [B, Hk, S, D], out [B, T, Hq, D]
    hk, s = key.shape[1], key.shape[2]
    n = st.alpha.shape[1]
    if t == s:  # no cache: teacher forcing, or generation's prefill
        table, end = st.span_table(s, query.device)
        q = int((s - end).max())  # [B, q] the last q columns; a row's are selected from its prompt end on
        cols = torch.arange(s - q, s, device=query.device).expand(b, q)
        valid = cols >= end[:, None]
    else:  # decode steps over the cache: every new query is an answer token; the keys are the last s of `total`
        table, _ = st.span_table(st.total - t, query.device) if st._table is None else st._table[1:]
        pad = torch.full((b, st.total - table.shape[1]), n, device=query.device, dtype=torch.long)
        table = torch.cat([table, pad], 1)[:, st.total - s:]  # a sliding-window layer keeps only its window
        q = t
        cols = torch.arange(s - t, s, device=query.device).expand(b, t)
        valid = torch.ones_like(cols, dtype=torch.bool)
    scaling = kwargs.get("scaling") or module.head_dim**-0.5
    softcap = kwargs.get("softcap") or getattr(module, "attn_logit_softcapping", None)
    q_sel = query[:, :, t - q:].float()  # [B, Hq, q, D]
    logits = torch.einsum("bkgqd,bksd->bkgqs", q_sel.view(b, hk, hq // hk, q, d), key.float()).reshape(b, hq, q, s)
    logits = logits * scaling
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    rows = cols if mask is None else cols - (s - t)  # a mask tensor has one row per query (absolute: causal rule)
    bias = _row_bias(mask, rows, s, logits.dtype)  # [B, 1|Hq, q, S]
    p = torch.softmax(logits + bias, dim=-1)  # [B, Hq, q, S]
    ids = table[:, None, None, :].expand(b, hq, q, s)
    mass = torch.zeros(b, hq, q, n + 1, device=p.device).scatter_add_(3, ids, p)[..., :n]  # [B, Hq, q, n]
    # N_k: the item's tokens this query can see (a sliding window or the cache may hide some), so a full forward and
    # a decode step over a windowed cache count the same tokens. A mask hides a token with -inf or with the dtype's
    # most negative finite number (eager masks), so "seen" is a bias above half of that, not a finite one
    seen = (bias > torch.finfo(bias.dtype).min / 2).to(p.dtype)  # [B, 1|Hq, q, S]
    count = torch.zeros(*seen.shape[:3], n + 1, device=p.device).scatter_add_(
        3, table[:, None, None, :].expand(seen.shape), seen)[..., :n]  # [B, 1|Hq, q, n]
    mean = mass / count.clamp(min=1)  # Attn(k) per head and query
    alpha = st.alpha.to(p.device)[:, None, None, :]  # [B, 1, 1, n]
    c = mass.sum(-1, keepdim=True) / (alpha * count).sum(-1, keepdim=True).clamp(min=1e-30)
    factor = torch.where(mean > 0, alpha * c / mean.clamp(min=1e-30), torch.ones_like(mean))
    factor = torch.cat([factor, torch.ones_like(factor[..., :1])], -1).gather(3, ids)  # [B, Hq, q, S]
    v = value.float().repeat_interleave(hq // hk, dim=1)  # [B, Hq, S, D]
    o = torch.einsum("bhqs,bhsd->bqhd", p * factor, v).to(out.dtype)  # [B, q, Hq, D]
    out = out.clone()
    out[:, t - q:] = torch.where(valid[:, :, None, None], o, out[:, t - q:])
    return out


def _make_attention(backend):
    def attention(module, query, key, value, attention_mask, **kwargs):
        out, weights = backend(module, query, key, value, attention_mask, **kwargs)
        st = _ACTIVE.get(module)
        if st is not None and st.spans is not None:
            with torch.no_grad():
                out = _calibrate(st, module, query, key, value, attention_mask, kwargs, out)
        return out, weights

    return attention


def check_layers(model, layers: list[int]) -> None:
    n = len(_self_attns(model))
    bad = [i for i in layers if not 0 <= i < n]
    if bad or not layers:
        raise PosbiasError(f"attention calibration layers {bad or layers} are not layers of this {n}-layer model",
                           f"choose layers between 0 and {n - 1}")


@contextmanager
def calibration(model, layers: list[int]) -> Iterator[CalibState]:
    """Calibrate the attention of `layers` inside the block (module docstring); the model is restored on exit."""
    attns = _self_attns(model)
    check_layers(model, layers)
    if any(a in _ACTIVE for a in attns):
        raise PosbiasError("attention calibration is already active on this model", "do not nest it")
    old, name = register_attention(model, attns[0], "calib", _make_attention, "attention calibration")
    st = CalibState(model, old, name)
    hook = model.register_forward_pre_hook(st.count, with_kwargs=True)
    try:
        for i in layers:
            _ACTIVE[attns[i]] = st
        model.set_attn_implementation(name)
        yield st
    finally:
        hook.remove()
        for a in attns:
            _ACTIVE.pop(a, None)
        if model.config._attn_implementation != old:
            model.set_attn_implementation(old)
