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

_FAMILIES = ("a RoPE model whose decoder layers pass position_embeddings to a self_attn module (Llama, Qwen2/3, Mistral, "
             "Mixtral, Phi-3, Starcoder2, OLMo-2, Gemma-2/3)")
LENGTH_DEPENDENT = ("dynamic", "longrope")  # inv_freq depends on the sequence length: fixed tables would be wrong
_ACTIVE = "_posbias_rope_active"  # attribute set on the model while one of our RoPE context managers is active


@dataclass
class RopeKind:
    """One rotary table of a model. Most models have one ("default"); Gemma-3 has one per layer type
    ("sliding_attention" with theta 1e4, "full_attention" with theta 1e6), each layer using its type's.

    inv_freq: (D/2,) float32, as the model multiplies positions by it; attention_scaling multiplies cos and sin.
    """

    name: str
    inv_freq: torch.Tensor
    attention_scaling: float
    rope_type: str
    rope_theta: float | None
    buffer_dtype: torch.dtype  # the model's inv_freq buffer dtype (a bf16 buffer is rounded)


@dataclass
class RopeInfo:
    """What the RoPE methods need from a model: its rotary module, its RoPE kinds, and per decoder
    layer the self_attn module and the kind it uses (`layer_kinds[i]` indexes `kinds`).

    `inv_freq`, `attention_scaling`, `rope_type` and `rope_theta` are the main kind's (the only one, or
    Gemma-3's "full_attention"): the base a single-number option such as a bucket base refers to.
    """

    rotary: nn.Module
    kinds: list[RopeKind]
    layer_kinds: list[int]
    attns: list[nn.Module]
    model_type: str
    max_positions: int
    main: int = 0  # index of the main kind

    @property
    def inv_freq(self) -> torch.Tensor:
        return self.kinds[self.main].inv_freq

    @property
    def attention_scaling(self) -> float:
        return self.kinds[self.main].attention_scaling

    @property
    def rope_type(self) -> str:
        return self.kinds[self.main].rope_type

    @property
    def rope_theta(self) -> float | None:
        return self.kinds[self.main].rope_theta


def _kind(name: str, inv: torch.Tensor, scaling, rope_type, params) -> RopeKind:
    if str(rope_type) in LENGTH_DEPENDENT:
        raise PosbiasError(
            f"rope_type '{rope_type}' makes the frequencies change with the sequence length",
            "use a model with a static RoPE (default, linear, llama3 or yarn)",
        )
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return RopeKind(name, inv.detach().float(), float(scaling if scaling is not None else 1.0), str(rope_type),
                    float(theta) if theta is not None else None, inv.dtype)


