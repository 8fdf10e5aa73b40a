"""Attention Buckets (Chen et al. 2023b, "Fortify the Shortest Stave in Attention"): several RoPE bases in parallel.

Each input row is processed once per RoPE base ("bucket"); every copy has its own attention waveform, and the
copies' next-token logits are combined by confidence. The original code (AlibabaResearch/DAMO-ConvAI,
attention-buckets/modeling_llama.py, `LlamaForCausalLM.forward` with `base_mean`) does, per decoding step,
with l_j the last-position logits of the copy with base b_j:

    w = softmax_j( max_v l_j[v] )          # confidence of each copy = its largest raw logit
    logits = sum_j w_j * l_j               # weighted sum of the raw logits (not of probabilities)

and uses base lists [10000, 17500, 18000, 19000, 20000, 25000] (ToolBench, inference/config.py) and
[10000, 13000, 16000, 19000, 22000, 25000, 28000] (RAG, base_rag/test_nq_kl.py) for Llama-2 (rope_theta 1e4).
We apply the same rule at every position (teacher forcing gives each position the logits the incremental
decoder would see), run all copies in ONE batched forward (the original loops over chunks of `bsz` bases, with
batch size 1), and scale a named list (ToolBench by default; methods/buckets.py picks RAG on document tasks) to the
model's own rope_theta (theta * b / 1e4).

Within `attention_buckets(model)`, callers see a normal batch of B rows: inputs are repeated to n*B rows
(copy-major: row r uses base r // B), the KV cache holds n*B rows, and logits come back as (B, T, V) float32.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from ..errors import PosbiasError
from .compat import CACHE_KEYS
from .rope import RopeInfo, RopeTables, model_dtype, position_ids_of, replace_position_embeddings, rope_guard, rope_info

TOOLBENCH_BASES = (10000.0, 17500.0, 18000.0, 19000.0, 20000.0, 25000.0)  # original default (Llama-2, theta 1e4)
RAG_BASES = (10000.0, 13000.0, 16000.0, 19000.0, 22000.0, 25000.0, 28000.0)
REFERENCE_THETA = 10000.0
_BATCH_KEYS = ("input_ids", "inputs_embeds")


def scaled_bases(model, reference: Sequence[float]) -> tuple[float, ...]:
    """Bases published for Llama-2 (theta 1e4) scaled to this model's main rope_theta (theta * b / 1e4)."""
    theta = rope_info(model).rope_theta or REFERENCE_THETA
    return tuple(theta * b / REFERENCE_THETA for b in reference)


def default_bases(model, rag: bool = False) -> tuple[float, ...]:
    """The original ToolBench (or, rag=True, RAG) bases relative to Llama-2's theta, scaled to this model's
    main rope_theta (Gemma-3: the global layers' 1e6; its sliding layers get the same list scaled to theirs)."""
    return scaled_bases(model, RAG_BASES if rag else TOOLBENCH_BASES)


def kind_inv_freqs(model, info: RopeInfo, bases: Sequence[float]) -> torch.Tensor:
    """(K * n, D/2) inverse frequencies of every (RoPE kind, base): row k * n + j is kind k with base j."""
    per_kind = kind_bases(info, bases)
    return torch.stack([base_inv_freq(model, info, b, k) for k, kb in enumerate(per_kind) for b in kb])


def kind_bases(info: RopeInfo, bases: Sequence[float]) -> list[tuple[float, ...]]:
    """Per RoPE kind, the bases its layers use: `bases` refer to the main kind; another kind (Gemma-3's sliding
    layers, theta 1e4 against the global 1e6) gets them scaled by theta_kind / theta_main, so every layer keeps
    its own base's ratio to the original (Attention Buckets perturbs the base multiplicatively)."""
    main = info.rope_theta
    out = []
    for kind in info.kinds:
        ratio = (kind.rope_theta / main) if (main and kind.rope_theta) else 1.0
        out.append(tuple(b * ratio for b in bases))
    return out


def base_inv_freq(model, info: RopeInfo, base: float, kind: int | None = None) -> torch.Tensor:
    """(D/2,) float32 inverse frequencies the model would use with rope_theta = base for the RoPE kind `kind`
    (default: the main one), same RoPE type otherwise."""
    k = info.kinds[info.main if kind is None else kind]
    if k.rope_theta is not None and float(base) == k.rope_theta:
        return k.inv_freq
    params = getattr(model.config, "rope_parameters", None)
    multi = len(info.kinds) > 1
    own = params.get(k.name) if multi and isinstance(params, dict) else params
    if not isinstance(own, dict) or "rope_theta" not in own:
        raise PosbiasError(f"model type '{info.model_type}' has no rope_theta in config.rope_parameters",
                           "use a RoPE model of the families in the method docs (Llama, Qwen2/3, Mistral, Phi-3, Gemma-2/3, ...)")
    cfg = copy.deepcopy(model.config)
    cfg.rope_parameters = {**params, k.name: {**own, "rope_theta": float(base)}} if multi else {**own, "rope_theta": float(base)}
    extra = {"layer_type": k.name} if multi else {}
    if k.rope_type == "default":
        inv, _ = type(info.rotary).compute_default_rope_parameters(cfg, **extra)
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv, _ = ROPE_INIT_FUNCTIONS[k.rope_type](cfg, **extra)
    # mimic the model's buffer precision (a bf16-cast inv_freq buffer is rounded), then compute in fp32
    return inv.to(k.buffer_dtype).float().to(k.inv_freq.device)


