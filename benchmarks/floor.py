"""The raw-forward floor (issue 49): the cost of one plain forward over the unique tokens a set of rows needs, the
least any engine on this build of torch can spend on them.

A row needs its prompt and, under teacher forcing, each accepted answer but its last token (the answer's logits come
from the tokens before it); under generation, its prompt and the tokens it generated but the last. Rows that share a
prefix need it once: the unique tokens are the nodes of the prefix tree of all these sequences (what perfect prefix
sharing computes, and no more). The floor lays those tokens out, in tree order, as sequences of the rows' mean
prompt length and runs the model over them once, batch 1, no cache, the logits of the last position only: every
token through every layer exactly once, at batch and attention shapes close to the rows' own. It leaves out what a
real engine must add (tokenising, padding, the attention of branch tokens to a long shared prefix, sampling, the
per-step overhead of decoding), so a path's ratio to it says how far that path is from pure arithmetic.
"""

from __future__ import annotations

import torch


def tree_token_ids(seqs: list[list[int]]) -> list[int]:
    """The unique tokens of the prefix tree of `seqs`, in the order they are first met (their count is
    posbias.scoring.prefix.tree_tokens; the floor needs the ids themselves, to run them)."""
    root: dict = {}
    out: list[int] = []
    for s in seqs:
        node = root
        for t in s:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                out.append(t)
            node = nxt
    return out


def needed(rows, protocol: str, generated: list[str] | None = None, tokenizer=None) -> list[list[int]]:
    """The sequences a protocol must read for `rows` (posbias Encoded rows): teacher forcing, the prompt and each
    accepted answer less its last token; generation, the prompt and the generated text's tokens (`generated`: each
    row's prediction, in row order; re-tokenised, so a count, not the exact ids the engine fed)."""
    if protocol == "teacher-forced":
        return [list(r.prompt_ids) + list(a[:-1]) for r in rows for a in r.answer_ids]
    return [list(r.prompt_ids) + tokenizer.encode(g, add_special_tokens=False) for r, g in zip(rows, generated)]


@torch.inference_mode()
def raw_forward(model, tokens: list[int], length: int, batch: int = 1) -> int:
    """Run `model` over `tokens` in sequences of `length`, `batch` sequences a forward (the last one shorter; no cache,
    no padding, last logits only); -> forwards run. Batch 1 on the CPU, where a bigger batch saves nothing; on a GPU
    a batch of 1 leaves the device idle, so its floor stacks sequences."""
    dev = next(model.parameters()).device
    full = len(tokens) // length * length
    seqs = [tokens[lo:lo + length] for lo in range(0, full, length)]
    n = 0
    for lo in range(0, len(seqs), batch):
        model(input_ids=torch.tensor(seqs[lo:lo + batch], device=dev), use_cache=False, logits_to_keep=1)
        n += 1
    if full < len(tokens):
        model(input_ids=torch.tensor([tokens[full:]], device=dev), use_cache=False, logits_to_keep=1)
        n += 1
    return n


def unique_tokens(rows, protocol: str, generated: list[str] | None = None, tokenizer=None) -> tuple[list[int], int, int]:
    """What the floor of `rows` under `protocol` runs: (the prefix tree's unique token ids, the tokens the rows read
    in all, the floor's sequence length: the rows' mean prompt length)."""
    seqs = needed(rows, protocol, generated, tokenizer)
    return tree_token_ids(seqs), sum(map(len, seqs)), round(sum(len(r.prompt_ids) for r in rows) / len(rows))