def _kinds(rot: nn.Module, cfg, n_layers: int) -> tuple[list[RopeKind], list[int], int]:
    """The model's RoPE kinds, the kind of each layer, and the main kind: one table (Llama/Qwen2/Mistral:
    `rotary.inv_freq`) or one per layer type (Gemma-3: `rotary.<type>_inv_freq`, `config.layer_types`)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if getattr(rot, "inv_freq", None) is not None:
        kind = _kind("default", rot.inv_freq, getattr(rot, "attention_scaling", 1.0), getattr(rot, "rope_type", "default"), params)
        return [kind], [0] * n_layers, 0
    types = list(getattr(cfg, "layer_types", None) or [])
    names = sorted(set(types))
    if len(types) != n_layers or not names or any(getattr(rot, f"{t}_inv_freq", None) is None for t in names):
        raise PosbiasError(f"model type '{getattr(cfg, 'model_type', '?')}' has a rotary module this method cannot read",
                           f"use {_FAMILIES}")
    rtypes = getattr(rot, "rope_type", {})
    kinds = [_kind(t, getattr(rot, f"{t}_inv_freq"), getattr(rot, f"{t}_attention_scaling", 1.0),
                   rtypes.get(t, "default") if isinstance(rtypes, dict) else rtypes, params.get(t, {})) for t in names]
    main = names.index("full_attention") if "full_attention" in names else 0
    return kinds, [names.index(t) for t in types], main


def rope_info(model) -> RopeInfo:
    """The rotary module, RoPE kinds and the decoder layers' self_attn modules of a RoPE model."""
    cfg = model.config
    mtype = getattr(cfg, "model_type", type(model).__name__)
    base = getattr(model, "base_model", model)
    rot, layers = getattr(base, "rotary_emb", None), getattr(base, "layers", None)
    if rot is None or layers is None:
        raise PosbiasError(
            f"model type '{mtype}' has no rotary position embedding (RoPE) this method can rescale",
            f"use {_FAMILIES}",
        )
    attns = [getattr(layer, "self_attn", None) for layer in layers]
    if any(a is None for a in attns):
        raise PosbiasError(f"model type '{mtype}' has decoder layers without a self_attn module", f"use {_FAMILIES}")
    try:
        kinds, layer_kinds, main = _kinds(rot, cfg, len(attns))
    except PosbiasError as e:
        raise PosbiasError(f"model type '{mtype}': {e.problem}", e.fix) from None
    return RopeInfo(rotary=rot, kinds=kinds, layer_kinds=layer_kinds, attns=attns, model_type=mtype,
                    max_positions=int(getattr(cfg, "max_position_embeddings", 0) or 0), main=main)


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
    Eq. 2 scales positions, not the base, so a model with several RoPE kinds (Gemma-3: sliding layers
    with theta 1e4, global layers with 1e6) applies each layer's factor to that layer's own frequencies.
    Tables (G distinct (kind, factor) pairs, P = max_positions or max_position_embeddings, D) are built
    once on entry and grow if a larger position appears. Works with batched left-padded teacher forcing
    (position_ids = cumsum(mask) - 1) and with model.generate's KV cache (position ids continue past the prompt).
    """
    info = rope_info(model)
    fs = _check_factors(factors, len(info.attns), info.model_type)
    distinct = sorted({(k, f) for k, f in zip(info.layer_kinds, fs) if f != 1.0})
    handles, tables = [], None
    with rope_guard(model):
        try:
            if distinct:
                size = max_positions or info.max_positions or 2048
                inv = torch.stack([info.kinds[k].inv_freq for k, _ in distinct])  # (G, D/2)
                scaling = {info.kinds[k].attention_scaling for k, _ in distinct}
                if len(scaling) > 1:
                    raise PosbiasError(f"model type '{info.model_type}' has RoPE kinds with different attention scalings",
                                       f"use {_FAMILIES}")
                tables = RopeTables(inv, [f for _, f in distinct], scaling.pop(), model_dtype(model), inv.device, size)
                for attn, k, f in zip(info.attns, info.layer_kinds, fs):
                    if f != 1.0:
                        handles.append(attn.register_forward_pre_hook(_layer_hook(tables, distinct.index((k, f))), with_kwargs=True))
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


class Rotary:
    """A RoPE of these frequencies as transformers' rotary modules compute it (fp32 angles, cat(freqs, freqs), cos
    and sin times the scaling, cast to x's dtype; rotate_half): `rotate(x, positions)` at integer positions of x's
    leading shape, negative ones too (a query moved back past a key). cos and sin come from a table built once per
    dtype and range and grown on demand: PINE rotates each query once per token class and each document's keys once
    per layout, and the trigonometry was most of its time."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float = 1.0):
        self.inv, self.scaling = inv_freq.detach().float(), scaling
        self.tables: dict = {}  # (device, dtype) -> (lowest position, cos, sin)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, full: bool = True) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
        """(cos, sin) [*positions.shape, D] in dtype (full=False: D / 2, the halves being equal)."""
        dev = positions.device
        lo, hi = int(positions.min()), int(positions.max())
        have = self.tables.get((dev, dtype))
        if have is None or not (have[0] <= lo and hi < have[0] + have[1].shape[0]):
            lo, hi = min(lo, -64) * 2, max(hi, 64) * 2
            ang = torch.arange(lo, hi + 1, dtype=torch.float32, device=dev)[:, None] * self.inv.to(dev)
            have = self.tables[(dev, dtype)] = (lo, (ang.cos() * self.scaling).to(dtype),
                                                 (ang.sin() * self.scaling).to(dtype))
        idx = positions - have[0]
        cos, sin = have[1][idx], have[2][idx]
        return (torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)) if full else (cos, sin)

    @staticmethod
    def half(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x rotated at positions (broadcast against x's leading shape): x1 c - x2 s, x2 c + x1 s per half, written
        in place of transformers' x * cos + rotate_half(x) * sin (the same products, with one rounding per half in
        low precision: PINE compares its own rotations only, never against the model's); a dimension the
        positions merely broadcast over (stride 0, e.g. every head) is looked up once."""
        positions = positions.to(x.device)
        positions = positions[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None)
                                    for st, n in zip(positions.stride(), positions.shape))]
        c, s = self.cos_sin(positions, x.dtype, full=False)
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        out = x.new_empty(torch.broadcast_shapes(x.shape, (*positions.shape, x.shape[-1])))
        o1, o2 = out[..., :h], out[..., h:]
        torch.mul(x1, c, out=o1)
        o1.addcmul_(x2, s, value=-1)
        torch.mul(x2, c, out=o2)
        o2.addcmul_(x1, s)
        return out


def rotation(inv_freq: torch.Tensor, scaling: float = 1.0) -> Rotary:
    """The layer's RoPE as a `Rotary` (rotate(x, positions), and its cos, sin for PINE's key layouts)."""
    return Rotary(inv_freq, scaling)
