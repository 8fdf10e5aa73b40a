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


def _answer_logits(model, seqs: list[list[int]], alen: list[int], pad_id: int,
                   prompt_end: Callable[[torch.Tensor], None] | None) -> torch.Tensor:
    """One left-padded forward of `seqs` (prompt + answer); float logits of the last max(alen) + 1 columns,
    [S, a_max+1, V]. prompt_end, if given, is told the column of each sequence's last prompt token first
    (input-dependent methods such as Ms-PoE measure there, as generation would)."""
    batch = left_pad(seqs, pad_id)
    a_max = max(alen)
    if prompt_end is not None:
        prompt_end(batch["input_ids"].shape[1] - 1 - torch.tensor(alen))
    kw = {"logits_to_keep": a_max + 1} if _keeps_logits(model) else {}
    dev = next(model.parameters()).device
    out = model(**{k: v.to(dev) for k, v in batch.items()}, use_cache=False, **kw)
    return out.logits[:, -(a_max + 1) :].float()


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
    a_max = max(alen)
    logits = _answer_logits(model, seqs, alen, pad_id, prompt_end)  # [S, a_max+1, V]; column j predicts token j+1
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


@torch.inference_mode()
def token_details(model, tokenizer, rows: list[Encoded], pad_id: int,
                  prompt_end: Callable[[torch.Tensor], None] | None = None, top: int = 10) -> list[dict]:
    """Token-level view of each row's first answer under teacher forcing (Pos2Distill Fig. 3a / Fig. 8).

    -> per row: tokens (answer length), logprob (sum over the answer), mismatches (answer steps where the
    greedy token is not the answer's token), diverge_at (the first such step, None if none) and, at that
    step, the answer token's rank (1 = greedy) and probability, the greedy token's probability and the
    `top` most probable tokens as [text, probability] pairs."""
    seqs = [row.prompt_ids + row.answer_ids[0] for row in rows]
    alen = [len(row.answer_ids[0]) for row in rows]
    a_max = max(alen)
    logp = torch.log_softmax(_answer_logits(model, seqs, alen, pad_id, prompt_end), dim=-1)  # [S, a_max+1, V]
    results = []
    for s, n in enumerate(alen):
        lp = logp[s, a_max - n : a_max]  # [n, V]: step t predicts answer token t
        gold = torch.tensor(seqs[s][-n:], device=lp.device)
        gold_lp = lp.gather(-1, gold[:, None])[:, 0]  # [n]
        miss = (lp.argmax(-1) != gold).nonzero()[:, 0].tolist()
        res = {"tokens": n, "logprob": float(gold_lp.sum()), "mismatches": len(miss),
               "diverge_at": miss[0] if miss else None}
        if miss:
            t = miss[0]
            probs = lp[t].exp()
            top_p, top_i = probs.topk(top)
            res.update({"anchor_rank": int((probs > probs[gold[t]]).sum()) + 1, "anchor_prob": float(probs[gold[t]]),
                        "greedy_prob": float(top_p[0]), "anchor_token": tokenizer.decode([int(gold[t])]),
                        "top": [[tokenizer.decode([int(i)]), float(p)] for p, i in zip(top_p, top_i)]})
        results.append(res)
    return results
