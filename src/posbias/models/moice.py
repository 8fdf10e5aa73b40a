"""MoICE: a mixture of "in-context experts" (RoPE bases) per attention head (Lin et al. 2024, arXiv 2406.19598).

The method. Every attention layer computes attention once per RoPE base b_1..b_N (each an "expert": q and k
rotated with that base) and mixes the per-head outputs with weights a router predicts from the head's query:

    logits = W2( act(W1 q) * W3 q )          q: the head's query rotated with b_1 (d), W1, W3: d -> N, W2: N -> N
    w = renormalise( top_k( softmax(logits) ) )             fp32, the other N - k experts get weight 0
    o = sum_j w_j * Attention_j(q, k, v)                    then o_proj as usual

Only the routers train (the model is frozen); `core.losses.load_balancing_loss` is the paper's auxiliary
Switch-Transformer balance term over the router logits of all layers.

Where this module differs from the public code (p1nksnow/MoICE, modeling/modeling_llama.py, LlamaAttention with
`gate_1/2/3`): there one router (three bias-free Linear layers) per *layer* is applied to every head's query, i.e.
the heads of a layer share its weights. Here every head has its own router weights, as our issue asks ("a router
per attention head"): `Routers.w1`, `w3` are (L, H, d, N) and `w2` (L, H, N, N), applied with einsum. The public
code's init is kept (nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))), as is `act` = the model's
hidden_act. Grouped-query attention: keys are rotated per KV head with each expert's base, which is consistent
for every query head of the group (all experts rotate q and k with the same base).

How it hooks into transformers (as models/mspoe.py does): a forward pre-hook on each `self_attn` replaces
`position_embeddings` by the identity (cos = 1, sin = 0: q * 1 + rotate_half(q) * 0 == q exactly), so the stock
code hands *un-rotated* q/k to the attention function, and takes `past_key_values` away from it. The model is
switched to a registered attention function ("posbias_moice_<backend>") that appends the un-rotated keys to the
cache itself (so the cache holds un-rotated keys: one cache serves all N bases), keeps the position ids of the
cached keys per layer (the cache returns the most recent keys in order, also Gemma-3's sliding-window layers, so
the last S ids match), rotates q and k with every base (tables built like the model's own rotary module), runs
the original backend once on the N copies stacked along the batch, and mixes. Gemma-3 applies q_norm / k_norm
before its RoPE call; with the identity rotation there, our rotation comes after the norms, as in the model.
On exit the hooks go and the original attention implementation is restored, so the model is bit-identical.

Bases: given for the main RoPE kind; another kind (Gemma-3's sliding layers, theta 1e4 against 1e6) gets them
scaled by theta_kind / theta_main (models/buckets.py `kind_bases`). Default: the public train.sh list
(10000, 17500, ..., 25000 for Llama-2's theta 1e4) scaled to the model's theta (theta * b / 1e4).
"""

from __future__ import annotations

import json
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import PosbiasError
from .attn_hooks import patched_attention, register_attention, take_rope_and_cache
from .buckets import kind_inv_freqs, scaled_bases
from .mspoe_heads import rotate
from .rope import RopeTables, model_dtype, rope_guard, rope_info

PAPER_BASES = (10000.0, 17500.0, 18000.0, 19000.0, 20000.0, 22500.0, 25000.0)  # train.sh base_set (Llama-2, theta 1e4)
_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # self_attn -> _Layer while inside `moice`


def default_bases(model) -> tuple[float, ...]:
    """The public base_set scaled to the model's main rope_theta (theta * b / 1e4)."""
    return scaled_bases(model, PAPER_BASES)


def model_shape(model) -> tuple[int, int, int]:
    """(layers, query heads, head_dim) a router set must match."""
    info = rope_info(model)
    return len(info.attns), int(model.config.num_attention_heads), int(info.attns[0].head_dim)


def _activation(model) -> str:
    cfg = model.config
    return str(getattr(cfg, "hidden_act", None) or getattr(cfg, "hidden_activation", None) or "silu")


