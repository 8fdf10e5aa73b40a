"""PINE inside a transformers model (models/pine.py has the attention itself): every layer's self_attn gets the
identity RoPE and no cache from a pre-hook (models/attn_hooks.py, as Ms-PoE), and the registered attention function
keeps every column's un-rotated key and value (the model's cache is updated too, for its length), each row's token
classes and positions, and computes PINE's attention over all the keys. Every layer, head and token, as Theorem 1 needs.

Before a prefill the caller gives each prompt's token classes (a document index, PREFIX or SUFFIX; models/pine.py),
in prompt order: `Pine.prompts[tuple(prompt ids)] = classes` (a batch's rows are matched by their tokens, however
the engine splits or orders them), or `Pine.rows`, one list per batch row in order. A row's real tokens are found
from its position_ids (left padding: position_ids = cumsum(mask) - 1, clamped); tokens past the prompt (a
teacher-forced answer) and every decoded token are SUFFIX. A cached forward (decoding) appends SUFFIX columns.

RoPE families only (a learned-position model, GPT-2, has its positions in the embeddings, which one query cannot
re-assign for another: refused); Gemma-3's sliding layers apply their window to the re-assigned distances.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..errors import PosbiasError
from .attn_hooks import patched_attention, register_attention, take_rope_and_cache
from .pine import INVARIANT, VARIANTS, Segments, attend
from .pine_plan import IDENTITY, PAD, SUFFIX, take
from .rope import rope_info, rotation

_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Pine:
    """The handle `pine` yields: set `rows` (module docstring) before each prefill."""

    variant: str = "pine"
    rows: list[list[int]] | None = None
    prompts: dict = field(default_factory=dict)  # tuple(prompt ids) -> classes
    input_ids: torch.Tensor | None = field(default=None, repr=False)  # the forward's, seen by the model's pre-hook
    _memo: tuple = field(default=(), repr=False)  # (position_ids, Segments, the store's Segments): once per forward
    _rotate: dict = field(default_factory=dict, repr=False)  # RoPE kind -> rotate(x, positions)


@dataclass
class _LayerState:
    shared: Pine
    kind: int
    prefill: bool = True
    cache: object | None = None
    position_ids: torch.Tensor | None = None
    keys: torch.Tensor | None = None  # [B, Hk, S, D] un-rotated, every column so far
    values: torch.Tensor | None = None
    local: torch.Tensor | None = None  # the keys rotated at their offsets in their class (models/pine.attend)
    perm: torch.Tensor | None = None  # the columns' canonical order after a prefill, for the first decoding step


def _rows(h: Pine, pos: torch.Tensor) -> list[list[int]]:
    """Each batch row's prompt classes: matched by the row's real tokens against `prompts`, else `rows`."""
    b, t = pos.shape
    if h.prompts and h.input_ids is not None and h.input_ids.shape == pos.shape:
        out = []
        for r in range(b):
            real = h.input_ids[r, t - (int(pos[r].max()) + 1):].tolist()
            match = [c for p, c in h.prompts.items() if tuple(real[:len(p)]) == p]
            if not match:
                raise PosbiasError("pine: a batch row whose prompt has no token classes",
                                   "give every prompt's classes (Pine.prompts) before its forward")
            out.append(max(match, key=len))
        return out
    if not h.prompts and h.rows is None:  # no items given: no documents, the plain causal attention
        return [[] for _ in range(b)]
    if h.rows is None or len(h.rows) != b:
        raise PosbiasError(f"pine: no token classes for a batch of {b}", "set Pine.prompts (or Pine.rows) before the "
                           "forward")
    return h.rows


def _prompt_classes(rows: list[list[int]], pos: torch.Tensor) -> torch.Tensor:
    """[B, T] classes of a prefill's columns from the rows' prompt classes and the position_ids (left padding)."""
    b, t = pos.shape
    out = torch.full((b, t), PAD, dtype=torch.long)
    for r, classes in enumerate(rows):
        real = int(pos[r].max()) + 1
        if len(classes) > real:
            raise PosbiasError(f"pine: row {r} has {real} tokens, fewer than its {len(classes)} prompt tokens",
                               "set Pine.rows from the prompts of this batch")
        first = t - real
        out[r, first:first + len(classes)] = torch.tensor(classes, dtype=torch.long)
        out[r, first + len(classes):] = SUFFIX
    return out.to(pos.device)


def _make_attention(backend):
    def attention(module, query, key, value, attention_mask, **kwargs):
        st = _ACTIVE.get(module)
        if st is None:
            return backend(module, query, key, value, attention_mask, **kwargs)
        b, t = query.shape[0], query.shape[2]
        pos = st.position_ids.expand(b, -1)
        cache, st.cache = st.cache, None
        if cache is not None:  # the model's cache keeps its length (a sliding layer's cache keeps only its window)
            cache.update(key, value, module.layer_idx)
        # PINE's own store: every key and value un-rotated (PINE rotates them per query class and applies a sliding
        # layer's window to the re-assigned distances, so it needs all of them)
        h = st.shared
        if not st.prefill and st.perm is not None:  # the first decoding step: the store into the order it keeps
            st.keys, st.values, st.local = take(st.keys, st.perm), take(st.values, st.perm), take(st.local, st.perm)
        st.perm = None
        st.keys = key if st.prefill else torch.cat([st.keys, key], 2)
        st.values = value if st.prefill else torch.cat([st.values, value], 2)
        if not h._memo or h._memo[0] is not st.position_ids:  # every column's class and position: once per forward
            ids = h.input_ids if h.input_ids is not None and h.input_ids.shape == pos.shape else None
            if st.prefill:
                cls, given = _prompt_classes(_rows(h, pos), pos), pos
            else:  # a decoded token: SUFFIX, after the store's columns (in the order the store keeps them)
                kept = h._memo[2]
                new = torch.full((b, t), SUFFIX, dtype=torch.long, device=pos.device)
                cls, given = torch.cat([kept.cls, new], 1), torch.cat([kept.pos, pos], 1)
                ids = None if kept.ids is None or ids is None else torch.cat([kept.ids, ids], 1)
            # the Segments too, so that its plan (which queries go by layout) is made once per forward; with the
            # token ids, PINE computes in an order that does not depend on the documents' (models/pine.attend)
            seg = Segments(cls, given, max(1, int(cls.max()) + 1), ids)
            h._memo = (st.position_ids, seg, _kept_order(seg, h.variant, st.prefill))
        seg = h._memo[1]
        if seg.cls.shape[1] != st.keys.shape[2]:
            raise PosbiasError(f"pine: {seg.cls.shape[1]} classified columns for {st.keys.shape[2]} keys",
                               "run PINE on the plain path (no prefix sharing), one prefill per batch")
        rot = h._rotate[st.kind]
        turned = rot(key, seg.local()[:, -t:, None].transpose(1, 2).expand(b, key.shape[1], t))  # at their offsets
        st.local = turned if st.prefill else torch.cat([st.local, turned], 2)  # kept, not redone per token
        key, value = st.keys, st.values
        scaling = kwargs.get("scaling") or module.scaling
        window = kwargs.get("sliding_window", getattr(module, "sliding_window", None)) or None  # a sliding layer
        out = attend(query, key, value, seg, rot, scaling, h.variant, window, st.local)
        if h._memo[2] is not seg:  # a prefill: the store goes into the canonical order (at the first decoding step,
            st.perm = seg.canonical(t)[0]  # none if none follows), so that decoding gathers nothing per layer and token
        return out.transpose(1, 2).contiguous().to(query.dtype), None

    return attention


def _kept_order(seg: Segments, variant: str, prefill: bool) -> Segments:
    """The Segments of the order the store keeps after this forward: after a prefill of an invariant variant given
    the token ids, the canonical one (models/pine.attend computes in it; a decoded token, SUFFIX, comes last in it
    too, so every decoding step's columns are already in it and nothing is gathered per layer and token); else
    the given order."""
    if not prefill or seg.ids is None or not INVARIANT[variant]:
        return seg
    canon = seg.canonical(seg.cls.shape[1])
    return seg if canon is None or canon is IDENTITY else canon[3]


def _pre_hook(module, args, kwargs):
    st = _ACTIVE[module]
    kwargs = take_rope_and_cache(st, module, kwargs, "pine")
    st.position_ids = kwargs["position_ids"]
    return args, kwargs


def check_model(model) -> None:
    """Refuse, in one line, a model PINE cannot run on (no static RoPE; logit soft-capping)."""
    try:
        info = rope_info(model)
    except PosbiasError as e:
        raise PosbiasError(f"pine: {e.problem}", "PINE re-assigns positions through RoPE; use a RoPE model "
                           "(a learned-position model keeps its positions in the embeddings)") from None
    if getattr(model.config, "attn_logit_softcapping", None):
        raise PosbiasError("pine: attention logit soft-capping is not implemented", "use a model without it")
    head = getattr(info.attns[0], "head_dim", None)
    if head is not None and 2 * info.inv_freq.numel() != head:
        raise PosbiasError(f"pine: RoPE on {2 * info.inv_freq.numel()} of {head} head dimensions (partial rotary) is "
                           "not implemented", "use a model with RoPE on the whole head (Llama, Qwen, Mistral, Gemma-3)")


@contextmanager
def pine(model, variant: str = "pine"):
    """PINE (or one of its VARIANTS) on every layer of `model` inside the block; restored exactly on exit."""
    if variant not in VARIANTS:
        raise PosbiasError(f"unknown PINE variant {variant!r}", f"use one of {', '.join(VARIANTS)}")
    check_model(model)
    info = rope_info(model)
    if any(a in _ACTIVE for a in info.attns):
        raise PosbiasError("pine is already active on this model", "do not nest pine contexts")
    handle = Pine(variant)
    handle._rotate = {i: rotation(kd.inv_freq, kd.attention_scaling) for i, kd in enumerate(info.kinds)}
    kind = getattr(model.config, "model_type", "model")
    old, name = register_attention(model, info.attns[0], f"pine_{kind}", _make_attention, "pine")
    states = {a: _LayerState(handle, info.layer_kinds[i]) for i, a in enumerate(info.attns)}

    def see_inputs(module, args, kwargs):  # the forward's token ids, to match its rows to their prompts
        handle.input_ids = kwargs.get("input_ids", args[0] if args else None)

    seen = model.register_forward_pre_hook(see_inputs, with_kwargs=True)
    try:
        with patched_attention(model, old, name, states, _ACTIVE, _pre_hook):
            yield handle
    finally:
        seen.remove()
