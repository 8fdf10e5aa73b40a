"""PINE's attention pattern in the rollout-over-masks view (Wu et al. 2025's graph picture; PINE: Wang et al., ICLR
2025, Sec. 3.3): with attention between documents bidirectional and causal within each, the documents' influence on
the last token does not depend on their order; under the causal mask it does. An executable check in the shape of
the others (`theorems.result`), on seeded random SANs (A1-A2) without position encoding, so that the mask alone
decides; models/pine.py adds the positions (re-assigned by importance) that a RoPE model needs as well.

    pine_mask(prefix, lengths, suffix)   the pattern: prefix causal; a document causal within, bidirectional to the
                                         other documents, blind to the suffix; the suffix causal over everything
    doc_influence(...)                   each document's summed rollout weight on the last token, P^(T-1)[-1, doc]
    check_pine(...)                      the spread of that influence over orders of the documents, relative to the
                                         largest influence: at float precision under PINE's mask, about 1 under the
                                         causal mask (the check of invariance fails there: `invariant("causal")`).
                                         Relative, because under the causal mask the documents' influence itself
                                         fades with depth as the rollout settles on the first tokens (Thm 4.1): 0.45
                                         at 4 layers, 4e-5 at 16, while its spread stays its whole size
"""

from __future__ import annotations

import itertools

import torch

from ..core.rollout import causal_mask, iter_rollout, random_weights, san_forward
from .theorems import result

TOL = 1e-12  # float64: the relative spread of a permutation-invariant quantity
MOVES = 1e-2  # the causal mask's relative spread must exceed this (measured about 1 at 4, 8 and 16 layers)


def pine_mask(prefix: int, lengths: list[int], suffix: int) -> torch.Tensor:
    """(N, N) bool: PINE's pattern for a prefix, documents of `lengths` in that order, and a suffix."""
    n = prefix + sum(lengths) + suffix
    mask = causal_mask(n).clone()
    starts = [prefix + sum(lengths[:d]) for d in range(len(lengths))]
    for a, (sa, la) in enumerate(zip(starts, lengths)):
        for b, (sb, lb) in enumerate(zip(starts, lengths)):
            if a != b:
                mask[sa:sa + la, sb:sb + lb] = True  # between documents: both ways
    return mask


def doc_influence(order: list[int], tokens: dict, lengths: list[int], prefix: int, suffix: int, weights,
                  kind: str) -> torch.Tensor:
    """Each document's (by its identity, not its slot) summed weight in the last row of the deepest rollout."""
    lens = [lengths[d] for d in order]
    x = torch.cat([tokens["prefix"], *[tokens[d] for d in order], tokens["suffix"]])
    mask = pine_mask(prefix, lens, suffix) if kind == "pine" else causal_mask(x.shape[0])
    attns, _ = san_forward(x, weights, mask)
    last = list(iter_rollout(attns))[-1][-1]  # (N,)
    out = torch.zeros(len(lengths), dtype=x.dtype)
    col = prefix
    for d in order:
        out[d] = last[col:col + lengths[d]].sum()
        col += lengths[d]
    return out


def invariant(mask: str = "pine", lengths=(3, 4, 2, 5), prefix: int = 2, suffix: int = 3, n_layers: int = 4,
              d: int = 8, seed: int = 0) -> tuple[float, dict]:
    """(the largest spread of a document's influence over every order of the documents, relative to the largest
    influence; the influences by order)."""
    g = torch.Generator().manual_seed(seed)
    tokens = {"prefix": torch.randn(prefix, d, generator=g, dtype=torch.float64),
              "suffix": torch.randn(suffix, d, generator=g, dtype=torch.float64)}
    for k, n in enumerate(lengths):
        tokens[k] = torch.randn(n, d, generator=g, dtype=torch.float64)
    tokens = {k: v / v.norm(dim=-1, keepdim=True) for k, v in tokens.items()}  # unit-norm rows (A1)
    weights = random_weights(n_layers, d, seed=seed)
    runs = {order: doc_influence(list(order), tokens, list(lengths), prefix, suffix, weights, mask)
            for order in itertools.permutations(range(len(lengths)))}
    stacked = torch.stack(list(runs.values()))  # (orders, documents)
    spread = float((stacked.max(0).values - stacked.min(0).values).max())
    return spread / float(stacked.abs().max()), runs


def check_pine(seed: int = 0, n: int | None = None, n_layers: int = 4, lengths=(3, 4, 2, 5)) -> dict:
    """PINE's mask makes the documents' influence on the last token order-invariant; the causal mask does not.
    n: the tokens in all (a prefix of 2, a suffix of 3, four documents of unequal lengths sharing the rest; None:
    `lengths`)."""
    if n is not None:
        base = max(1, (n - 5) // 4)
        lengths = (max(1, base - 1), base, base + 1, max(1, n - 5 - 3 * base))
    spread_pine, _ = invariant("pine", lengths, n_layers=n_layers, seed=seed)
    spread_causal, _ = invariant("causal", lengths, n_layers=n_layers, seed=seed)
    return result("PINE mask", "bidirectional attention between documents (causal within) makes each document's "
                  "influence on the last token independent of the documents' order; the causal mask does not",
                  {"n": 5 + sum(lengths), "lengths": list(lengths), "n_layers": n_layers, "seed": seed,
                   "orders": len(list(itertools.permutations(lengths)))},
                  {"pine_invariant": spread_pine <= TOL, "causal_depends_on_order": spread_causal > MOVES},
                  spread_pine=spread_pine, spread_causal=spread_causal)
