"""Prefix-shared scoring: a sweep asks each example with the gold at every slot, and the prompt for
slot k shares everything before slot k with the prompts for the later slots. Each example's shared prefix (its
*spine*) is computed once; every row then runs only its own suffix (its *branch*) over the cached keys/values.

    spine S     the example's prompt that shares the most tokens with the others (max sum_r LCP(r, S); for a
                single-gold sweep the gold-at-last-slot prompt), cut to the longest prefix any row uses
    row r       S[:p_r] + branch_r, p_r = LCP(prompt_r, S) capped so the branch keeps >= 1 prompt token
                (the column that predicts the first answer token); positions p_r + arange, as the plain path

Batches (`plan_shared`): examples are grouped so their padded spines fit `group_tokens` and `max_batch`. A group's
rows are written, and the progress bar moves, once its spines are prefilled and its first branch batch is done:
where a forward is slow (fp32, or bf16 on a CPU without native bf16) a group holds GROUP_TOKENS (the default sweep's
first rows in ~8 s instead of ~30 s on an AVX2-class CPU, for 8% more CPU time, the verdicts identical in fp32);
elsewhere `batch_tokens` (bf16 on native hardware: 16% more CPU time at GROUP_TOKENS, and 2-3% of the verdicts,
near ties, would move with the batches: docs/sweep.md, "Progress");
each group's rows are split into branch batches where every row is counted with its spine columns too, so a
branch batch holds at most `batch_tokens` tokens of KV per layer (the spine group's KV is a second such
bound). The plan depends only on the rows, so a resumed run recomputes the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .encode import Encoded


def lcp(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def tree_tokens(seqs: list[list[int]]) -> int:
    """Tokens in the prefix tree (trie) of `seqs`: what a perfectly shared computation runs. Sorted
    lexicographically, each sequence adds its length minus its LCP with the one before it."""
    out, prev = 0, None
    for s in sorted(map(list, seqs)):
        out += len(s) - (lcp(s, prev) if prev is not None else 0)
        prev = s
    return out


def lcp_matrix(seqs: list[list[int]]) -> np.ndarray:
    """[n, n] longest common prefix of every pair, vectorised (an example has tens to a few hundred prompts):
    the count of leading positions where both agree, padding (-1, -2) never agreeing."""
    width = max(map(len, seqs), default=0)
    a = np.full((len(seqs), width), -1, dtype=np.int64)
    b = np.full((len(seqs), width), -2, dtype=np.int64)
    for i, s in enumerate(seqs):
        a[i, : len(s)] = s
        b[i, : len(s)] = s
    out = np.empty((len(seqs), len(seqs)), dtype=np.int64)
    for i in range(len(seqs)):  # one row at a time: memory n x width, not n^2 x width
        out[i] = np.cumprod(a[i][None] == b, axis=1).sum(axis=1)
    return out


def spine(seqs: list[list[int]]) -> tuple[int, np.ndarray]:
    """(index of the sequence with the largest total LCP with all the others (ties: the first), every sequence's
    LCP with it)."""
    m = lcp_matrix(seqs)
    k = int(np.argmax(m.sum(axis=1)))
    return k, m[k]


@dataclass
class Share:
    """One example's spine and, for each of its rows, how many spine tokens the row reuses."""

    spine: list[int]  # S[:max p_r]
    rows: list[int]  # indices into the scored row list
    plen: list[int]  # p_r per row, same order


@dataclass
class Group:
    """Examples prefilled together, and their rows split into branch batches."""

    shares: list[Share]
    batches: list[list[int]] = field(default_factory=list)  # row indices

    @property
    def rows(self) -> list[int]:
        return [i for s in self.shares for i in s.rows]


def shares_of(rows: list[Encoded]) -> list[Share]:
    """Rows grouped by example (in order of first appearance), each example's spine and prefix lengths."""
    by_ex: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_ex.setdefault(r.key[0], []).append(i)
    out = []
    for idx in by_ex.values():
        prompts = [rows[i].prompt_ids for i in idx]
        k, shared = spine(prompts)
        plen = [min(int(n), len(p) - 1) for n, p in zip(shared, prompts)]
        out.append(Share(prompts[k][: max(plen)], idx, plen))
    return out


