"""Batched greedy generation with the KV cache, stopping at EOS, max tokens, or (single-line answers) a newline.

Greedy is the one rule on every path: the plain path's `model.generate` runs under a neutral generation config
(models/decoding.py), so a checkpoint's repetition_penalty, no_repeat_ngram_size, sampling settings, ... change
nothing, and it decodes exactly as the prefix-shared path's argmax loop and teacher forcing assume."""

from __future__ import annotations

from functools import lru_cache

import torch

from ..core.metrics import first_line
from ..models.decoding import neutral_generation_config
from .encode import Encoded, left_pad


@lru_cache(maxsize=4)
def _newline_ids(tokenizer) -> frozenset[int]:
    """Token ids whose text contains a newline (one decode over the vocabulary, cached)."""
    n = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(n)])
    return frozenset(i for i, t in enumerate(texts) if "\n" in t)


class _StopAtNewline:
    """Per-row stopping criterion: the last generated token contains a newline."""

    def __init__(self, ids: frozenset[int], device):
        self.ids = torch.tensor(sorted(ids), device=device)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        return torch.isin(input_ids[:, -1], self.ids)


def eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


@torch.inference_mode()
def generate_greedy(model, tokenizer, rows: list[Encoded], pad_id: int, max_new_tokens: int,
                    multiline: bool = False, shared: tuple | None = None) -> list[str]:
    """Greedy continuations of each row's prompt, cut at the first newline (multiline: the whole text, for a
    chain of thought, stopped by EOS or max_new_tokens only). shared = (spine_kv, owner, plen, split): the rows
    continue cached spines (decode_shared)."""
    return [text for text, _ in generate_limited(model, tokenizer, rows, pad_id, max_new_tokens, multiline, shared)]


def generate_limited(model, tokenizer, rows: list[Encoded], pad_id: int, max_new_tokens: int,
                     multiline: bool = False, shared: tuple | None = None) -> list[tuple[str, bool]]:
    """generate_greedy's texts, each with whether it was cut at max_new_tokens (no stop token: EOS, or a newline
    unless multiline, among its new tokens), so a run can say how many answers the limit cut short."""
    if shared is not None:
        return decode_shared(model, tokenizer, [(rows, shared)], max_new_tokens, multiline)
    from transformers import GenerationConfig, StoppingCriteriaList

    batch = left_pad([r.prompt_ids for r in rows], pad_id)
    dev = next(model.parameters()).device
    cfg = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_ids(model, tokenizer), pad_token_id=pad_id
    )
    stop = StoppingCriteriaList([] if multiline else [_StopAtNewline(_newline_ids(tokenizer), dev)])
    with neutral_generation_config(model):  # nothing left unset in cfg is filled from the model's own config
        out = model.generate(
            input_ids=batch["input_ids"].to(dev),
            attention_mask=batch["attention_mask"].to(dev),
            generation_config=cfg,
            stopping_criteria=stop,
        )
    new = out[:, batch["input_ids"].shape[1] :]
    texts = tokenizer.batch_decode(new, skip_special_tokens=True)
    stops = torch.tensor(sorted(set(eos_ids(model, tokenizer)) | (set() if multiline else set(_newline_ids(tokenizer)))),
                         device=new.device)
    cut = (new.shape[1] == max_new_tokens) & ~torch.isin(new, stops).any(dim=1)  # [R]: ran to the limit unstopped
    return [(t.strip() if multiline else first_line(t), bool(c)) for t, c in zip(texts, cut.tolist())]


@torch.inference_mode()
def decode_shared(model, tokenizer, parts: list[tuple[list[Encoded], tuple]], max_new_tokens: int,
                  multiline: bool = False) -> list[tuple[str, bool]]:
    """As generate_limited, for rows continuing cached spines (scoring/prefix.py), parts = [(rows, (spine_kv, owner,
    plen, split)), ...]: each part's branch prefill on its own (its padding, its spines), then one greedy loop over all their
    rows (SharedKV.joined when there are several parts) with generate_greedy's stop rules (EOS, max_new_tokens, a
    newline unless multiline; a stopped row's token is kept, and dropped by skip_special_tokens if special, as there).
    Every decode step reads all the weights (SmolLM2's output layer alone is 57 MB in bf16) however few rows it
    carries, so joined parts share each step. The results in the order of the parts' rows."""
    from ..models.prefix import SharedKV
    from .teacher_forced import left_pad_at

    kvs, logits, nxt_pos = [], [], []
    for rows, (spine_kv, owner, plen, split) in parts:
        ids, qpos, valid = left_pad_at([r.prompt_ids[p:] for r, p in zip(rows, plen)], plen)
        room = ids.shape[1] + (max_new_tokens if len(parts) == 1 else 0)  # joined: the decode's room is the join's
        kv = SharedKV(model, spine_kv, torch.tensor(owner), torch.tensor(plen), room, split=split)
        logits.append(kv.extend(ids, qpos, valid, keep=1)[:, -1])  # [R, V]
        nxt_pos.append(qpos[:, -1:].to(logits[-1].device) + 1)  # [R, 1]
        kvs.append(kv)
    shared = kvs[0] if len(kvs) == 1 else SharedKV.joined(kvs, max_new_tokens)
    del kvs, kv  # the parts' own caches, once joined
    logits, nxt_pos = torch.cat(logits), torch.cat(nxt_pos)
    stops = set(eos_ids(model, tokenizer)) | (set() if multiline else set(_newline_ids(tokenizer)))
    stop_ids = torch.tensor(sorted(stops), device=logits.device)
    out: list[list[int]] = [[] for _ in range(len(logits))]
    done = torch.zeros(len(logits), dtype=torch.bool, device=logits.device)
    for step in range(max_new_tokens):
        tok = logits.float().argmax(-1)  # [R]
        for i in torch.nonzero(~done)[:, 0].tolist():
            out[i].append(int(tok[i]))
        done |= torch.isin(tok, stop_ids)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        logits = shared.forward(tok[:, None], nxt_pos, torch.ones_like(nxt_pos, dtype=torch.bool), keep=1)[:, -1]
        nxt_pos = nxt_pos + 1
    texts = tokenizer.batch_decode(out, skip_special_tokens=True)
    return [(t.strip() if multiline else first_line(t), not bool(d)) for t, d in zip(texts, done.tolist())]
