"""PINE's attention by query group (models/pine.py's `_attend` plans the groups and calls these; its module docstring
has the method): the prefix's queries (`by_prefix`), whole documents' queries, one layout of the keys per document
(`by_layout`), and every other query, rotated once per token class (`by_class`, or `by_class_dense` for a few queries:
decoding). Each writes its queries' outputs into `out` [B, Hq, T, Dv].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _take(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x's rows `rows` (one batch row: a view, not a copy)."""
    return x.expand(len(rows), *x.shape[1:]) if x.shape[0] == 1 else x[rows]


def by_layout(q, kb, kh, vq, bl, delta, new, q_pos, rotate, scaling, window, rows, cols, valid, mask, out) -> None:
    """The queries of whole documents (`rows`, `cols` [P, L] and `valid` [P, L]: P documents' query columns,
    padded): a document's tokens share one layout of the keys (its importance is its document's), so the keys are
    rotated once per document at their re-assigned positions, as the paper's loop places them, and the document's
    queries attend to them in one fused SDPA. A key at offset m of a class that starts at a: R(a + m) = R(a) R(m),
    one broadcast product per block group on the keys already rotated at their offsets."""
    p, hq, d = rows.shape[0], q.shape[1], q.shape[3]
    hk, k_len = kb.shape[1], bl.seen
    g = hq // hk
    lay = delta[rows, :, cols[:, 0]]  # [P, H, C]: the document's layout (its first query's)
    cos, sin = rotate.cos_sin(new[rows, :, cols[:, 0]], kb.dtype)  # [P, H, C, D]: at each class's new start
    kr = kb.new_empty(p, hk, g, k_len, d)
    kbp, khp = _take(kb, rows), _take(kh, rows)
    for members, width, offset in bl.groups:
        if offset >= k_len:  # the suffix's block
            break
        z, m = slice(offset, offset + len(members) * width), len(members)
        dst = kr[:, :, :, z].view(p, hk, g, m, width, d)
        torch.mul(khp[:, :, None, z].view(p, hk, 1, m, width, d), sin[:, :, members].view(p, hk, g, m, 1, d), out=dst)
        dst.addcmul_(kbp[:, :, None, z].view(p, hk, 1, m, width, d), cos[:, :, members].view(p, hk, g, m, 1, d))
    qp = q_pos[rows[:, None], :, cols].transpose(1, 2)  # [P, H, L]
    qr = rotate(q[rows[:, None], :, cols].transpose(1, 2), qp)  # [P, H, L, D]
    if window is not None:
        k_pos = _take(bl.pos[:, :k_len], rows)[:, None, :] + lay.gather(2, bl.cls[None, None, :k_len].expand(p, hq,
                                                                                                             k_len))
        mask = mask & ((qp[..., None] - k_pos[:, :, None, :] < window) | ~valid[:, None, :, None])
    o = F.scaled_dot_product_attention(qr, kr.view(p, hq, k_len, d), _take(vq, rows), attn_mask=mask, scale=scaling)
    _put(out, rows, cols, valid, o)


def by_prefix(q, kr, v, seg, ok, q_pos, rotate, scaling, window, length, out) -> None:
    """The first `length` query columns, which hold every row's prefix: the prefix sees only itself, at its given
    positions, in every variant (nothing before it moves), so one fused SDPA over the keys up to it, the queries and
    keys at their offsets in the prefix. Written first: the other columns among them (padding, a row's first
    documents where its prefix is shorter) are written over by their own paths."""
    b, hq, t, _ = q.shape
    s = kr.shape[2]
    kl = s - t + length
    rel = q_pos[:, :, :length] - seg.starts()[:, -2, None, None]  # at the offset from the prefix's start
    mask = ok[:, None, :length, :kl]
    if window is not None:
        mask = mask & (rel[:, :1, :, None] - seg.local()[:, None, None, :kl] < window)
    out[:, :, :length] = F.scaled_dot_product_attention(rotate(q[:, :, :length], rel), kr[:, :, :kl], v[:, :, :kl],
                                                        attn_mask=mask, scale=scaling, enable_gqa=kr.shape[1] != hq)


def _by_key_head(cols: torch.Tensor, hk: int, *xs: torch.Tensor) -> list[torch.Tensor]:
    """Each [B, Hq, T, ...] tensor's query columns `cols` [B, T'], as [B, Hk, G T', ...]: query head h reads key
    head h // G, so a key head's G query heads go together as (group, query) rows."""
    b, tq = cols.shape
    return [x.gather(2, cols[:, None, :, *([None] * (x.dim() - 3))].expand(b, x.shape[1], tq, *x.shape[3:]))
            .view(b, hk, -1, *x.shape[3:]) for x in xs]


