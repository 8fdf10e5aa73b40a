"""The attention each item of a prompt receives: Found-in-the-Middle's document attention (Hsieh et al. 2024, the
unnumbered definition of its Sec. 2.1),
Attn(x, k) = the mean over document k's tokens of the attention the last prompt token pays them (the query that
predicts the answer's first token), averaged over every layer and head. One capture forward per batch of prompts
(models/attention.py reduces the attention inside the forward; nothing of size L x H x T x T is kept).

Attention sorting ranks items by it; attention calibration subtracts the same measurement on a content-free item
(the positional prior) to read each item's relevance."""

from __future__ import annotations

import torch

from ..models.attention import span_attention
from ..models.load import Loaded
from ..tasks import Prompt
from .encode import BATCH_TOKENS, MAX_BATCH, left_pad, plan_batches
from .spans import item_spans


@torch.inference_mode()
def item_attention(loaded: Loaded, prompts: list[Prompt], chat: bool, batch_tokens: int = BATCH_TOKENS,
                   max_batch: int = MAX_BATCH, by_layer: bool = False) -> list[list[float]] | torch.Tensor:
    """Per prompt, each item's mean per-token attention from the last prompt token, averaged over layers and heads
    -> [[n_items floats] per prompt]. by_layer: a [P, L, n_items] tensor instead (averaged over heads only)."""
    tok, model = loaded.tokenizer, loaded.model
    spans = [item_spans(tok, p, list(p.items), chat) for p in prompts]
    n = max(s.n_items for s in spans)
    out: list[torch.Tensor | None] = [None] * len(prompts)
    dev = next(model.parameters()).device
    with span_attention(model) as cap:
        for idx in plan_batches([len(s.ids) for s in spans], batch_tokens, max_batch):
            batch = left_pad([spans[i].ids for i in idx], tok.pad_token_id)
            width = batch["input_ids"].shape[1]
            span_of = torch.full((len(idx), width), n, dtype=torch.long)  # n: not an item (not counted)
            counts = torch.zeros(len(idx), n)
            for b, i in enumerate(idx):
                ids = torch.tensor(spans[i].span_of)
                ids[ids >= spans[i].n_items] = n
                span_of[b, width - len(ids):] = ids
                counts[b] = torch.bincount(ids, minlength=n + 1)[:n].float()
            cap.set_batch(span_of, n, torch.full((len(idx), 1), width - 1), torch.ones(len(idx), 1))
            model(**{k: v.to(dev) for k, v in batch.items()}, use_cache=False, logits_to_keep=1)
            mass = torch.stack([cap.masses[layer] for layer in sorted(cap.masses)], 1).mean(2)  # [B, L, n]
            per_token = mass / counts.clamp(min=1)[:, None, :]
            for b, i in enumerate(idx):
                out[i] = per_token[b]
    table = torch.stack(out)  # type: ignore[arg-type]  # [P, L, n]
    return table if by_layer else table.mean(1).tolist()
