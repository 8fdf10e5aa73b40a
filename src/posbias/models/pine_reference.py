"""PINE's attention as the paper writes it (Wang et al., ICLR 2025, Sec. 3.3): one query at a time, its visible keys,
the documents' importance, every key placed at its re-assigned position and rotated there. Slow; the tests hold
models/pine.attend to it.
"""

from __future__ import annotations

from typing import Callable

import torch

from .pine import BLOCKED, CAUSAL, Segments
from .pine_plan import PAD, SUFFIX


def reference(q, k, v, seg: Segments, rotate: Callable, scaling: float, variant: str = "pine",
              window: int | None = None) -> torch.Tensor:
    """The paper's loop as written, one query at a time: its visible keys, the documents' importance, every key
    placed at its re-assigned position and rotated there; slow, for the tests of `attend`."""
    b, hq, t, d = q.shape
    groups = hq // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s, n = k.shape[2], seg.n
    out = torch.zeros(b, hq, t, v.shape[-1], dtype=torch.float32)
    cls, pos = seg.cls.tolist(), seg.pos.tolist()
    for r in range(b):
        docs = [[j for j in range(s) if cls[r][j] == c] for c in range(n)]
        for h in range(hq):
            qk = [_visible(cls[r], s - t + i, s, variant) for i in range(t)]
            imp = [_doc_importance(q[r, h], k[r, h], cls[r], qk, i, docs, scaling, s - t) for i in range(t)]
            for i in range(t):
                col = s - t + i
                q_at, key_at = _positions(cls[r], pos[r], docs, col, imp[i], variant)
                keys = [j for j in qk[i] if window is None or q_at - key_at[j] < window]
                qv = rotate(q[r, h, i][None], torch.tensor([q_at]))[0]
                kv = torch.stack([rotate(k[r, h, j][None], torch.tensor([key_at[j]]))[0] for j in keys])
                w = torch.softmax((kv.float() @ qv.float()) * scaling, dim=0)
                out[r, h, i] = (w[:, None] * v[r, h, keys].float()).sum(0)
    return out


def _visible(cls: list[int], col: int, s: int, variant: str) -> list[int]:
    qc, out = cls[col], []
    for j in range(s):
        kc = cls[j]
        if kc == PAD or (qc >= 0 and kc == SUFFIX):
            continue
        if j <= col and not (variant in BLOCKED and qc >= 0 and kc >= 0 and kc != qc):
            out.append(j)
        elif variant not in BLOCKED + CAUSAL and qc >= 0 and kc >= 0 and kc != qc:
            out.append(j)
    return out or [col]


def _doc_importance(q, k, cls, visible, i, docs, scaling, q0) -> list[float]:
    """Importance of each document for query i (its document's tokens summed when it is a document's)."""
    def token(col_i: int) -> list[float]:
        keys = visible[col_i - q0]
        w = torch.softmax((k[keys].float() @ q[col_i - q0].float()) * scaling, dim=0).tolist()
        mass = dict(zip(keys, w))
        return [sum(mass.get(j, 0.0) for j in doc) / max(len(doc), 1) for doc in docs]

    own = cls[q0 + i]
    if own < 0:
        return token(q0 + i)
    rows = [token(c) for c in docs[own] if c >= q0]
    return [sum(r[d] for r in rows) for d in range(len(docs))]


def _positions(cls, pos, docs, col, imp, variant) -> tuple[int, dict[int, int]]:
    """(the query's position, {key column: its position}) for the query at `col`."""
    n = len(docs)
    present = [d for d in range(n) if docs[d]]
    first = min((pos[docs[d][0]] for d in present), default=0)
    at = {j: pos[j] for j in range(len(cls))}
    if variant in ("fixed", "nia") or not present:
        return pos[col], at
    if variant == "pcw":
        longest = max(len(docs[d]) for d in present)
        total = sum(len(docs[d]) for d in present)
        for d in present:
            for m, j in enumerate(docs[d]):
                at[j] = first + m
        for j in range(len(cls)):
            if cls[j] == SUFFIX:
                at[j] = pos[j] + longest - total
        return at[col], at
    own = cls[col] if cls[col] >= 0 else None
    others = sorted((d for d in range(n) if d != own), key=lambda d: (-imp[d] if variant == "reversed" else imp[d], d))
    order = others + ([own] if own is not None else [])
    p = first
    for d in order:
        for m, j in enumerate(docs[d]):
            at[j] = p + m
        p += len(docs[d])
    return at[col], at
