"""Positional hidden-channel scaling (Yu et al. 2025, "Mitigate Position Bias in Large Language Models via
Scaling a Single Dimension"): in chosen layers, channel c of the attention input is multiplied by s when the
last token's query and the keys it reads are computed; values and every earlier query stay as they were.

What the public code does (PositionalHidden/PositionalHidden, modeling_llama_hidden_scale.py,
`_init_hidden_states_scale` and the attention forwards):
- The scaled tensor is the attention module's input, i.e. the hidden state *after* the layer's input norm;
  `hidden[:, skip_first:, dims] *= factor` with skip_first 0 (every token).
- Prefill: every row gets the ordinary attention except the last `last_recompute_tokens` rows (1 when
  generating), which are recomputed from the scaled query against the scaled keys of all tokens, with the
  unscaled values (`change_value` False). The cache stores the *scaled* keys.
- Decode: the new token's query and key are scaled, so every generated token reads scaled keys.
- Validation (eval_on_valid_set.py) teacher-forces prompt + answer with last_recompute_tokens = answer + 1:
  the last prompt token and the answer tokens are "the last token", which is what generation computes.

Here (checked on transformers 5.23-5.24): forward pre-hooks on the chosen layers' `q_proj` and `k_proj` (nn
Linear modules that see the normed hidden state) scale channel c of their input; `v_proj` is untouched. A
forward pre-hook on the model takes the prompt end that `HiddenScaling.set_prompt_end` left for this forward
(default: each row's last column, which is the last real token under left padding). A forward hook on each chosen
`self_attn` recomputes the rows before the prompt end with the hooks off and no cache (the ordinary attention,
as the public code keeps them) and splices them in; it is skipped when every row is at or past the prompt end
(decode steps). The cache is written once, by the scaled call: it holds the scaled keys, as in the public code.
Hence: exact when off (hooks removed on exit), batch/padding invariant, and prefill + decode equal one forward
told where the prompt ends. Cost: one extra attention per chosen layer in a prefill, none in a decode step.

Shapes: B = batch rows, T = columns of this forward, H = hidden size.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from ..errors import PosbiasError
from .compat import cache_kwargs_key

_ACTIVE = "_posbias_hidden_active"


@dataclass
class HiddenScaling:
    """Handle yielded by `hidden_scaling`. `set_prompt_end(cols)` before a teacher-forced forward: cols[i] is
    row i's last prompt column; it applies to the next forward of the model only."""

    channel: int
    scale: float
    layers: tuple[int, ...]
    pending: torch.Tensor | None = None  # (B,) set by set_prompt_end, taken by the next forward
    prompt_end: torch.Tensor | None = None  # (B,) of the forward running now; None: each row's last column
    plain: bool = False  # True while the unscaled rows are recomputed
    cached: bool = False  # True while the running self_attn call reads a non-empty cache (a decode step)

    def set_prompt_end(self, cols) -> None:
        self.pending = None if cols is None else torch.as_tensor(cols).long().reshape(-1)


def decoder_layers(model):
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise PosbiasError(f"model type '{getattr(model.config, 'model_type', '?')}' has no decoder layers "
                           "hidden scaling can find", "use a Llama, Qwen2/3, Mistral or Gemma-2/3 model")
    return layers


def check_model(model, channel: int, layers: Sequence[int]) -> list:
    """The chosen layers' self_attn modules, or a one-line PosbiasError (channel / layer out of range, fused q/k)."""
    cfg, mtype = model.config, getattr(model.config, "model_type", "?")
    hidden, blocks = int(cfg.hidden_size), decoder_layers(model)
    if not 0 <= channel < hidden:
        raise PosbiasError(f"hidden channel {channel} is out of range for '{mtype}' (hidden size {hidden})",
                           f"pick a channel in 0..{hidden - 1}, or run `posbias hidden search`")
    bad = [i for i in layers if not 0 <= i < len(blocks)]
    if bad or not layers:
        raise PosbiasError(f"hidden-scaling layers {list(layers)[:6]} do not fit a {len(blocks)}-layer '{mtype}' model",
                           f"pick layers in 0..{len(blocks) - 1} (written a-b)")
    attns = [getattr(blocks[i], "self_attn", None) for i in layers]
    if any(a is None or not hasattr(a, "q_proj") or not hasattr(a, "k_proj") for a in attns):
        raise PosbiasError(f"model type '{mtype}' has no separate q_proj / k_proj in its self_attn (fused projections)",
                           "use a Llama, Qwen2/3, Mistral, OLMo-2 or Gemma-2/3 model")
    return attns


