"""PINE: inter-document position-invariant attention (Wang et al., "Eliminating Position Bias of Language Models: A
Mechanistic Approach", ICLR 2025, arXiv:2407.01100, Sec. 3.3 and Fig. 2), as one attention computation on
un-rotated q, k, v; the method around it (which tokens are documents, the model's hooks) is built on this.

A prompt's tokens fall in classes: the prefix (system and instruction tokens before the first document), the
documents 0..n-1 (each a contiguous run of tokens), and the suffix (question, answer prefix, answer, every decoded
token). PINE (Sec. 3.3):

  mask        inter-document attention bidirectional, intra-document attention causal; prefix and suffix causal
              as before (a document never sees the suffix, the prefix never sees a document)
  importance  Importance_token(i, j) = softmax_j(q_i k_j^T / sqrt(d)) over the keys query i may see, WITHOUT
              position encoding; a document query's importance of document d sums it over the query document's
              tokens and over d's tokens and divides by |d| (Importance(D1, D2) = sum_{i in D1, j in D2} / |D2|);
              a suffix token's over d's tokens / |d| (token to document). Per layer and per head, as the proof needs
  positions   more important documents closer to the query: the documents, as keys, are laid out after the prefix
              in ascending importance (the most important last); a document's own tokens, as queries, come last
              (each document is the last document when it queries). Prefix and suffix positions are unchanged (the
              documents' total length is the same in every order)

Theorem 1 (Sec. 3.3, App. B): applied at every layer, head and token, the outputs do not depend on the documents'
order. Variants (`VARIANTS`, the paper's ablations and baselines, Sec. 3.4 and 4.3):

  pine      the method
  reversed  more important documents further from the query (invariant too; RoPE's recency then works against
            the attention)
  fixed     bidirectional mask, positions as given (no re-assignment: not invariant under RoPE)
  causal    re-assignment on the causal mask (no bidirectional attention: not invariant; the mask's ablation)
  nia       no inter-document attention, positions as given (not invariant under RoPE)
  pcw       Parallel Context Windows (Ratner et al. 2023): no inter-document attention, every document starts at
            the same position, the suffix after the longest one (invariant)

Computation (`attend`): RoPE makes a logit depend on the query's and the key's positions only through their
difference, so a key of class c moved by delta_c(i) for query i is the same as the query rotated at
pos_i' - delta_c(i) against the key at its given position. Each query is rotated once per class (n + 2 rotations,
not one per key), the keys once at their given positions, and the logits are taken class by class over keys
gathered into padded blocks, the queries in chunks of bounded memory; the ranking is one argsort per query and the
importance's segment sums are scatter-adds (O(T S), not O(T S n)). No loop over documents or layers in Python.
Its cost is not yet where the issue wants it (docs/mitigations.md, "PINE"). `reference` is the paper's loop as
written (every query, every key placed at its re-assigned position and rotated there), for the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

VARIANTS = ("pine", "reversed", "fixed", "causal", "nia", "pcw")
INVARIANT = {"pine": True, "reversed": True, "fixed": False, "causal": False, "nia": False, "pcw": True}
BLOCKED = ("nia", "pcw")  # no attention between documents
CAUSAL = ("causal",)  # the causal mask kept between documents
PREFIX, SUFFIX, PAD = -1, -2, -3  # token classes besides the documents 0..n-1


@dataclass(frozen=True)
class Segments:
    """The token classes of a batch. cls [B, S]: a document index, PREFIX, SUFFIX or PAD for every key column (the
    queries are the last T columns); pos [B, S]: each column's given position (position_ids); n: documents per row
    (a row with fewer has empty ones)."""

    cls: torch.Tensor
    pos: torch.Tensor
    n: int

    @property
    def onehot(self) -> torch.Tensor:
        """[B, S, n] float: column j belongs to document d."""
        return (self.cls[..., None] == torch.arange(self.n, device=self.cls.device)).float()

    def layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(length [B, n], given start position [B, n] (0 for an empty document), the documents' first position
        [B]): the layout every re-assignment starts from."""
        oh = self.onehot
        length = oh.sum(1)
        big = torch.iinfo(torch.long).max
        start = torch.where(oh.bool(), self.pos[..., None], big).amin(1)
        start = torch.where(length > 0, start, 0)
        first = torch.where(length > 0, start, big).amin(1)
        return length, start, torch.where(first == big, 0, first)


def allowed(seg: Segments, t: int, variant: str) -> torch.Tensor:
    """[B, T, S] bool: which keys each of the last T query columns may attend to (module docstring's mask)."""
    cls, s = seg.cls, seg.cls.shape[1]
    q_cls = cls[:, s - t:]
    qi = torch.arange(s - t, s, device=cls.device)
    causal = qi[:, None] >= torch.arange(s, device=cls.device)[None, :]  # [T, S]
    qd, kd = q_cls[:, :, None], cls[:, None, :]
    docs = (qd >= 0) & (kd >= 0)
    cross = docs & (qd != kd)
    ok = causal[None] & ~(cross if variant in BLOCKED else torch.zeros_like(cross))
    if variant not in BLOCKED + CAUSAL:
        ok = ok | cross  # bidirectional between documents
    ok = ok & (kd != PAD) & ~((qd >= 0) & (kd == SUFFIX))
    return ok | ((qd == PAD) & (torch.arange(s, device=cls.device)[None, None, :] == qi[None, :, None]))  # pad: itself


