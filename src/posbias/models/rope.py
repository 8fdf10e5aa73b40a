"""RoPE position scaling per layer (LPES eq. 2) and the per-row cos/sin machinery it shares with Attention Buckets.

Llama, Qwen2 and Mistral compute RoPE cos/sin once per forward (`model.model.rotary_emb`) and pass them, with
`position_ids`, as keyword arguments to every `self_attn`, which rotates q and k *before* the KV-cache update.
A forward pre-hook (`with_kwargs=True`) on each `self_attn` can therefore swap `position_embeddings` for cos/sin
looked up from precomputed tables at `position_ids`. This is exact, cache-safe (keys are cached already rotated)
and independent of the attention backend. All hooks are removed on exit, which restores the model exactly.

Shapes: T = sequence length, R = rows in the (possibly expanded) batch, P = table length (positions),
D = head_dim, G = number of tables (distinct factors or bases).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn

from ..errors import PosbiasError

_FAMILIES = "a Llama/Qwen2/Mistral-family model (RoPE with position_embeddings passed to each self_attn)"
_DYNAMIC = ("dynamic", "longrope")  # inv_freq depends on the sequence length: fixed tables would be wrong
_ACTIVE = "_posbias_rope_active"  # attribute set on the model while one of our RoPE context managers is active


@dataclass
class RopeInfo:
    """What the RoPE methods need from a model.

    inv_freq: (D/2,) float32, as the model multiplies positions by it; attention_scaling multiplies cos and sin.
    """

    rotary: nn.Module
    inv_freq: torch.Tensor
    attention_scaling: float
    attns: list[nn.Module]
    model_type: str
    rope_type: str
    rope_theta: float | None
    max_positions: int


def rope_info(model) -> RopeInfo:
    """The rotary module, inv_freq, attention_scaling and the decoder layers' self_attn modules of a RoPE model."""
    cfg = model.config
    mtype = getattr(cfg, "model_type", type(model).__name__)
    base = getattr(model, "base_model", model)
    rot, layers = getattr(base, "rotary_emb", None), getattr(base, "layers", None)
    if rot is None or getattr(rot, "inv_freq", None) is None or layers is None:
        raise PosbiasError(
            f"model type '{mtype}' has no rotary position embedding (RoPE) this method can rescale",
            f"use {_FAMILIES}",
        )
    attns = [getattr(layer, "self_attn", None) for layer in layers]
    if any(a is None for a in attns):
        raise PosbiasError(f"model type '{mtype}' has decoder layers without a self_attn module", f"use {_FAMILIES}")
    rope_type = str(getattr(rot, "rope_type", "default"))
    if rope_type in _DYNAMIC:
        raise PosbiasError(
            f"model type '{mtype}' uses rope_type '{rope_type}', whose frequencies change with the sequence length",
            "use a model with a static RoPE (default, linear, llama3 or yarn)",
        )
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return RopeInfo(
        rotary=rot,
        inv_freq=rot.inv_freq.detach().float(),
        attention_scaling=float(getattr(rot, "attention_scaling", 1.0)),
        attns=attns,
        model_type=mtype,
        rope_type=rope_type,
        rope_theta=float(theta) if theta is not None else None,
        max_positions=int(getattr(cfg, "max_position_embeddings", 0) or 0),
    )


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


_GATHER_ALL_LIMIT = 1 << 18  # groups x position ids gathered at once (e.g. 30 layers x 8k ids)


