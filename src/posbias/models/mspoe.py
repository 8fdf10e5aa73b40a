"""Ms-PoE: per-head multi-scale RoPE position rescaling (Zhang et al., 2024, "Found in the Middle").

The method (the paper's method section). RoPE encodes position i of a query/key x as f(x, i), a
rotation by angles i * theta_d. Position interpolation rescales it to f(x, i / r). Ms-PoE gives every attention head h its
own ratio, f(x, i / r_h), with r_h spread over [min_ratio, max_ratio] (1.2 .. 1.8 in the paper), and
assigns the smallest ratios to the most "position-aware" heads. A head's position-awareness is an
outlier score of its attention on the current input: the fraction of keys whose weight exceeds alpha
times the row mean (alpha = 4). No weights change; the ordering is measured on each input's prefill.

What the public code does (VITA-Group/Ms-PoE, utils/modify_arch/llama.py, MsPoELlamaAttention, and
inference.py / src/ms_poe.sh for the settings):
- Score: on the first forward (prefill) it computes softmax(q k^T / sqrt(d)) from the *un-rotated*
  q and k (before RoPE) with a plain causal mask, takes the last query row, and counts keys with
  weight > 4 * mean. Heads are argsorted by that count, most outliers first.
- Ratios: r_k = min + (max - min) * k / H for k = 0..H-1 (max_ratio itself is never reached).
- Assignment: it indexes the ratio table with the argsort result, cos[head_order], so head h gets
  ratio index head_order[h] -- the inverse of the intended permutation (head h should get index
  rank[h] = argsort(head_order)[h]). The two agree only when the ordering is its own inverse.
- GQA: keys take the ratio of query head g * G of their group (cos[::G] after the permutation); the
  other G - 1 query heads of the group use different ratios than the keys they attend to, so their
  logits no longer depend on relative position alone.
- Layers: the scripts patch layers 2..31 of 32. Decode: the ordering is computed once at prefill and
  reset by hand after each generate(); batch size 1 only, and the rebuilt causal mask ignores padding.

What this module does, and where it deliberately differs:
- Score (same statistic, mspoe_heads.py): per query head, from un-rotated q and k (after Gemma-3's
  q_norm/k_norm, which precede RoPE), softmax of the query row of each batch row's last real token (or
  `MsPoE.order_query`) over the keys its own mask row allows (padding, causality, a sliding window);
  score = #{j : a_j > alpha / n} / n with n the number of those keys. Per batch row.
- GQA, two modes. "group" (default): one ratio per KV group, linspace(min, max, H_kv); groups ranked by
  their query heads' mean score; the group's keys and all its queries use it, so every logit depends on
  (i - j) / r only. "query" (the paper's rule, one ratio per query head): linspace(min, max, H_q), each
  query head ranked by its own score; the keys are repeated per query head (h reads KV head h // G) and
  rotated with that head's ratio, so each head again sees (i - j) / r_h. Its cost: keys rotated and cached
  per query head (G times the key cache; values stay per KV head and are repeated for the backend, as
  the backend does anyway). With H_q == H_kv the two modes are the same computation.
- Ratios: endpoints included ("from 1.2 to 1.8"); rank 0 (highest score) gets min_ratio; ties by index.
- Layers: `layers=None` patches all but the first two layers, like the paper's scripts.
- Decode: each patched layer stores its ordering at prefill (a forward whose cache is empty or absent)
  and reuses it for later forwards on the same cache; keys enter the cache already rotated with their
  ratio. A new generate() starts with an empty cache and so measures a new ordering; no manual reset.
- Teacher forcing prompt + answer in one forward ranks the heads on the row's last token unless
  `MsPoE.order_query` names the last prompt column; with it, the ordering and the logits equal what
  generate() computes from the prompt alone (tested).
- Scope: the RoPE families of SUPPORTED (Llama, Qwen2/3, Mistral, Mixtral, Starcoder2, OLMo-2, Phi-3 with
  partial rotary, Gemma-2, Gemma-3 text), each checked by the family conformance suite. Gemma-3 has two RoPE kinds (sliding layers theta 1e4,
  global layers 1e6): each layer is rotated with its own kind's frequencies at positions / r (its rotary
  module called with the layer's type). Rope types whose frequencies depend on the sequence length
  (dynamic, longrope) are refused. Tested with the sdpa and eager backends; flex BlockMasks are refused.

How it hooks into transformers (checked on 5.23):
- `self_attn.forward` rotates q/k with `position_embeddings`, updates `past_key_values`, then calls
  `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`. A forward pre-hook on each patched `self_attn`
  replaces `position_embeddings` by the identity (cos = 1, sin = 0) and takes `past_key_values` away from
  the stock code. The model is switched to a registered attention function ("posbias_mspoe_<type>_<backend>")
  that receives the un-rotated q/k, the layer's mask (sliding or full) and `position_ids`, ranks the heads
  (prefill), rotates q/k with the rotary module evaluated at positions / r, writes the rotated keys into the
  cache itself, and calls the original backend (query mode: with values repeated per query head and the
  module seen as having one query head per KV head). Unpatched layers go straight to the backend.
- The mask function of the original backend is registered under the same name (AttentionMaskInterface);
  without it `create_causal_mask` returns None and padding is ignored.
- On exit the hooks are removed and the original attention implementation is set back, so logits are
  bit-identical to before. With all ratios 1 the rotation reproduces stock RoPE bit for bit.

Paper equations implemented: f(x, i / r_h) in `mspoe_heads.rotate_heads`, the position-awareness (outlier)
score in `outlier_scores`, the ratio ladder and ranking in `ratio_ladder` / `rank_groups`. (Equation numbers
are not quoted: not checked against the PDF.)
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..errors import PosbiasError
from .attn_hooks import patched_attention, register_attention, take_rope_and_cache
from .mspoe_heads import ALPHA, outlier_scores, probe_valid, rank_groups, ratio_ladder, rotate_heads
from .rope import rope_info

__all__ = ["ALPHA", "MODES", "MsPoE", "check_model", "mspoe", "outlier_scores", "rank_groups", "ratio_ladder"]

SKIP_FIRST = 2  # default: leave the first two layers on plain RoPE (public scripts: layers 2..31)
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral", "mixtral", "starcoder2", "olmo2", "phi3", "gemma2", "gemma3_text")
MODES = ("group", "query")  # one ratio per KV group | per query head (the paper's rule)

# self_attn module -> its _LayerState, for the layers of models currently inside `mspoe`.
_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------------------- state


@dataclass
class _LayerState:
    shared: MsPoE
    layer: int
    kind: int = 0  # the layer's RoPE kind (rope_info: Gemma-3's sliding / global tables)
    rank: torch.Tensor | None = None  # [B, Hk] (group) or [B, Hq] (query) ratio index of each unit (last prefill)
    scores: torch.Tensor | None = None  # [B, Hq] position-awareness scores (last prefill)
    prefill: bool = True
    cache: object | None = None  # the real past_key_values, held only during one forward


@dataclass
class MsPoE:
    """Handle yielded by `mspoe`: the ratio ladder and each patched layer's current head ordering.

    Set `order_query` (LongTensor [B] of column indices, or None) before a prefill to rank the heads
    on the attention row of that token instead of each row's last real token, e.g. the last prompt
    token when teacher-forcing prompt + answer, to get the ordering generation would use.
    """

    ratios: torch.Tensor  # [U] ladder, rank k -> ratios[k]; U = Hk (group) or Hq (query)
    groups: int  # query heads per KV head
    layers: tuple[int, ...]
    mode: str = "group"
    order_query: torch.Tensor | None = None
    _states: dict[int, _LayerState] = field(default_factory=dict, repr=False)
    _tables: dict = field(default_factory=dict, repr=False)  # kind -> (position_ids, cos, sin)
    _rotary: object = field(default=None, repr=False)
    _kinds: tuple = field(default=(), repr=False)  # extra rotary argument per kind: () or (layer_type,)

    def ranks(self, layer: int) -> torch.Tensor:
        """Rank of each ratio unit at the last prefill (0 = most position-aware): [B, Hk] KV groups (group
        mode) or [B, Hq] query heads (query mode)."""
        st = self._states[layer]
        if st.rank is None:
            raise PosbiasError(f"layer {layer} has seen no prefill yet", "run a forward pass inside the context first")
        return st.rank

    def scores(self, layer: int) -> torch.Tensor:
        """[B, Hq] position-awareness scores of the query heads at the last prefill."""
        self.ranks(layer)
        return self._states[layer].scores

    def head_ratios(self, layer: int) -> torch.Tensor:
        """[B, Hq] ratio r_h used by each query head (group mode: its KV group's ratio)."""
        r = self.ratios[self.ranks(layer)]
        return r if self.mode == "query" else r.repeat_interleave(self.groups, dim=1)

    def tables(self, position_ids: torch.Tensor, like: torch.Tensor, kind: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [R, B', T, D] at position_ids / r for every ratio r, with RoPE kind `kind`'s frequencies
        (the model's rotary module called as the model calls it for that kind); computed once per forward."""
        pos, cos, sin = self._tables.get(kind, (None, None, None))
        if pos is not position_ids or cos.dtype != like.dtype or cos.device != like.device:
            r = self.ratios.to(like.device)
            scaled = position_ids.float()[None] / r[:, None, None]  # [R, B', T]
            cos, sin = self._rotary(like, scaled.flatten(0, 1), *self._kinds[kind])
            shape = (*scaled.shape, cos.shape[-1])
            cos, sin = cos.view(shape), sin.view(shape)
            self._tables[kind] = (position_ids, cos, sin)  # holding the reference keeps the identity check valid
        return cos, sin


# ----------------------------------------------------------------------------- hooks


def _rank_heads(st: _LayerState, module, q, k, mask, kw) -> None:
    """Prefill: score every query head on this input and store the ranks (per KV group or per query head)."""
    hs = st.shared
    b, s = q.shape[0], k.shape[2]
    probe, valid = probe_valid(mask, b, s, q.device, hs.order_query)
    q_row = q[torch.arange(b, device=q.device), :, probe]  # [B, Hq, D]
    scaling = kw.get("scaling") or module.head_dim**-0.5
    st.scores = outlier_scores(q_row, k, valid, scaling)
    st.rank = rank_groups(st.scores, 1 if hs.mode == "query" else hs.groups)


class _OneGroup:
    """The attention module as the backend sees it in query mode: keys and values already have one head per
    query head, so the backend must not repeat them again (num_key_value_groups = 1)."""

    num_key_value_groups = 1

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def _make_attention(backend):
    """The registered attention function: Ms-PoE on patched layers, `backend` unchanged elsewhere."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        st = _ACTIVE.get(module)
        if st is None:
            return backend(module, query, key, value, attention_mask, **kwargs)
        hs = st.shared
        if st.prefill:
            _rank_heads(st, module, query, key, attention_mask, kwargs)
        elif st.rank is None or st.rank.shape[0] != query.shape[0]:
            raise PosbiasError(
                "mspoe: a cached forward without a matching prefill (no stored head ordering for this batch)",
                "start generation inside the mspoe context, with the same batch",
            )
        cos, sin = hs.tables(kwargs.get("position_ids"), query, st.kind)  # [R, B', T, D]
        per_query = hs.mode == "query" and hs.groups > 1
        query, key = rotate_heads(query, key, cos, sin, st.rank, hs.groups, per_query)
        cache, st.cache = st.cache, None
        if cache is not None:  # the cache stores keys already rotated with their ratio (query mode: [B, Hq, S, D])
            key, value = cache.update(key, value, module.layer_idx)
        if per_query:
            value = value.repeat_interleave(hs.groups, dim=1)  # [B, Hq, S, D], the order of repeat_kv
            module = _OneGroup(module)
        return backend(module, query, key, value, attention_mask, **kwargs)

    return attention


def _pre_hook(module, args, kwargs):
    """Before a patched self_attn: no stock RoPE, keep the cache for the attention function."""
    return args, take_rope_and_cache(_ACTIVE[module], module, kwargs, "mspoe")


# ----------------------------------------------------------------------------- the context manager


def _check_model(model):
    """-> (base model with rotary_emb and layers, model_type, rope_info) or a PosbiasError."""
    kind = getattr(model.config, "model_type", "?")
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    if kind not in SUPPORTED or getattr(base, "rotary_emb", None) is None or not hasattr(base, "layers"):
        raise PosbiasError(
            f"mspoe runs on the model types {', '.join(SUPPORTED)} (checked: tests/test_model_families.py); "
            f"got model_type={kind!r}",
            "Ms-PoE rescales rotary position embeddings per head; use a RoPE model of those types",
        )
    try:
        info = rope_info(model)  # every RoPE kind must be static (dynamic / longrope frequencies depend on length)
    except PosbiasError as e:
        raise PosbiasError(f"mspoe: {e.problem}", e.fix) from None
    if any(layer.self_attn in _ACTIVE for layer in base.layers):
        raise PosbiasError("mspoe is already active on this model", "do not nest mspoe contexts")
    return base, kind, info


def _pick_layers(layers, n_layers: int) -> tuple[int, ...]:
    chosen = tuple(range(SKIP_FIRST, n_layers)) if layers is None else tuple(sorted({int(i) for i in layers}))
    if not chosen:
        raise PosbiasError(
            f"mspoe: no layers to patch (the model has {n_layers} layers; the default skips the first {SKIP_FIRST})",
            "pass layers=range(n_layers) or an explicit list",
        )
    if chosen[0] < 0 or chosen[-1] >= n_layers:
        raise PosbiasError(f"mspoe: layer indices {chosen} out of range for {n_layers} layers")
    return chosen


def check_model(model, layers=None) -> None:
    """PosbiasError if `mspoe(model, layers=layers)` would refuse the model (a check without side effects)."""
    base, _, _ = _check_model(model)
    _pick_layers(layers, len(base.layers))


def _register(model, base, kind: str) -> tuple[str, str]:
    """Register the mspoe attention + mask functions for the model's backend -> (old, new) names."""
    return register_attention(model, base.layers[0].self_attn, f"mspoe_{kind}", _make_attention, "mspoe")


def _handle(model, info, min_ratio: float, max_ratio: float, layers, mode: str) -> MsPoE:
    """The MsPoE handle: ladder (one entry per KV group or per query head), layers, the rotary and its kinds."""
    cfg = model.config
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_q
    chosen = _pick_layers(layers, len(info.attns))
    handle = MsPoE(ratio_ladder(min_ratio, max_ratio, n_q if mode == "query" else n_kv), n_q // n_kv, chosen, mode)
    handle._rotary = info.rotary
    handle._kinds = tuple(() if len(info.kinds) == 1 else (k.name,) for k in info.kinds)
    return handle


@contextmanager
def mspoe(model, min_ratio: float = 1.2, max_ratio: float = 1.8, layers=None, mode: str = "group"):
    """Apply Ms-PoE to `model` inside the block; restore it exactly on exit. Yields an `MsPoE` handle.

    min_ratio/max_ratio: the ratio ladder (rank 0, the most position-aware unit, gets min_ratio).
    layers: indices of the layers to patch; None = all but the first two (the paper's setting).
    mode: "group" (one ratio per KV group) or "query" (one per query head, the paper's rule).
    Works for batched left-padded forwards (pass position_ids = cumsum(mask) - 1) and for
    model.generate with the KV cache; the head ordering is measured at each prefill.
    """
    if not 0 < min_ratio <= max_ratio:
        raise PosbiasError(f"mspoe: need 0 < min_ratio <= max_ratio, got {min_ratio}, {max_ratio}")
    if mode not in MODES:
        raise PosbiasError(f"mspoe: unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
    base, kind, info = _check_model(model)
    handle = _handle(model, info, min_ratio, max_ratio, layers, mode)
    old, name = _register(model, base, kind)
    states = {base.layers[i].self_attn: _LayerState(handle, i, info.layer_kinds[i]) for i in handle.layers}
    handle._states.update({st.layer: st for st in states.values()})
    try:
        with patched_attention(model, old, name, states, _ACTIVE, _pre_hook):
            yield handle
    finally:
        handle._tables = {}
