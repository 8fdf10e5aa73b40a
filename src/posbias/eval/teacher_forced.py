"""Teacher-forced scoring: one batched forward pass per batch of rows.

A row is correct iff greedy decoding would emit one of its gold answers token by
token: with the answer appended after the prompt, the argmax at every answer
position equals the next gold token.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

from .encode import Encoded, left_pad


def _keeps_logits(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


@torch.inference_mode()
def score_teacher_forced(model, tokenizer, rows: list[Encoded], pad_id: int,
                         prompt_end: Callable[[torch.Tensor], None] | None = None) -> list[dict]:
    """-> one dict per row: correct, prediction (greedy tokens under teacher forcing), logprob.

    prompt_end, if given, is told the column of each sequence's last prompt token before the
    forward (input-dependent methods such as Ms-PoE measure there, as generation would)."""
    seqs, owner, alen = [], [], []
    for r, row in enumerate(rows):
        for ans in row.answer_ids:
            seqs.append(row.prompt_ids + ans)
            owner.append(r)
            alen.append(len(ans))
    batch = left_pad(seqs, pad_id)
    a_max = max(alen)
    dev = next(model.parameters()).device
    if prompt_end is not None:
        prompt_end(batch["input_ids"].shape[1] - 1 - torch.tensor(alen))
    kw = {"logits_to_keep": a_max + 1} if _keeps_logits(model) else {}
    out = model(**{k: v.to(dev) for k, v in batch.items()}, use_cache=False, **kw)
    logits = out.logits[:, -(a_max + 1) :].float()  # [S, a_max+1, V]; column j predicts token j+1
    logp = torch.log_softmax(logits, dim=-1)
    greedy = logits.argmax(-1)  # [S, a_max+1]

    results: list[dict | None] = [None] * len(rows)
    for s, (r, n) in enumerate(zip(owner, alen)):
        gold = torch.tensor(seqs[s][-n:], device=greedy.device)
        cols = slice(a_max - n, a_max)  # the n columns that predict the answer tokens
        pred = greedy[s, cols]
        ok = bool((pred == gold).all())
        lp = float(logp[s, cols].gather(-1, gold[:, None]).sum())
        prev = results[r]
        if prev is None or (ok and not prev["correct"]):
            results[r] = {
                "correct": ok,
                "prediction": tokenizer.decode(pred.tolist(), skip_special_tokens=True),
                "logprob": lp if prev is None else prev["logprob"],  # of the first (canonical) answer
            }
    return results  # type: ignore[return-value]