def _take(items: list, cost: Callable[[list], int], budget: int, max_n: int,
          close: Callable[[list, object], bool] = lambda part, it: False) -> list[list]:
    """Greedy consecutive packing: a part grows while cost(part) <= budget, len(part) <= max_n and not close(part, it)."""
    parts: list[list] = []
    cur: list = []
    for it in items:
        if cur and (len(cur) >= max_n or cost(cur + [it]) > budget or close(cur, it)):
            parts.append(cur)
            cur = []
        cur.append(it)
    return parts + ([cur] if cur else [])


GROUP_TOKENS = 2048  # padded spine tokens per group of examples where a forward is slow (the module docstring)
SLACK = 0.95  # a branch batch closes when its rows' own work would fall below SLACK x its padded work ...
MIN_TOKENS = 1024  # ... unless the batch is still this small (a forward has a fixed cost too) ...
PAD_TOKENS = 256  # ... and the padding it would add stays under this many tokens (a branch chunk: models/prefix.py)
PAIRS_PER_TOKEN = 1000.0  # work model: one token's matmuls cost about as much as attention over this many keys


def work(seqs: int, width: int, p: int) -> float:
    """The work model of `seqs` sequences of `width` branch tokens after p cached columns: per token its matmuls
    plus its attention pairs (p + its place in the branch). PAIRS_PER_TOKEN: SmolLM2 does ~212 MFLOP of matmuls per
    token and ~69 kFLOP per (query, key) pair (30 layers x 9 heads x 64 x 4), about 3,000 pairs; its CPU attention
    costs ~3x more per FLOP than its matmuls, so ~1,000 (measured: docs/sweep.md, nq with 10 documents)."""
    return seqs * width * (PAIRS_PER_TOKEN + p + width / 2)


def plan_shared(rows: list[Encoded], branch_cost: Callable[[Encoded, int], tuple[int, int]], batch_tokens: int,
                max_batch: int, min_tokens: int = MIN_TOKENS, group_tokens: int | None = None,
                pad_tokens: int | None = PAD_TOKENS) -> list[Group]:
    """Groups of examples and their branch batches. branch_cost(row, p) -> (sequences, padded branch tokens per
    sequence) for a row reusing p spine tokens (teacher forcing: one sequence per accepted answer). A branch batch
    pads every sequence to its widest branch and its widest spine cut, so rows are taken costliest first and a
    batch closes when the padding would waste more than 1 - SLACK of its work (`work`); min_tokens: it never
    closes for that below this size (batch_tokens on an accelerator: fewer, larger forwards) unless the row joining
    it would be padded by pad_tokens or more (None, on an accelerator: never; on CPU a 2K needle sweep's 1,008-token
    branch carried a 500-token one padded to its width, 7% of its forward tokens; short rows never pad that much);
    group_tokens: the padded spine tokens of a group of examples (None: batch_tokens)."""
    shares = shares_of(rows)
    budget = batch_tokens if group_tokens is None else min(group_tokens, batch_tokens)
    groups = [Group(g) for g in _take(shares, lambda g: len(g) * max(len(s.spine) for s in g), budget, max_batch)]
    for g in groups:
        items = []  # (row, sequences, branch width, spine columns p)
        for s in g.shares:
            items += [(i, *branch_cost(rows[i], p), p) for i, p in zip(s.rows, s.plen)]
        items.sort(key=lambda t: (-work(*t[1:]), t[0]))

        def cost(part):  # padded KV columns: every sequence to the widest spine cut + the widest branch
            return sum(t[1] for t in part) * (max(t[3] for t in part) + max(t[2] for t in part))

        def close(part, it):
            both, part_seqs = part + [it], sum(t[1] for t in part)
            seqs, wide = part_seqs + it[1], max(t[2] for t in both)
            padded = work(seqs, wide, max(t[3] for t in both))
            # the padding joining adds: `it` padded to the part's width, or the part to a wider `it`'s
            pad = seqs * wide - part_seqs * max(t[2] for t in part) - it[1] * it[2]
            return (padded * SLACK > sum(work(*t[1:]) for t in both)
                    and (part_seqs * part[0][2] >= min_tokens or (pad_tokens is not None and pad >= pad_tokens)))

        g.batches = [[t[0] for t in part] for part in _take(items, cost, batch_tokens, max_batch, close)]
    return groups


def unique_ratio(rows: list[Encoded]) -> tuple[int, int]:
    """(all prompt tokens, unique tokens of each example's prefix tree): the ideal speed-up is their ratio."""
    total = sum(len(r.prompt_ids) for r in rows)
    return total, sum(tree_tokens([rows[i].prompt_ids for i in s.rows]) for s in shares_of(rows))