def _put(out: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, valid: torch.Tensor, o: torch.Tensor) -> None:
    """Write o [P, H, L, Dv] (row `rows[p]`, query columns `cols` [P, L], `valid` [P, L]) into out [B, H, T, Dv]."""
    out[rows[:, None].expand_as(cols)[valid], :, cols[valid]] = o.transpose(1, 2)[valid].to(out.dtype)


def by_class_dense(q, kr, v, seg, delta, new, q_pos, rotate, scaling, window, cols, valid, mask, out) -> None:
    """`by_class` for a few queries (decoding): each query rotated once per class against every key in column
    order, and each key's logit taken from its class's row; C times the products, but no blocks to build."""
    b, hq, _, d = q.shape
    hk, s, c, tq = kr.shape[1], kr.shape[2], delta.shape[3], cols.shape[1]
    g = hq // hk
    q, q_pos, delta, new = _by_key_head(cols, hk, q, q_pos, delta, new)
    ci = seg.classes()  # [B, S]
    qr = rotate(q[:, :, :, None].expand(b, hk, g * tq, c, d), q_pos[..., None] - new)  # [B, Hk, G T', C, D]
    every = torch.matmul(qr.view(b, hk, g * tq * c, d), kr.transpose(-1, -2)).view(b, hk, g * tq, c, s)
    logits = every.gather(3, ci[:, None, None, None, :].expand(b, hk, g * tq, 1, s))[:, :, :, 0] * scaling
    okz = mask[:, None, None].expand(b, 1, g, tq, s).reshape(b, 1, g * tq, s)
    if window is not None:
        k_pos = seg.pos[:, None, None, :] + delta.gather(3, ci[:, None, None, :].expand(b, hk, g * tq, s))
        okz = okz & (q_pos[..., None] - k_pos < window)
    attn = torch.softmax(logits.float().masked_fill(~okz, -math.inf), dim=-1)
    _put(out, torch.arange(b, device=cols.device), cols, valid, torch.matmul(attn.to(v.dtype), v).view(b, hq, tq, -1))


def by_class(q, kb, vb, bl, delta, new, q_pos, rotate, scaling, window, cols, valid, mask, out) -> None:
    """Every other query (the prefix, the suffix, decoded tokens, short documents and separators; `cols` [B, T']
    padded, `valid`): each has its own layout, so instead of rotating every key for it, the query is rotated once per
    token class, at its new position less the class's new start, against the keys at their offsets in their class
    (RoPE's logit depends on the positions' difference only),
    block group by block group; the queries of a key head's group of query heads together, in chunks of bounded
    memory."""
    b, hq, _, d = q.shape
    hk, k_len, c, tq = kb.shape[1], kb.shape[2], delta.shape[3], cols.shape[1]
    g = hq // hk
    q, q_pos, delta, new = _by_key_head(cols, hk, q, q_pos, delta, new)
    q = q * scaling  # on the queries, not on every logit
    mask = mask.gather(2, bl.src.clamp(min=0)[:, None, :].expand(b, tq, k_len)) & (bl.src >= 0)[:, None]  # blocked
    mask = mask[:, None, None].expand(b, 1, g, tq, k_len).reshape(b, 1, g * tq, k_len)
    blocks = [(m, kb[:, :, o:o + len(m) * w].view(b, hk, len(m), w, d)) for m, w, o in bl.groups]
    step = max(1, (1 << 22) // max(1, b * hk * max(k_len, c * d)))  # queries per chunk: bounded memory
    res = []
    for a in range(0, g * tq, step):  # chunks of queries (one chunk at the sizes of the tests and of decoding)
        z = slice(a, min(g * tq, a + step))
        tz = z.stop - z.start
        qr = rotate(q[:, :, z, None].expand(b, hk, tz, c, d), q_pos[:, :, z, None] - new[:, :, z])
        logits = torch.cat([torch.einsum("bhtcd,bhcld->bhtcl", qr[:, :, :, m], bk).reshape(b, hk, tz, -1)
                            for m, bk in blocks], dim=3)  # [B, Hk, tz, K]: the blocked keys
        okz = mask[:, :, z]
        if window is not None:  # a sliding layer: the window on the re-assigned distance
            k_pos = bl.pos[:, None, None, :] + delta[:, :, z].gather(3, bl.cls[None, None, None, :].expand(b, hk, tz,
                                                                                                          k_len))
            okz = okz & (q_pos[:, :, z, None] - k_pos < window)
        attn = torch.softmax(logits.masked_fill(~okz, -math.inf), dim=-1, dtype=torch.float32)
        res.append(torch.matmul(attn.to(vb.dtype), vb))  # [B, Hk, tz, Dv]
    _put(out, torch.arange(b, device=cols.device), cols, valid, torch.cat(res, 2).view(b, hq, tq, -1))
