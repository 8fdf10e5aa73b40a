"""PINE's bookkeeping (models/pine.py has the attention): the token classes, the keys gathered class by class into
blocks, and which queries go by layout and which by class. Made once per forward and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

PREFIX, SUFFIX, PAD = -1, -2, -3  # token classes besides the documents 0..n-1


def class_index(cls: torch.Tensor, n: int) -> torch.Tensor:
    """Each key's class as an index into the n + 2 shifts (documents, prefix, suffix; padding as prefix)."""
    return torch.where(cls >= 0, cls, torch.where(cls == SUFFIX, n + 1, n))


@dataclass(frozen=True)
class Blocks:
    """The key columns gathered class by class into padded blocks (classes grouped by length, the next power of two,
    so a one-token separator is not padded to a document's length). groups: [(class indices [C_g], width, offset)],
    group g's classes at columns offset .. offset + C_g * width of the blocked layout; flat [B, S]: each column's
    place there; src [B, K]: the column each place holds (-1: padding); cls [K]: each place's class; pos [B, K]: its
    given position."""

    groups: list
    flat: torch.Tensor
    src: torch.Tensor
    cls: torch.Tensor
    pos: torch.Tensor

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
    bucket = torch.where(longest > 0, torch.ceil(torch.log2(longest.clamp(min=1).float())).long(), -1)
    groups, base, cls, offset = [], torch.zeros(c, dtype=torch.long, device=dev), [], 0
    for g in sorted(set(bucket.tolist()) - {-1}):
        members = torch.nonzero(bucket == g)[:, 0]
        width = int(longest[members].max())
        base[members] = offset + torch.arange(len(members), device=dev) * width
        groups.append((members, width, offset))
        cls.append(members.repeat_interleave(width))
        offset += len(members) * width
    flat = base[ci] + slot
    src = torch.full((b, offset), -1, dtype=torch.long, device=dev).scatter_(1, flat, torch.arange(s, device=dev)
                                                                              .expand(b, s))
    return Blocks(groups, flat, src, torch.cat(cls), pos.gather(1, src.clamp(min=0)))


@dataclass(frozen=True)
class Plan:
    """layouts: [(rows [P], cols [P, L], valid [P, L], mask [P, 1, L, K])], chunks of documents whose query columns
    go by layout (padded; shortest documents first, so a chunk's are of like length; the mask over the blocked
    keys); rest: (cols [B, T'], valid [B, T'], mask [B, T', S]) or None."""

    layouts: list
    rest: tuple | None


def plan(q_cls: torch.Tensor, n: int, per_chunk: int, ok: torch.Tensor, blocks: Callable, layout_min: int) -> Plan:
    """Which of the query columns (their classes q_cls [B, T]) go by layout: whole documents of layout_min tokens or
    more, in chunks of per_chunk documents; the rest go by class."""
    b, dev = q_cls.shape[0], q_cls.device
    counts = (q_cls[..., None] == torch.arange(n, device=dev)).sum(1)  # [B, n]
    big = counts >= layout_min
    pairs = sorted(torch.nonzero(big).tolist(), key=lambda rd: (int(counts[rd[0], rd[1]]), rd))
    layouts = []
    if pairs:
        bl = blocks()
        okb = ok.gather(2, bl.src.clamp(min=0)[:, None, :].expand(b, ok.shape[1], -1)) & (bl.src >= 0)[:, None]
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
    if not rest.any():
        return Plan(layouts, None)
    width = int(rest.sum(1).max())
    order = torch.argsort((~rest).to(torch.int8), dim=1, stable=True)[:, :width]  # each row's rest columns first
    valid = rest.gather(1, order)
    mask = ok.gather(1, order[..., None].expand(b, width, ok.shape[2])) | ~valid[..., None]  # over the columns
    return Plan(layouts, (order, valid, mask))
