"""PINE's bookkeeping (models/pine.py has the attention): the token classes, the keys gathered class by class into
blocks, and which queries go by layout and which by class. Made once per forward and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

PREFIX, SUFFIX, PAD = -1, -2, -3  # token classes besides the documents 0..n-1


IDENTITY = "identity"  # `canonical_order` of columns already in canonical order


def allowed(cls: torch.Tensor, t: int, blocked: bool, causal_docs: bool) -> torch.Tensor:
    """[B, T, S] bool: which keys each of the last T query columns may attend to (models/pine.py's mask; blocked: no
    attention between documents, causal_docs: the causal mask kept between them)."""
    s = cls.shape[1]
    q_cls = cls[:, s - t:]
    qi = torch.arange(s - t, s, device=cls.device)
    causal = qi[:, None] >= torch.arange(s, device=cls.device)[None, :]  # [T, S]
    qd, kd = q_cls[:, :, None], cls[:, None, :]
    cross = (qd >= 0) & (kd >= 0) & (qd != kd)
    ok = causal[None] & ~(cross if blocked else torch.zeros_like(cross))
    if not (blocked or causal_docs):
        ok = ok | cross  # bidirectional between documents
    ok = ok & (kd != PAD) & ~((qd >= 0) & (kd == SUFFIX))
    return ok | ((qd == PAD) & (torch.arange(s, device=cls.device)[None, None, :] == qi[None, :, None]))  # pad: itself


def canonical_order(cls: torch.Tensor, ids: torch.Tensor, n: int, t: int):
    """(perm [B, S], the classes relabelled and in that order), IDENTITY, or None (the last t columns, the queries,
    would not stay last): the columns in an order that does not depend on the documents' (padding, prefix, the
    documents by their token ids, suffix; each class's tokens in their order), the documents relabelled the same
    way."""
    b, s = cls.shape
    relabel = torch.empty(b, n, dtype=torch.long)
    idl, cl = ids.tolist(), cls.tolist()
    for r in range(b):
        docs: dict = {}
        for j, c in enumerate(cl[r]):
            if c >= 0:
                docs.setdefault(c, []).append(idl[r][j])
        order = sorted(docs, key=lambda c: (docs[c], c)) + [c for c in range(n) if c not in docs]
        relabel[r, order] = torch.arange(n)
    relabel = relabel.to(cls.device)
    new = torch.where(cls >= 0, relabel.gather(1, cls.clamp(min=0)), cls)
    group = torch.where(cls == PAD, 0, torch.where(cls == PREFIX, 1, torch.where(cls == SUFFIX, 3, 2)))
    col = torch.arange(s, device=cls.device)
    perm = torch.argsort((group * (n + 1) + new.clamp(min=0)) * s + col, dim=1)
    if (perm[:, s - t:] < s - t).any():  # queries that are not the last in the canonical order: not reordered
        return None
    if torch.equal(new, cls) and torch.equal(perm, col.expand(b, s)):
        return IDENTITY  # already in canonical order (a decoding step on a store kept in it)
    return perm, new.gather(1, perm)


def take(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D]'s columns p [B, S'] (per row; by indexing, not `gather`: 2.5-4x faster here)."""
    if x.shape[0] == 1:
        return x.index_select(2, p[0])
    return x[torch.arange(x.shape[0], device=p.device)[:, None], :, p].transpose(1, 2)


def class_index(cls: torch.Tensor, n: int) -> torch.Tensor:
    """Each key's class as an index into the n + 2 shifts (documents, prefix, suffix; padding as prefix)."""
    return torch.where(cls >= 0, cls, torch.where(cls == SUFFIX, n + 1, n))