class Routers(nn.Module):
    """One SwiGLU router per (layer, head): logits = W2(act(W1 q) * W3 q), no bias, float32 parameters.

    w1, w3: (L, H, d, N); w2: (L, H, N, N). `bases` (N, for the main RoPE kind) and `top_k` travel with them."""

    def __init__(self, layers: int, heads: int, head_dim: int, bases, top_k: int, act: str = "silu", seed: int = 0):
        super().__init__()
        self.bases = tuple(float(b) for b in bases)
        n = len(self.bases)
        if n < 1 or not 1 <= int(top_k) <= n:
            raise PosbiasError(f"moice needs 1 <= top_k <= {n} (the number of bases), got top_k={top_k}",
                               f"pass `top_k` between 1 and {n}")
        self.top_k, self.act_name = int(top_k), act
        g = torch.Generator().manual_seed(seed)

        def uniform(*shape, fan_in):  # nn.Linear's default init, as in the public code
            return nn.Parameter((torch.rand(*shape, generator=g) * 2 - 1) / fan_in**0.5)

        self.w1 = uniform(layers, heads, head_dim, n, fan_in=head_dim)
        self.w3 = uniform(layers, heads, head_dim, n, fan_in=head_dim)
        self.w2 = uniform(layers, heads, n, n, fan_in=n)

    @classmethod
    def for_model(cls, model, bases=None, top_k: int | None = None, seed: int = 0) -> "Routers":
        """Seeded (untrained) routers shaped for `model`; bases default to `default_bases(model)`, top_k to all."""
        bs = tuple(bases) if bases else default_bases(model)
        return cls(*model_shape(model), bs, top_k or len(bs), _activation(model), seed)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.w1.shape[:3])  # type: ignore[return-value]

    def act(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.activations import ACT2FN

        return ACT2FN[self.act_name](x)

    def logits(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q (B, H, T, d) -> router logits (B, T, H, N), float32."""
        q = q.float()
        gate = torch.einsum("bhtd,hdn->bthn", q, self.w1[layer])
        up = torch.einsum("bhtd,hdn->bthn", q, self.w3[layer])
        return torch.einsum("bthn,hnm->bthm", self.act(gate) * up, self.w2[layer])

    def meta(self) -> dict:
        return {"bases": list(self.bases), "top_k": self.top_k, "act": self.act_name, "shape": list(self.shape)}

    def save(self, path: str | Path) -> None:
        """safetensors file with the three tensors and `meta()` as metadata (written to a temp file, then renamed)."""
        from safetensors.torch import save_file

        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tensors = {k: v.detach().contiguous().cpu() for k, v in (("w1", self.w1), ("w2", self.w2), ("w3", self.w3))}
        save_file(tensors, str(tmp), metadata={"posbias_moice": json.dumps(self.meta())})
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> "Routers":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as f:
                meta = json.loads((f.metadata() or {})["posbias_moice"])
                tensors = {k: f.get_tensor(k) for k in ("w1", "w2", "w3")}
            routers = cls(*meta["shape"], meta["bases"], meta["top_k"], meta["act"])
            routers.load_state_dict(tensors)
        except Exception as e:  # a foreign or broken file: one line, whatever the library raised
            raise PosbiasError(f"{path} is not a MoICE routers file ({type(e).__name__}: {str(e)[:120]})",
                               "pass the folder `posbias moice train` wrote") from None
        return routers


def routing_weights(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """(..., N) router logits -> (..., N) weights: softmax in fp32, keep the top-k, renormalise (the others 0)."""
    probs = torch.softmax(logits.float(), dim=-1)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, logits.topk(top_k, dim=-1).indices, True)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def mix_experts(backend, module, query, key, value, mask, rot_q, rot_k, weights, **kwargs) -> torch.Tensor:
    """o = sum_j w_j * Attention_j: one backend call on the N copies stacked along the batch (expert-major).

    query (B, H, T, D), key/value (B, Hk, S, D) un-rotated; rot_q = (cos, sin) (N, B|1, T, D), rot_k (N, B|1, S, D);
    weights (B, T, H, N). -> (B, T, H, D), the layout attention backends return."""
    n, b = rot_q[0].shape[0], query.shape[0]
    qs = rotate(query[None], rot_q[0][:, :, None], rot_q[1][:, :, None]).flatten(0, 1)  # (N*B, H, T, D)
    ks = rotate(key[None], rot_k[0][:, :, None], rot_k[1][:, :, None]).flatten(0, 1)  # (N*B, Hk, S, D)
    vs = value.repeat(n, 1, 1, 1)
    if isinstance(mask, torch.Tensor) and mask.shape[0] == b and b > 1:
        mask = mask.repeat(n, *([1] * (mask.ndim - 1)))
    elif mask is not None and not isinstance(mask, torch.Tensor):
        raise PosbiasError(f"moice cannot use an attention mask of type {type(mask).__name__}",
                           "load the model with the sdpa or eager attention implementation")
    out, _ = backend(module, qs, ks, vs, mask, **kwargs)  # (N*B, T, H, D)
    out = out.view(n, b, *out.shape[1:])
    return torch.einsum("nbthd,bthn->bthd", out, weights.to(out.dtype))  # eq. of Sec. 3: sum_j w_j * o_j


# ----------------------------------------------------------------------------- state and hooks


@dataclass
class MoICEState:
    """Handle yielded by `moice`: the routers, top_k, cos/sin tables, and (when `record` is True) the router
    logits of every layer of the last forwards, (B, T, H, N) each, in call order, for the auxiliary loss."""

    routers: Routers
    top_k: int
    tables: RopeTables
    n: int  # experts (bases) per RoPE kind
    record: bool = False
    logits: list = field(default_factory=list)


@dataclass
class _Layer:
    shared: MoICEState
    index: int
    kind: int
    cache: object | None = None
    prefill: bool = True
    key_pos: torch.Tensor | None = None  # (B, S) position ids of the keys this layer has seen (cache order)


def _key_positions(st: _Layer, pos: torch.Tensor, b: int, s: int) -> torch.Tensor:
    """(B, S) position ids of the S keys the attention sees: the last S of every position fed to this layer."""
    pos = pos.expand(b, -1)
    st.key_pos = pos if st.prefill or st.key_pos is None else torch.cat([st.key_pos, pos], dim=1)
    if st.key_pos.shape[1] < s:
        raise PosbiasError("moice: the KV cache holds keys this context has not seen",
                           "start generation (or the cached forward) inside the moice context")
    return st.key_pos[:, -s:]


def _make_attention(backend):
    """The registered attention function: MoICE on hooked layers, `backend` unchanged elsewhere."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        st = _ACTIVE.get(module)
        if st is None:
            return backend(module, query, key, value, attention_mask, **kwargs)
        hs, pos = st.shared, kwargs["position_ids"]
        cache, st.cache = st.cache, None
        if cache is not None:  # the cache stores un-rotated keys: every expert rotates them its own way
            key, value = cache.update(key, value, module.layer_idx)
        kpos = _key_positions(st, pos, query.shape[0], key.shape[2])
        hs.tables.ensure(torch.cat([pos.flatten(), kpos.flatten()]))
        groups = slice(st.kind * hs.n, (st.kind + 1) * hs.n)
        rot_q = (hs.tables.cos[groups][:, pos], hs.tables.sin[groups][:, pos])  # (N, B|1, T, D)
        rot_k = (hs.tables.cos[groups][:, kpos], hs.tables.sin[groups][:, kpos])  # (N, B, S, D)
        q1 = rotate(query, rot_q[0][0][:, None], rot_q[1][0][:, None])  # router input: q rotated with the first base
        logits = hs.routers.logits(st.index, q1)  # (B, T, H, N)
        if hs.record:
            hs.logits.append(logits)
        weights = routing_weights(logits, hs.top_k)
        return mix_experts(backend, module, query, key, value, attention_mask, rot_q, rot_k, weights, **kwargs), None

    return attention


def _pre_hook(module, args, kwargs):
    """Before a hooked self_attn: identity RoPE (q/k reach the attention function un-rotated), cache kept aside."""
    return args, take_rope_and_cache(_ACTIVE[module], module, kwargs, "moice")


# ----------------------------------------------------------------------------- the context manager


def check_routers(model, routers: Routers) -> None:
    """PosbiasError unless `routers` fit `model` (a RoPE model with these layers, heads and head_dim)."""
    want = model_shape(model)
    if tuple(routers.shape) != want:
        raise PosbiasError(f"the MoICE routers are for (layers, heads, head_dim) = {tuple(routers.shape)}, "
                           f"the model has {want}", "train routers for this model (posbias moice train --model ...)")


def _register(model, attn) -> tuple[str, str]:
    """Register the moice attention + mask functions for the model's backend -> (old, new) names."""
    return register_attention(model, attn, f"moice_{model.config.model_type}", _make_attention, "moice")


def _tables(model, info, bases, size: int | None) -> RopeTables:
    """cos/sin of every (RoPE kind, base): groups kind * N .. kind * N + N - 1."""
    invs = kind_inv_freqs(model, info, bases)  # (K*N, D/2)
    if len({k.attention_scaling for k in info.kinds}) > 1:
        raise PosbiasError(f"model type '{info.model_type}' has RoPE kinds with different attention scalings",
                           "use a RoPE model of the families in the method docs (Llama, Qwen2/3, Mistral, Phi-3, Gemma-2/3, ...)")
    return RopeTables(invs, [1.0] * len(invs), info.attention_scaling, model_dtype(model), invs.device,
                      size or info.max_positions or 2048)


@contextmanager
def moice(model, routers: Routers, top_k: int | None = None, max_positions: int | None = None):
    """Apply MoICE with `routers` inside the block; restore the model exactly on exit. Yields a `MoICEState` handle.

    top_k: experts kept per token and head (default: the routers' own). Works for batched left-padded forwards
    (position_ids = cumsum(mask) - 1), model.generate with the KV cache, and training (gradients reach the
    routers; nothing here disables autograd). Set `handle.record = True` to collect router logits."""
    info = rope_info(model)
    check_routers(model, routers)
    k = routers.top_k if top_k is None else int(top_k)
    if not 1 <= k <= len(routers.bases):
        raise PosbiasError(f"moice: top_k must be between 1 and {len(routers.bases)}, got {k}")
    handle = MoICEState(routers, k, _tables(model, info, routers.bases, max_positions), len(routers.bases))
    with rope_guard(model):
        old, name = _register(model, info.attns[0])
        states = {attn: _Layer(handle, i, kind) for i, (attn, kind) in enumerate(zip(info.attns, info.layer_kinds))}
        try:
            with patched_attention(model, old, name, states, _ACTIVE, _pre_hook):
                yield handle
        finally:
            handle.tables.release()
            handle.logits.clear()