def combine_bucket_logits(logits: torch.Tensor, n: int) -> torch.Tensor:
    """(n*B, T, V) copy-major logits -> (B, T, V) float32: sum_j softmax_j(max_v l_j) * l_j at every position."""
    if logits.shape[0] % n:
        raise PosbiasError(f"{logits.shape[0]} logit rows cannot be split into {n} bucket copies")
    stacked = logits.float().reshape(n, logits.shape[0] // n, *logits.shape[1:])  # (n, B, T, V)
    weight = torch.softmax(stacked.amax(dim=-1), dim=0)  # (n, B, T): confidence of each copy
    return (weight.unsqueeze(-1) * stacked).sum(dim=0)


def _repeat(x, batch: int, n: int):
    """Repeat a batch-shaped tensor (ndim >= 2, first dim == batch) n times along rows (copy-major)."""
    if isinstance(x, torch.Tensor) and x.ndim >= 2 and x.shape[0] == batch:
        return x.repeat(n, *([1] * (x.ndim - 1)))
    if isinstance(x, dict):
        return {k: _repeat(v, batch, n) for k, v in x.items()}
    return x


def _expand_hook(n: int):
    def hook(module, args, kwargs):
        if kwargs.get("labels") is not None:
            raise PosbiasError("attention_buckets does not compute a loss from labels", "compute it from the combined logits")
        ref = next((kwargs[k] for k in _BATCH_KEYS if kwargs.get(k) is not None), args[0] if args else None)
        if not isinstance(ref, torch.Tensor):
            raise PosbiasError("attention_buckets needs input_ids or inputs_embeds", "pass them to the model")
        batch = ref.shape[0]
        args = tuple(_repeat(a, batch, n) for a in args)
        kwargs = {k: (v if k in CACHE_KEYS else _repeat(v, batch, n)) for k, v in kwargs.items()}
        return args, kwargs

    return hook


def _combine_hook(n: int):
    def hook(module, args, kwargs, output):
        if isinstance(output, tuple):
            return (combine_bucket_logits(output[0], n),) + output[1:]
        output.logits = combine_bucket_logits(output.logits, n)
        return output

    return hook


def _rope_hook(tables: RopeTables, n: int, offset: int, rows: dict):
    """Copy j of the batch (rows j*B..) gets table offset + j (offset: the layer's RoPE kind x n)."""

    def hook(module, args, kwargs):
        pos = position_ids_of(kwargs)
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        r = hidden.shape[0]
        if r % n:
            raise PosbiasError(f"{r} rows reached self_attn under attention_buckets with {n} bases",
                               "call the model itself (its forward hooks expand the batch), not its inner modules")
        key = (r, pos.device, offset)
        if key not in rows:
            rows[key] = offset + (torch.arange(r, device=pos.device) // (r // n))[:, None]  # (R, 1): table of each row
        cos, sin = tables.lookup(pos.expand(r, -1) if pos.shape[0] != r else pos, rows[key])
        return args, replace_position_embeddings(kwargs, cos, sin)

    return hook


def _check_bases(bases: Sequence[float]) -> tuple[float, ...]:
    bs = tuple(float(b) for b in bases)
    if not bs or any(not (math.isfinite(b) and b > 1.0) for b in bs):
        raise PosbiasError(f"attention bucket bases must be a non-empty list of numbers > 1, got {list(bs)[:8]}",
                           "pass RoPE bases such as (10000, 17500, 18000, 19000, 20000, 25000)")
    return bs


@contextmanager
def attention_buckets(model, bases: Sequence[float] | None = None, max_positions: int | None = None) -> Iterator[object]:
    """Attention Buckets on a Llama/Qwen2/Mistral model, reversible; the model then behaves as a normal B-row LM.

    bases: RoPE bases, one parallel copy each (default: `default_bases(model)`). Every forward repeats the
    batch n times (n*B rows, also in the KV cache, so memory and compute grow n-fold), gives copy j cos/sin of
    base j, and returns combined logits (B, T, V) float32. Hidden states / attentions in the output keep n*B
    rows. Greedy or sampled `generate` works; beam search does not (it reorders cache rows by beam).
    """
    info = rope_info(model)
    bs = _check_bases(bases if bases is not None else default_bases(model))
    invs = kind_inv_freqs(model, info, bs)  # (K*n, D/2)
    handles, tables, rows = [], None, {}
    with rope_guard(model):
        try:
            own = torch.stack([kind.inv_freq for kind in info.kinds for _ in bs])
            if not torch.equal(invs, own):  # else: no copy needs other cos/sin
                size = max_positions or info.max_positions or 2048
                tables = RopeTables(invs, [1.0] * len(invs), info.attention_scaling, model_dtype(model), invs.device, size)
                handles += [a.register_forward_pre_hook(_rope_hook(tables, len(bs), k * len(bs), rows), with_kwargs=True)
                            for a, k in zip(info.attns, info.layer_kinds)]
            handles.append(model.register_forward_pre_hook(_expand_hook(len(bs)), with_kwargs=True))
            handles.append(model.register_forward_hook(_combine_hook(len(bs)), with_kwargs=True))
            yield model
        finally:
            for h in handles:
                h.remove()
            if tables is not None:
                tables.release()