@dataclass(frozen=True)
class Blocks:
    """The key columns gathered class by class into padded blocks (classes grouped by length in steps of an eighth
    of an octave, so a one-token separator is not padded to a document's length and a document by at most 9%; the
    suffix last, in a group of its own). groups: [(class indices [C_g], width, offset)], group g's classes at
    columns offset .. offset + C_g * width of the blocked layout; flat [B, S]: each column's place there; src [B, K]:
    the column each place holds (-1: padding); cls [K]: each place's class; pos [B, K]: its given position; seen:
    where the suffix's block starts (a document's queries see only the keys before it)."""

    groups: list
    flat: torch.Tensor
    src: torch.Tensor
    cls: torch.Tensor
    pos: torch.Tensor
    seen: int

    def put(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, H, S, D] in the blocked layout [B, H, K, D] (zeros at the padding)."""
        b, h, s, d = x.shape
        return x.new_zeros(b, h, self.src.shape[1], d).scatter_(2, self.flat[:, None, :, None].expand(b, h, s, d), x)


def blocks(ci: torch.Tensor, c: int, pos: torch.Tensor) -> Blocks:
    b, s = ci.shape
    dev = ci.device
    oh = ci[..., None] == torch.arange(c, device=dev)  # [B, S, C]
    slot = (oh.long().cumsum(1) - 1).gather(2, ci[..., None])[..., 0]  # [B, S]: the key's place in its class
    longest = oh.sum(1).amax(0)  # [C]: each class's length (the longest over the batch)
    bucket = torch.where(longest > 0, torch.ceil(8 * torch.log2(longest.clamp(min=1).float())).long(), -1)
    bucket[-1] = torch.where(longest[-1] > 0, 1 << 20, -1)  # the suffix (class c - 1): last, alone
    groups, base, cls, offset, seen = [], torch.zeros(c, dtype=torch.long, device=dev), [], 0, None
    for g in sorted(set(bucket.tolist()) - {-1}):
        seen = offset if g == 1 << 20 else seen
        members = torch.nonzero(bucket == g)[:, 0]
        width = int(longest[members].max())
        base[members] = offset + torch.arange(len(members), device=dev) * width
        groups.append((members, width, offset))
        cls.append(members.repeat_interleave(width))
        offset += len(members) * width
    flat = base[ci] + slot
    src = torch.full((b, offset), -1, dtype=torch.long, device=dev).scatter_(1, flat, torch.arange(s, device=dev)
                                                                              .expand(b, s))
    return Blocks(groups, flat, src, torch.cat(cls), pos.gather(1, src.clamp(min=0)), offset if seen is None else seen)


@dataclass(frozen=True)
class Plan:
    """layouts: [(rows [P], cols [P, L], valid [P, L], mask [P, 1, L, K])], chunks of documents whose query columns
    go by layout (padded; shortest documents first, so a chunk's are of like length; the mask over the blocked
    keys); rest: (cols [B, T'], valid [B, T'], mask [B, T', S]) or None: by class; prefix: the first query
    columns up to every row's last prefix token (0: none), which go by themselves (they see only the prefix, at its
    given positions; the other columns among them are written over by their own paths); lead: how many query
    columns are the prefix's or padding in every row (they need no importance)."""

    layouts: list
    rest: tuple | None
    prefix: int = 0
    lead: int = 0


def _columns(take: torch.Tensor, ok: torch.Tensor, keys: int) -> tuple:
    """(cols [B, T'], valid [B, T'], mask [B, T', keys]): each row's query columns where `take` [B, T], padded."""
    b = take.shape[0]
    width = int(take.sum(1).max())
    order = torch.argsort((~take).to(torch.int8), dim=1, stable=True)[:, :width]  # each row's columns first
    valid = take.gather(1, order)
    mask = ok[:, :, :keys].gather(1, order[..., None].expand(b, width, keys)) | ~valid[..., None]
    return order, valid, mask


def plan(q_cls: torch.Tensor, n: int, per_chunk: int, ok: torch.Tensor, blocks: Callable, layout_min: int,
         k_cls: torch.Tensor | None, by_cost: bool = True) -> Plan:
    """Which of the query columns (their classes q_cls [B, T]; the keys' k_cls [B, S]) go by layout: whole documents
    of layout_min tokens or more whose queries, rotated once per class, would outnumber the keys (by_cost: tokens x
    classes >= keys; a judge's short candidates go by class), in chunks of per_chunk documents; the prefix's queries
    by themselves where every key before them is the prefix's or padding (a prompt's prefix comes first: it sees
    only itself, at its given positions, in every variant); the rest go by class."""
    b, dev = q_cls.shape[0], q_cls.device
    counts = (q_cls[..., None] == torch.arange(n, device=dev)).sum(1)  # [B, n]
    big = (counts >= layout_min) & (counts * (n + 2) >= (ok.shape[2] if by_cost else 0))
    pairs = sorted(torch.nonzero(big).tolist(), key=lambda rd: (int(counts[rd[0], rd[1]]), rd))
    layouts = []
    if pairs:
        bl = blocks()
        src = bl.src[:, :bl.seen]  # the keys before the suffix's block
        okb = ok.gather(2, src.clamp(min=0)[:, None, :].expand(b, ok.shape[1], -1)) & (src >= 0)[:, None]
    for a in range(0, len(pairs), per_chunk):
        chunk = pairs[a:a + per_chunk]
        cs = [torch.nonzero(q_cls[r] == d_)[:, 0] for r, d_ in chunk]
        width = max(len(c) for c in cs)
        cols = torch.stack([torch.cat([c, c[:1].expand(width - len(c))]) for c in cs])  # padded with a real column
        valid = torch.arange(width, device=dev)[None, :] < torch.tensor([len(c) for c in cs], device=dev)[:, None]
        rows = torch.tensor([r for r, _ in chunk], device=dev)
        mask = (okb[rows[:, None], cols] | ~valid[..., None])[:, None]  # a padded query row sees every key
        layouts.append((rows, cols, valid, mask))
    rest = ~(big.gather(1, q_cls.clamp(min=0)) & (q_cls >= 0))  # [B, T]
    pre, prefix, lead = q_cls == PREFIX, 0, 0
    if k_cls is not None and pre.any():
        s, t = k_cls.shape[1], q_cls.shape[1]
        col = torch.arange(s, device=dev)
        last = torch.where(pre, col[s - t:], -1).amax(1)  # [B]: each row's last prefix query column
        other = torch.where((k_cls >= 0) | (k_cls == SUFFIX), col, s).amin(1)  # its first key of another class
        if bool((last < other).all()):
            prefix = int(last.max()) + 1 - (s - t)
            rest = rest & ~pre
            lead = int(((q_cls == PREFIX) | (q_cls == PAD)).long().cumprod(1).sum(1).min())
    if not rest.any():
        return Plan(layouts, None, prefix, lead)
    return Plan(layouts, _columns(rest, ok, ok.shape[2]), prefix, lead)
