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
  ratio index head_order[h] -- the inverse of the intended permutation (head_order[k] is the head
  *ranked* k; head h should get index rank[h] = argsort(head_order)[h]). The two agree only when the
  ordering is its own inverse (identity, disjoint swaps).
- GQA: keys take the ratio of query head g * G of their group (cos[::G] after the permutation); the
  other G - 1 query heads of the group use different ratios than the keys they attend to, so their
  logits no longer depend on relative position alone.
- Layers: the scripts patch layers 2..31 of 32 (the first two keep plain RoPE).
- Decode: the ordering is computed once at prefill, kept for all decode steps (the KV cache holds
  keys rotated with their head's ratio) and reset by hand after each generate(); batch size 1 only
  (with a batch the score tensor has the wrong shape), and the rebuilt causal mask ignores padding.

What this module does, and where it deliberately differs:
- Score (same statistic): per query head, from un-rotated q and k, softmax of the query row of
  each batch row's last real token (or `MsPoE.order_query`) over its valid (unpadded, causal) keys;
  score = #{j : a_j > alpha / n} / n with n the number of valid keys.  Computed per batch row, so
  batched and left-padded inputs get each row's own ordering.
- GQA: ratios are assigned per KV group, not per query head. Keys are rotated once per KV head,
  so the only consistent choice is one ratio per group, used for the group's keys and all its
  queries; then every head's logits depend on (i - j) / r only. Groups are ranked by the mean score
  of their query heads (the natural summary of "how position-aware is this group"); with
  H_kv == H (multi-head attention) this is exactly the paper's per-head scheme.
- Ratios: the ladder is linspace(min_ratio, max_ratio, H_kv), endpoints included ("from 1.2 to
  1.8"); rank 0 (highest score) gets min_ratio. Ties are broken by head index (stable sort), so
  the ordering is deterministic.
- Layers: `layers=None` patches all but the first two layers, like the paper's scripts.
- Decode: each patched layer stores its ordering at prefill (a forward whose cache is empty or
  absent) and reuses it for later forwards on the same cache (decode steps, chunked continuation).
  Keys enter the cache already rotated with their group's ratio. A new generate() call starts with
  an empty cache and so measures a new ordering; no manual reset.
- Teacher forcing prompt + answer in one forward ranks the heads on the row's last token (an answer
  token) unless `MsPoE.order_query` names the last prompt column; with it, the ordering and the
  logits equal what generate() computes from the prompt alone (tested).
- Scope: Llama/Qwen2/Mistral (Ms-PoE needs RoPE; GPT-2 etc. raise PosbiasError); rope types whose
  frequencies depend on the sequence length (dynamic, longrope) are refused. Tested with the sdpa
  and eager backends; others are passed through but untested, and flex BlockMasks are refused.

How it hooks into transformers (checked on 5.23; Llama/Qwen2/Mistral attention):
- `self_attn.forward` rotates q/k with `position_embeddings`, updates `past_key_values`, then calls
  `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`. Per-head rotation cannot go through one
  cos/sin pair, so a forward pre-hook on each patched `self_attn` (with_kwargs) replaces
  `position_embeddings` by the identity (cos = 1, sin = 0; q * 1 + rotate_half(q) * 0 == q exactly)
  and takes `past_key_values` away from the stock code. The model is switched to a registered
  attention function ("posbias_mspoe_<type>_<backend>") that receives the un-rotated q/k, the mask
  and `position_ids`, ranks the heads (prefill), rotates q/k per group with the model's own rotary
  module evaluated at positions / r, writes the rotated keys into the cache itself, and then calls
  the original backend (sdpa/eager/...). Unpatched layers go straight to the backend.
- The mask function of the original backend is registered under the same name
  (AttentionMaskInterface); without it `create_causal_mask` returns None and padding is ignored.
- On exit the hooks are removed and the original attention implementation is set back, so logits
  are bit-identical to before. With all ratios 1 the rotation reproduces stock RoPE bit for bit.

Paper equations implemented: f(x, i / r_h) in `_rotate` (rotation with the rotary module evaluated at
position_ids / r), the position-awareness (outlier) score in `outlier_scores`, the ratio ladder and
ranking in `ratio_ladder` / `rank_groups`. (Equation numbers are not quoted: not checked against the PDF.)
"""

from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..errors import PosbiasError

ALPHA = 4.0  # outlier threshold: weight > ALPHA * row mean (public code and paper)
SKIP_FIRST = 2  # default: leave the first two layers on plain RoPE (public scripts: layers 2..31)
SUPPORTED = ("llama", "qwen2", "mistral")
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")

# self_attn module -> its _LayerState, for the layers of models currently inside `mspoe`.
_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------------------- the math


def ratio_ladder(min_ratio: float, max_ratio: float, n: int) -> torch.Tensor:
    """The n scaling ratios, min_ratio .. max_ratio inclusive (rank k gets entry k)."""
    if n == 1:
        return torch.tensor([float(min_ratio)])
    return torch.linspace(float(min_ratio), float(max_ratio), n)


def outlier_scores(q_row: torch.Tensor, k: torch.Tensor, valid: torch.Tensor, scaling: float) -> torch.Tensor:
    """Position-awareness score per query head: the fraction of valid keys with weight > ALPHA / n.

    q_row: [B, Hq, D] un-rotated query of the probed token; k: [B, Hk, S, D] un-rotated keys;
    valid: [B, S] keys the probed query may attend to. -> [B, Hq] float32.
    Query head h reads KV head h // G (transformers' repeat_kv order).
    """
    b, hq, d = q_row.shape
    hk = k.shape[1]
    q = q_row.float().view(b, hk, hq // hk, d)
    logits = torch.einsum("bkgd,bksd->bkgs", q, k.float()).reshape(b, hq, -1) * scaling
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    n = valid.sum(-1).clamp(min=1).float()[:, None, None]  # [B, 1, 1]
    outliers = (weights > ALPHA / n) & valid[:, None, :]
    return outliers.sum(-1).float() / n[..., 0]


def rank_groups(scores: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hq] head scores -> [B, Hk] rank of each KV group (0 = highest mean score).

    Ties go to the lower group index (stable sort), so equal scores give a deterministic ordering.
    """
    b, hq = scores.shape
    group_score = scores.view(b, hq // groups, groups).mean(-1)  # [B, Hk]
    order = torch.sort(-group_score, dim=-1, stable=True).indices  # order[:, k] = group ranked k
    return torch.argsort(order, dim=-1)  # inverse permutation: rank of each group


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """f(x, i / r_h): x [B, H, T, D] with per-head cos/sin [B, H, T, D] (same formula as transformers)."""
    return (x * cos) + (_rotate_half(x) * sin)


# ----------------------------------------------------------------------------- state


@dataclass
class _LayerState:
    shared: MsPoE
    layer: int
    rank: torch.Tensor | None = None  # [B, Hk] ratio index of each KV group (last prefill)
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

    ratios: torch.Tensor  # [Hk] ladder, rank k -> ratios[k]
    groups: int  # query heads per KV head
    layers: tuple[int, ...]
    order_query: torch.Tensor | None = None
    _states: dict[int, _LayerState] = field(default_factory=dict, repr=False)
    _tables: tuple = field(default=(None, None, None), repr=False)  # (position_ids, cos, sin)
    _rotary: object = field(default=None, repr=False)

    def ranks(self, layer: int) -> torch.Tensor:
        """[B, Hk] rank of each KV group at the last prefill (0 = most position-aware)."""
        st = self._states[layer]
        if st.rank is None:
            raise PosbiasError(f"layer {layer} has seen no prefill yet", "run a forward pass inside the context first")
        return st.rank

    def scores(self, layer: int) -> torch.Tensor:
        """[B, Hq] position-awareness scores of the query heads at the last prefill."""
        self.ranks(layer)
        return self._states[layer].scores

    def head_ratios(self, layer: int) -> torch.Tensor:
        """[B, Hq] ratio r_h used by each query head (its KV group's ratio)."""
        return self.ratios[self.ranks(layer)].repeat_interleave(self.groups, dim=1)

    def tables(self, position_ids: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [R, B', T, D] at position_ids / r for every ratio r, computed once per forward."""
        pos, cos, sin = self._tables
        if pos is not position_ids or cos.dtype != like.dtype or cos.device != like.device:
            r = self.ratios.to(like.device)
            scaled = position_ids.float()[None] / r[:, None, None]  # [R, B', T]
            cos, sin = self._rotary(like, scaled.flatten(0, 1))
            shape = (*scaled.shape, cos.shape[-1])
            cos, sin = cos.view(shape), sin.view(shape)
            self._tables = (position_ids, cos, sin)  # holding the reference keeps the identity check valid
        return cos, sin


# ----------------------------------------------------------------------------- hooks


def _valid_keys(mask, b: int, s: int, device) -> torch.Tensor:
    """[B, S] keys visible to each row's last query, from any of the backends' mask formats."""
    if mask is None:  # sdpa without padding: plain causal, the last row sees everything
        return torch.ones(b, s, dtype=torch.bool, device=device)
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4):
        raise PosbiasError(
            f"mspoe cannot read an attention mask of type {type(mask).__name__}",
            "use the sdpa or eager attention implementation",
        )
    row = mask[:, 0, -1, :s] if mask.dim() == 4 else mask[:, :s]
    if row.dtype != torch.bool:
        row = row > torch.finfo(row.dtype).min if row.is_floating_point() else row != 0
    return row.expand(b, s)


def _probe_valid(hs: MsPoE, mask, b: int, s: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(query column [B], valid keys [B, S]) of the row whose attention ranks the heads."""
    valid = _valid_keys(mask, b, s, device)
    cols = torch.arange(s, device=device)
    if hs.order_query is None:
        probe = (valid * cols).argmax(-1)  # last real token of each row (left or right padding)
    else:
        probe = hs.order_query.to(device).long().view(-1).expand(b)
    return probe, valid & (cols[None] <= probe[:, None])


def _rank_heads(st: _LayerState, module, q, k, mask, kw) -> None:
    """Prefill: score every query head on this input and store the per-group ranks."""
    hs = st.shared
    b, s = q.shape[0], k.shape[2]
    probe, valid = _probe_valid(hs, mask, b, s, q.device)
    q_row = q[torch.arange(b, device=q.device), :, probe]  # [B, Hq, D]
    scaling = kw.get("scaling") or module.head_dim**-0.5
    st.scores = outlier_scores(q_row, k, valid, scaling)
    st.rank = rank_groups(st.scores, hs.groups)


def _rotate_per_group(st: _LayerState, q, k, position_ids):
    """Rotate q [B, Hq, T, D] and k [B, Hk, T, D] with their KV group's ratio."""
    cos, sin = st.shared.tables(position_ids, q)  # [R, B', T, D]
    b = q.shape[0]
    cos = cos.expand(-1, b, -1, -1).transpose(0, 1)  # [B, R, T, D]
    sin = sin.expand(-1, b, -1, -1).transpose(0, 1)
    rows = torch.arange(b, device=q.device)[:, None]
    idx_k = st.rank.to(q.device)
    idx_q = idx_k.repeat_interleave(st.shared.groups, dim=1)
    return _rotate(q, cos[rows, idx_q], sin[rows, idx_q]), _rotate(k, cos[rows, idx_k], sin[rows, idx_k])


def _make_attention(backend):
    """The registered attention function: Ms-PoE on patched layers, `backend` unchanged elsewhere."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        st = _ACTIVE.get(module)
        if st is None:
            return backend(module, query, key, value, attention_mask, **kwargs)
        position_ids = kwargs.get("position_ids")
        if st.prefill:
            _rank_heads(st, module, query, key, attention_mask, kwargs)
        elif st.rank is None or st.rank.shape[0] != query.shape[0]:
            raise PosbiasError(
                "mspoe: a cached forward without a matching prefill (no stored head ordering for this batch)",
                "start generation inside the mspoe context, with the same batch",
            )
        query, key = _rotate_per_group(st, query, key, position_ids)
        cache, st.cache = st.cache, None
        if cache is not None:  # the cache stores keys already rotated with their group's ratio
            key, value = cache.update(key, value, module.layer_idx)
        return backend(module, query, key, value, attention_mask, **kwargs)

    return attention


def _pre_hook(module, args, kwargs):
    """Before a patched self_attn: no stock RoPE, keep the cache for the attention function."""
    st = _ACTIVE[module]
    if kwargs.get("position_ids") is None or "position_embeddings" not in kwargs:
        raise PosbiasError("mspoe: self_attn was called without position_ids/position_embeddings", "use a supported model")
    cache = kwargs.get("past_key_values")
    st.prefill = cache is None or cache.get_seq_length(module.layer_idx) == 0
    st.cache = cache
    cos = kwargs["position_embeddings"][0]
    one = torch.ones((1, 1, 1), dtype=cos.dtype, device=cos.device)
    kwargs["position_embeddings"] = (one, torch.zeros_like(one))
    kwargs["past_key_values"] = None
    return args, kwargs


# ----------------------------------------------------------------------------- the context manager


def _check_model(model):
    """-> (base model with rotary_emb and layers, model_type) or a PosbiasError."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "?")
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    if kind not in SUPPORTED or getattr(base, "rotary_emb", None) is None or not hasattr(base, "layers"):
        raise PosbiasError(
            f"mspoe needs a RoPE model of the Llama/Qwen2/Mistral families; got model_type={kind!r}",
            "Ms-PoE rescales rotary position embeddings; use a RoPE model (e.g. SmolLM2, Qwen2, Mistral)",
        )
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
    if rope_type in _LENGTH_DEPENDENT_ROPE:
        raise PosbiasError(f"mspoe does not support rope_type={rope_type!r} (its frequencies depend on length)")
    if any(layer.self_attn in _ACTIVE for layer in base.layers):
        raise PosbiasError("mspoe is already active on this model", "do not nest mspoe contexts")
    return base, kind


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
    base, _ = _check_model(model)
    _pick_layers(layers, len(base.layers))


def _register(model, base, kind: str) -> tuple[str, str]:
    """Register the Ms-PoE attention + mask functions for the model's backend -> (old, new) names."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    old = model.config._attn_implementation
    attn = base.layers[0].self_attn
    if old == "eager":
        backend = sys.modules[type(attn).__module__].eager_attention_forward
    else:
        backend = ALL_ATTENTION_FUNCTIONS.get(old)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(old)
    if backend is None or mask_fn is None:
        raise PosbiasError(f"mspoe: unsupported attention implementation {old!r}", "load the model with sdpa or eager")
    name = f"posbias_mspoe_{kind}_{old}"
    AttentionInterface.register(name, _make_attention(backend))
    AttentionMaskInterface.register(name, mask_fn)
    return old, name


@contextmanager
def mspoe(model, min_ratio: float = 1.2, max_ratio: float = 1.8, layers=None):
    """Apply Ms-PoE to `model` inside the block; restore it exactly on exit. Yields an `MsPoE` handle.

    min_ratio/max_ratio: the ratio ladder (rank 0, the most position-aware KV group, gets min_ratio).
    layers: indices of the layers to patch; None = all but the first two (the paper's setting).
    Works for batched left-padded forwards (pass position_ids = cumsum(mask) - 1) and for
    model.generate with the KV cache; the head ordering is measured at each prefill.
    """
    if not 0 < min_ratio <= max_ratio:
        raise PosbiasError(f"mspoe: need 0 < min_ratio <= max_ratio, got {min_ratio}, {max_ratio}")
    base, kind = _check_model(model)
    cfg = model.config
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    chosen = _pick_layers(layers, len(base.layers))
    handle = MsPoE(ratio_ladder(min_ratio, max_ratio, n_kv), cfg.num_attention_heads // n_kv, chosen)
    handle._rotary = base.rotary_emb
    old, name = _register(model, base, kind)
    hooks = []
    try:
        for i in chosen:
            attn = base.layers[i].self_attn
            handle._states[i] = _ACTIVE[attn] = _LayerState(handle, i)
            hooks.append(attn.register_forward_pre_hook(_pre_hook, with_kwargs=True))
        model.set_attn_implementation(name)
        yield handle
    finally:
        for h in hooks:
            h.remove()
        for i in chosen:
            _ACTIVE.pop(base.layers[i].self_attn, None)
        if model.config._attn_implementation != old:
            model.set_attn_implementation(old)
        handle._tables = (None, None, None)