def importance(q: torch.Tensor, k: torch.Tensor, seg: Segments, ok: torch.Tensor, scaling: float) -> torch.Tensor:
    """[B, H, T, n]: each query's importance of each document (module docstring), from un-rotated q [B, H, T, D]
    and k [B, H, S, D] (k repeated per query head). Segment sums by scatter_add: O(T S), not O(T S n)."""
    b, h, t, _ = q.shape
    n = seg.n
    logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling
    attn = torch.softmax(logits.masked_fill(~ok[:, None], -math.inf), dim=-1)  # [B, H, T, S]
    col = torch.where(seg.cls >= 0, seg.cls, n)  # [B, S]: a document, or n for every other key
    per_token = attn.new_zeros(b, h, t, n + 1).scatter_add_(3, col[:, None, None, :].expand_as(attn), attn)[..., :n]
    per_token = per_token / seg.onehot.sum(1).clamp(min=1)[:, None, None, :]
    q_cls = seg.cls[:, -t:]
    own = torch.where(q_cls >= 0, q_cls, n)  # [B, T]
    per_doc = per_token.new_zeros(b, h, n + 1, n).index_add_(2, own[0], per_token) if b == 1 else torch.stack(
        [per_token[r].new_zeros(h, n + 1, n).index_add_(1, own[r], per_token[r]) for r in range(b)])  # [B, H, n+1, n]
    as_doc = per_doc.gather(2, own[:, None, :, None].expand(b, h, t, n))  # a document query: its document's sum
    return torch.where((q_cls >= 0)[:, None, :, None], as_doc, per_token)


