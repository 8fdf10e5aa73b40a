"""Batched greedy generation with the KV cache, stopping at EOS, max tokens, or (single-line answers) a newline."""

from __future__ import annotations

from functools import lru_cache

import torch

from ..core.metrics import first_line
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
                    multiline: bool = False) -> list[str]:
    """Greedy continuations of each row's prompt, cut at the first newline (multiline: the whole text, for a
    chain of thought, stopped by EOS or max_new_tokens only)."""
    from transformers import GenerationConfig, StoppingCriteriaList

    batch = left_pad([r.prompt_ids for r in rows], pad_id)
    dev = next(model.parameters()).device
    cfg = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_ids(model, tokenizer), pad_token_id=pad_id
    )
    stop = StoppingCriteriaList([] if multiline else [_StopAtNewline(_newline_ids(tokenizer), dev)])
    out = model.generate(
        input_ids=batch["input_ids"].to(dev),
        attention_mask=batch["attention_mask"].to(dev),
        generation_config=cfg,
        stopping_criteria=stop,
    )
    new = out[:, batch["input_ids"].shape[1] :]
    texts = tokenizer.batch_decode(new, skip_special_tokens=True)
    return [t.strip() if multiline else first_line(t) for t in texts]
