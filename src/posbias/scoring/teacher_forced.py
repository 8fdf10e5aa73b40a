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
                         prompt_end: Callable[[torch.Tensor], None] | None = None, shared: tuple | None = None) -> list[dict]:
    """-> one dict per row: correct, prediction (greedy tokens under teacher forcing), logprob.

    prompt_end, if given, is told the column of each sequence's last prompt token before the
    forward (input-dependent methods such as Ms-PoE measure there, as generation would).
    shared = (spine_kv, owner, plen, split): the rows continue cached spines (score_teacher_forced_shared)."""
    if shared is not None:
        return score_teacher_forced_shared(model, tokenizer, rows, *shared)
    owner, answers = _sequences(rows)
    seqs = [rows[r].prompt_ids + a for r, a in zip(owner, answers)]
    logits = _answer_logits(model, seqs, [len(a) for a in answers], pad_id, prompt_end)  # [S, a_max+1, V]
    return verdicts(tokenizer, rows, owner, answers, logits)


@torch.inference_mode()
def score_teacher_forced_shared(model, tokenizer, rows: list[Encoded], spine_kv, owner: list[int],
                                plen: list[int], split: bool = False) -> list[dict]:
    """As score_teacher_forced, each row continuing its spine's cache (scoring/prefix.py): row i reuses the first
    plen[i] prompt tokens from spine owner[i] of `spine_kv` (models.prefix.prefill) and runs the rest (split: with
    split attention, models.prefix.SharedKV)."""
    from ..models.prefix import SharedKV

    seq_row, answers = _sequences(rows)
    branches = [rows[r].prompt_ids[plen[r]:] + a for r, a in zip(seq_row, answers)]
    starts = [plen[r] for r in seq_row]
    ids, qpos, valid = left_pad_at(branches, starts)
    shared = SharedKV(model, spine_kv, torch.tensor([owner[r] for r in seq_row]), torch.tensor(starts), ids.shape[1],
                      split=split)
    a_max = max(map(len, answers))
    logits = shared.extend(ids, qpos, valid, keep=a_max + 1).float()  # [S, a_max+1, V]
    return verdicts(tokenizer, rows, seq_row, answers, logits)


def _sequences(rows: list[Encoded]) -> tuple[list[int], list[list[int]]]:
    """One scored sequence per (row, accepted answer): the row of each, and its answer ids."""
    owner, answers = [], []
    for r, row in enumerate(rows):
        for ans in row.answer_ids:
            owner.append(r)
            answers.append(ans)
    return owner, answers


def left_pad_at(seqs: list[list[int]], starts: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids, positions (starts[i] + arange; 0 on padding) and the real-token mask, each [S, width]."""
    width = max(map(len, seqs))
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    pos = torch.zeros((len(seqs), width), dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (s, p) in enumerate(zip(seqs, starts)):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        pos[i, width - len(s):] = torch.arange(p, p + len(s))
        valid[i, width - len(s):] = True
    return ids, pos, valid


def verdicts(tokenizer, rows: list[Encoded], owner: list[int], answers: list[list[int]], logits: torch.Tensor) -> list[dict]:
    """Per row from the answer logits [S, a_max+1, V] (column j predicts answer token j of the longest answer,
    right-aligned): correct if any answer is greedy, its prediction, and the first answer's logprob.
    Order-task rows (option_ids) are scored by their option labels instead (option_verdict)."""
    a_max = logits.shape[1] - 1
    logp = torch.log_softmax(logits, dim=-1)
    if rows and rows[0].option_ids:  # one sequence per row: prompt + the gold label, one token
        return [option_verdict(r, logp[s, a_max - 1, r.option_ids].tolist()) for s, r in enumerate(rows)]
    n_rows = len(rows)
    greedy = logits.argmax(-1)  # [S, a_max+1]
    results: list[dict | None] = [None] * n_rows
    for s, (r, ans) in enumerate(zip(owner, answers)):
        n = len(ans)
        gold = torch.tensor(ans, device=greedy.device)
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


def option_verdict(row: Encoded, option_logprobs: list[float]) -> dict:
    """An order-task row from each option label's logprob as the next token: the choice is the best label's slot
    (of equal ones the first, as argmax takes; with labels that go with their candidates the first label of the set,
    Prompt.tie_rank), correct iff it is the gold slot."""
    choice = max(range(len(option_logprobs)), key=lambda s: (option_logprobs[s], -row.prompt.tie_rank(s)))
    return {"correct": choice == row.prompt.position, "prediction": row.prompt.options[choice], "choice": choice,
            "option_logprobs": [round(x, 6) for x in option_logprobs]}


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