def shifts(imp: torch.Tensor | None, seg: Segments, t: int, variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(delta [B, H, T, n + 2], query shift [B, H, T]): how far each class of keys moves for each query (documents
    0..n-1, then the prefix and the suffix) and how far the query itself moves (module docstring's positions)."""
    b, s = seg.cls.shape
    h = 1 if imp is None else imp.shape[1]
    length, start, first = seg.layout()
    q_cls = seg.cls[:, s - t:]
    dev, n = seg.cls.device, seg.n
    delta = torch.zeros(b, h, t, n + 2, dtype=torch.long, device=dev)
    if variant in ("fixed", "nia"):
        return delta, delta[..., 0]
    if variant == "pcw":  # every document at the documents' first position, the suffix after the longest
        delta[..., :n] = (first[:, None] - start)[:, None, None, :]
        delta[..., n + 1] = (length.amax(1) - length.sum(1))[:, None, None].long()
    else:  # pine, reversed, causal: ascending importance (reversed: descending), the query's own document last
        key = (-imp if variant == "reversed" else imp).clone()
        own = q_cls[:, None, :, None] == torch.arange(n, device=dev)  # [B, 1, T, n]
        key = key.masked_fill(own.expand_as(key), math.inf)
        order = torch.argsort(key, dim=-1, stable=True)  # ties: the lower index first
        lens = length[:, None, None, :].expand_as(key).gather(-1, order)
        starts = first[:, None, None, None] + (lens.cumsum(-1) - lens).long()
        new = torch.zeros_like(order).scatter_(-1, order, starts)  # [B, H, T, n]
        delta[..., :n] = new - start[:, None, None, :]
    own_cls = torch.where(q_cls >= 0, q_cls, torch.where(q_cls == SUFFIX, n + 1, n))  # [B, T]
    shift = delta.gather(3, own_cls[:, None, :, None].expand(b, delta.shape[1], t, 1))[..., 0]
    return delta, shift


def _class_index(cls: torch.Tensor, n: int) -> torch.Tensor:
    """Each key's class as an index into the n + 2 shifts (documents, prefix, suffix; padding as prefix)."""
    return torch.where(cls >= 0, cls, torch.where(cls == SUFFIX, n + 1, n))


def attend(q, k, v, seg: Segments, rotate: Callable, scaling: float, variant: str = "pine",
           window: int | None = None) -> torch.Tensor:
    """PINE attention for the last T columns: q [B, Hq, T, D], k and v [B, Hk, S, D] un-rotated (a cache's columns
    first); rotate(x, positions) applies the layer's RoPE at integer positions of x's leading shape; -> [B, Hq, T, Dv]
    (module docstring). window: a sliding layer's window, on the re-assigned distances."""
    b, hq, t, d = q.shape
    groups = hq // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s, n = k.shape[2], seg.n
    ok = allowed(seg, t, variant)
    imp = importance(q, k, seg, ok, scaling) if variant in ("pine", "reversed", "causal") else None
    delta, shift = shifts(imp, seg, t, variant)  # [B, H', T, C], [B, H', T]
    delta, shift = delta.expand(b, hq, t, n + 2), shift.expand(b, hq, t)
    q_pos = seg.pos[:, s - t:][:, None] + shift  # [B, H, T]: each query's re-assigned position
    kr = rotate(k, seg.pos[:, None].expand(b, hq, s))  # [B, H, S, D]: keys at their given positions
    ci = _class_index(seg.cls, n)  # [B, S]
    groups, flat = _key_blocks(kr, ci, n + 2)  # [(classes, [B, H, C_g, L_g, D])], [B, S]
    size = sum(bl.shape[2] * bl.shape[3] for _, bl in groups)
    step = max(1, (1 << 22) // max(1, b * hq * size))  # queries per chunk: bounded memory
    out = []
    for a in range(0, t, step):  # chunks of queries (one chunk at the sizes of the tests and of decoding)
        z = slice(a, min(t, a + step))
        tz = z.stop - z.start
        qr = rotate(q[:, :, z, None].expand(b, hq, tz, n + 2, d), q_pos[:, :, z, None] - delta[:, :, z])
        per = torch.cat([torch.einsum("bhtcd,bhcld->bhtcl", qr[:, :, :, cls_g], bl).reshape(b, hq, tz, -1)
                         for cls_g, bl in groups], dim=3)
        logits = per.gather(3, flat[:, None, None, :].expand(b, hq, tz, s)) * scaling  # [B, H, t, S]
        okz = ok[:, None, z]
        if window is not None:  # a sliding layer: the window on the re-assigned distance
            k_shift = torch.gather(delta[:, :, z], 3, ci[:, None, None, :].expand(b, hq, tz, s))
            dist = q_pos[:, :, z, None] - (seg.pos[:, None, None, :] + k_shift)
            okz = okz & (dist < window)
        attn = torch.softmax(logits.float().masked_fill(~okz, -math.inf), dim=-1)
        out.append(torch.matmul(attn.to(v.dtype), v))
    return torch.cat(out, 2)


def _key_blocks(kr: torch.Tensor, ci: torch.Tensor, c: int) -> tuple[list, torch.Tensor]:
    """The keys gathered class by class into padded blocks, classes grouped by length (the next power of two, so a
    one-token separator is not padded to a document's length): [(class indices, [B, H, C_g, L_g, D])], and each key's
    place in the groups' concatenated blocks, to put the logits back in column order."""
    b, h, s, d = kr.shape
    oh = ci[..., None] == torch.arange(c, device=ci.device)  # [B, S, C]
    slot = (oh.long().cumsum(1) - 1).gather(2, ci[..., None])[..., 0]  # [B, S]: the key's place in its class
    longest = oh.sum(1).amax(0)  # [C]: each class's length (the longest over the batch)
    bucket = torch.where(longest > 0, torch.ceil(torch.log2(longest.clamp(min=1).float())).long(), -1)
    groups, base = [], torch.zeros(c, dtype=torch.long, device=ci.device)
    offset = 0
    for g in sorted(set(bucket.tolist()) - {-1}):
        members = torch.nonzero(bucket == g)[:, 0]
        width = int(longest[members].max())
        base[members] = offset + torch.arange(len(members), device=ci.device) * width
        groups.append((members, width, offset))
        offset += len(members) * width
    flat = base[ci] + slot  # [B, S]: the key's column in the concatenated blocks
    blocks = kr.new_zeros(b, h, offset, d).scatter_(2, flat[:, None, :, None].expand(b, h, s, d), kr)  # one scatter
    return [(m, blocks[:, :, o:o + len(m) * w].view(b, h, len(m), w, d)) for m, w, o in groups], flat


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


def rotation(inv_freq: torch.Tensor, scaling: float = 1.0) -> Callable:
    """rotate(x, positions) for a RoPE of these frequencies, as transformers' rotary modules compute it (fp32 angles,
    cat(freqs, freqs), cos and sin times the scaling, cast to x's dtype; rotate_half), at integer positions of x's
    leading shape, negative ones too (a query moved back past a key). cos and sin come from a table built once per
    dtype and range and grown on demand: PINE rotates each query once per token class, and the trigonometry was
    most of its time."""
    inv = inv_freq.detach().float()
    tables: dict = {}  # (device, dtype) -> (lowest position, cos, sin)

    def table(x: torch.Tensor, lo: int, hi: int):
        have = tables.get((x.device, x.dtype))
        if have is not None and have[0] <= lo and hi < have[0] + have[1].shape[0]:
            return have
        lo, hi = min(lo, -64) * 2, max(hi, 64) * 2
        ang = torch.arange(lo, hi + 1, dtype=torch.float32, device=x.device)[:, None] * inv.to(x.device)
        emb = torch.cat((ang, ang), dim=-1)
        tables[(x.device, x.dtype)] = (lo, (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype))
        return tables[(x.device, x.dtype)]

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        positions = positions.to(x.device)
        lo, cos, sin = table(x, int(positions.min()), int(positions.max()))
        idx = positions - lo
        half = x.shape[-1] // 2
        return x * cos[idx] + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin[idx]

    return rotate