def _prompt_end_rows(st: HiddenScaling, B: int, T: int, device) -> torch.Tensor:
    """(B, T) bool: columns at or past each row's prompt end (the rows that get the scaled query)."""
    cols = torch.arange(T, device=device)
    if st.prompt_end is None:
        return (cols >= T - 1).expand(B, T)
    end = st.prompt_end.to(device)
    if end.numel() != B:
        raise PosbiasError(f"set_prompt_end got {end.numel()} columns for a batch of {B} rows", "pass one column per row")
    return cols[None, :] >= end[:, None]


def _scale_input(st: HiddenScaling):
    def hook(module, args, kwargs):
        if st.plain:
            return None
        x = args[0] if args else kwargs["input"]  # (B, T, H)
        x = x.clone()
        x[..., st.channel] *= st.scale  # the public code's `hidden[:, skip_first:, dims] *= factor`, normed input
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "input": x})

    return hook


def _attn_pre(st: HiddenScaling):
    def hook(module, args, kwargs):
        cache = kwargs.get(cache_kwargs_key(kwargs))
        st.cached = cache is not None and cache.get_seq_length(module.layer_idx) > 0
        return None

    return hook


def _attn_post(st: HiddenScaling):
    """Rows before the prompt end: the ordinary attention (no scaling, no cache write), spliced in."""

    def hook(module, args, kwargs, output):
        if st.plain or st.cached:
            return None  # a decode step: every query is a new token's, all scaled
        hs = args[0] if args else kwargs["hidden_states"]  # (B, T, H)
        B, T = hs.shape[:2]
        late = _prompt_end_rows(st, B, T, hs.device)  # (B, T)
        if bool(late.all()):
            return None
        plain_kwargs = {**kwargs, cache_kwargs_key(kwargs): None}
        st.plain = True
        try:
            plain = module.forward(*args, **plain_kwargs)
        finally:
            st.plain = False
        out = torch.where(late[..., None], output[0], plain[0])  # (B, T, H)
        return (out, *output[1:])

    return hook


@contextmanager
def hidden_scaling(model, channel: int, scale: float, layers: Sequence[int]) -> Iterator[HiddenScaling]:
    """Scale hidden channel `channel` by `scale` for the last token's query and the keys in `layers` (reversible).
    scale 1 installs nothing (the model itself)."""
    layers = tuple(sorted({int(i) for i in layers}))
    attns = check_model(model, int(channel), layers)
    st = HiddenScaling(int(channel), float(scale), layers)
    if getattr(model, _ACTIVE, False):
        raise PosbiasError("hidden scaling is already active on this model", "exit the other context manager first")
    setattr(model, _ACTIVE, True)
    handles = []

    def take_prompt_end(module, args, kwargs):
        st.prompt_end, st.pending = st.pending, None

    try:
        if st.scale != 1.0:
            handles.append(model.register_forward_pre_hook(take_prompt_end, with_kwargs=True))
            for attn in attns:
                handles.append(attn.q_proj.register_forward_pre_hook(_scale_input(st), with_kwargs=True))
                handles.append(attn.k_proj.register_forward_pre_hook(_scale_input(st), with_kwargs=True))
                handles.append(attn.register_forward_pre_hook(_attn_pre(st), with_kwargs=True))
                handles.append(attn.register_forward_hook(_attn_post(st), with_kwargs=True))
        yield st
    finally:
        for h in handles:
            h.remove()
        st.pending = st.prompt_end = None
        delattr(model, _ACTIVE)


def middle_layers(n_layers: int) -> list[int]:
    """The public configs scale layers 10..25 of 32-layer models (10..34 of 40, 10..42 of 48); here the 32-layer
    range [10, 26) taken proportionally: [round(10 L / 32), round(26 L / 32)), e.g. 9..23 of 30 layers."""
    lo, hi = round(10 * n_layers / 32), round(26 * n_layers / 32)
    return list(range(lo, max(hi, lo + 1)))