class RopeTables:
    """cos/sin tables for G (inv_freq, position scale) pairs: cos[g, p] = cos((p / scale_g) * inv_freq_g) (eq. 2).

    Built like the model's rotary embedding (fp32 product, cat(freqs, freqs), times attention_scaling, then cast),
    so a table with the model's own inv_freq and scale 1 reproduces its cos/sin. Grows on demand.
    """

    def __init__(self, inv_freqs: torch.Tensor, scales: Sequence[float], attention_scaling: float,
                 dtype: torch.dtype, device: torch.device, size: int):
        self.inv_freqs = inv_freqs.detach().float().to(device)  # (G, D/2)
        self.scales = torch.tensor([float(s) for s in scales], dtype=torch.float32, device=device)  # (G,)
        self.attention_scaling, self.dtype, self.device = attention_scaling, dtype, device
        self._last: torch.Tensor | None = None
        self._gathered_ids: torch.Tensor | None = None
        self._gathered: tuple[torch.Tensor, torch.Tensor] | None = None
        self._build(max(int(size), 1))

    @property
    def groups(self) -> int:
        return self.inv_freqs.shape[0]

    @torch.no_grad()
    def _build(self, size: int) -> None:
        t = torch.arange(size, dtype=torch.float32, device=self.device)
        t = t[None, :] / self.scales[:, None]  # (G, P): positions i / s  (eq. 2)
        freqs = t[..., None] * self.inv_freqs[:, None, :]  # (G, P, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (G, P, D)
        self.cos = (emb.cos() * self.attention_scaling).to(self.dtype)
        self.sin = (emb.sin() * self.attention_scaling).to(self.dtype)
        self.size = size

    def ensure(self, position_ids: torch.Tensor) -> None:
        """Grow the tables if position_ids reach past them (checked once per forward: the same tensor reaches every layer)."""
        if position_ids is self._last:
            return
        lo, hi = torch.aminmax(position_ids)
        lo, hi = int(lo), int(hi)
        if lo < 0:
            raise PosbiasError(f"negative position id {lo} reached a RoPE table", "pass position_ids = cumsum(mask) - 1, clamped")
        if hi >= self.size:
            self._build(max(hi + 1, 2 * self.size))
            self._gathered_ids = self._gathered = None
        self._last = position_ids

    def lookup(self, position_ids: torch.Tensor, group: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (R or 1, T) -> cos, sin (R or 1, T, D); group: one table index or (R, 1) per-row indices.

        For one table index, the rows of every group are gathered together once per forward (the same
        position_ids tensor reaches every layer) and each layer takes a view: one gather per forward
        instead of one per layer, which is what keeps LPES at the cost of the plain model."""
        self.ensure(position_ids)
        if not isinstance(group, int):
            return self.cos[group, position_ids], self.sin[group, position_ids]
        if self.groups * position_ids.numel() > _GATHER_ALL_LIMIT:  # long prefill: per-layer gathers, less memory
            return self.cos[group][position_ids], self.sin[group][position_ids]
        if position_ids is not self._gathered_ids:
            self._gathered = (self.cos[:, position_ids], self.sin[:, position_ids])  # (G, R, T, D)
            self._gathered_ids = position_ids
        return self._gathered[0][group], self._gathered[1][group]

    def release(self) -> None:
        self._last = self._gathered_ids = self._gathered = None


def replace_position_embeddings(kwargs: dict, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """Swap the model's (cos, sin) in a self_attn call's kwargs, keeping its dtype."""
    old = kwargs.get("position_embeddings")
    if old is None:
        raise PosbiasError(
            "self_attn was called without position_embeddings as a keyword argument", f"use {_FAMILIES}"
        )
    if cos.dtype != old[0].dtype:
        cos, sin = cos.to(old[0].dtype), sin.to(old[1].dtype)
    kwargs["position_embeddings"] = (cos, sin)
    return kwargs


def position_ids_of(kwargs: dict) -> torch.Tensor:
    pos = kwargs.get("position_ids")
    if pos is None:
        raise PosbiasError("self_attn was called without position_ids", f"use {_FAMILIES}")
    return pos


@contextmanager
def rope_guard(model) -> Iterator[None]:
    """Refuse to stack two of our RoPE modifications on one model (the last pre-hook would silently win)."""
    if getattr(model, _ACTIVE, False):
        raise PosbiasError("a RoPE modification (layer scaling or attention buckets) is already active on this model",
                           "exit the other context manager first")
    setattr(model, _ACTIVE, True)
    try:
        yield
    finally:
        delattr(model, _ACTIVE)


def _check_factors(factors: Sequence[float], n_layers: int, mtype: str) -> list[float]:
    fs = [float(f) for f in factors]
    if len(fs) != n_layers:
        raise PosbiasError(
            f"got {len(fs)} RoPE scaling factors for a {n_layers}-layer '{mtype}' model",
            f"pass exactly one factor per decoder layer ({n_layers})",
        )
    bad = [f for f in fs if not (math.isfinite(f) and f > 0)]
    if bad:
        raise PosbiasError(f"RoPE scaling factors must be finite and > 0, got {bad[:4]}", "use positive factors")
    return fs


def check_layer_factors(model, factors: Sequence[float]) -> list[float]:
    """The factors as floats if the model is a RoPE model with one decoder layer per factor, else PosbiasError."""
    info = rope_info(model)
    return _check_factors(factors, len(info.attns), info.model_type)


def _layer_hook(tables: RopeTables, group: int):
    def hook(module, args, kwargs):
        cos, sin = tables.lookup(position_ids_of(kwargs), group)
        return args, replace_position_embeddings(kwargs, cos, sin)

    return hook


@contextmanager
def layer_rope_scaling(model, factors: Sequence[float], max_positions: int | None = None) -> Iterator[object]:
    """Layer h sees positions i / s_h (LPES eq. 2: f'(x, i) = f(x, i / s_h)) inside the block; reversible.

    factors: one s_h > 0 per decoder layer. Layers with s_h == 1.0 are left untouched (bit-identical).
    Tables (G distinct factors, P = max_positions or max_position_embeddings, D) are built once on entry and
    grow if a larger position appears. Works with batched left-padded teacher forcing (position_ids =
    cumsum(mask) - 1) and with model.generate's KV cache (position ids continue past the prompt).
    """
    info = rope_info(model)
    fs = _check_factors(factors, len(info.attns), info.model_type)
    distinct = sorted({f for f in fs if f != 1.0})
    handles, tables = [], None
    with rope_guard(model):
        try:
            if distinct:
                size = max_positions or info.max_positions or 2048
                inv = info.inv_freq[None].expand(len(distinct), -1)
                tables = RopeTables(inv, distinct, info.attention_scaling, model_dtype(model), info.inv_freq.device, size)
                for attn, f in zip(info.attns, fs):
                    if f != 1.0:
                        hook = _layer_hook(tables, distinct.index(f))
                        handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
            yield model
        finally:
            for h in handles:
                h.remove()
            if tables is not None:
                tables.release()


def uniform_rope_scaling(model, factor: float, max_positions: int | None = None):
    """Positional Interpolation: the same factor s on every layer (positions i / s everywhere)."""
    n = len(rope_info(model).attns)
    return layer_rope_scaling(model, [float(factor)] * n, max_positions)
