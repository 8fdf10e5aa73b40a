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

Computation (`attend`), no Python loop over documents, tokens or layers, in four parts:

  prefix      the prefix's queries see only the prefix, at its given positions, in every variant: one fused SDPA
  importance  the token-level softmax summed per key document is an attention whose values are the documents'
              one-hot columns: one fused SDPA (no [T, S] matrix in memory)
  by layout   a whole document's query tokens share one layout (its importance is its document's), so the keys are
              rotated once per document at their re-assigned positions, as the paper's loop places them, and the
              document's queries attend to them in one fused SDPA; the keys, already rotated at their given
              positions and gathered class by class into blocks, move by R(delta_c) per class (one broadcast product)
  by class    every other query (suffix, decoded tokens, separators, short documents) has its own layout; RoPE
              makes a logit depend on the two positions only through their difference, so the query is rotated once per token
              class (pos_i' - delta_c(i)) against the keys at their given positions: over the key blocks, or for a
              few queries (decoding) against every key in column order, each key's logit taken from its class's row

The prefix, by layout and by class parts are in models/pine_paths.py.

PINE costs two non-causal attentions where the plain model has one causal one: about 4x the plain attention's
products, the floor of this computation (docs/mitigations.md, "PINE", has the measured cost). models/pine_reference.py
has the paper's loop as written (every query, every key placed at its re-assigned position and rotated there), for
the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .pine_paths import by_class, by_class_dense, by_layout, by_prefix
from .pine_plan import IDENTITY, SUFFIX, Blocks, Plan, allowed, blocks, canonical_order, class_index, plan, take
from .rope import Rotary

VARIANTS = ("pine", "reversed", "fixed", "causal", "nia", "pcw")
INVARIANT = {"pine": True, "reversed": True, "fixed": False, "causal": False, "nia": False, "pcw": True}
BLOCKED = ("nia", "pcw")  # no attention between documents
CAUSAL = ("causal",)  # the causal mask kept between documents
LAYOUT_MIN = 8  # a document of this many query tokens goes by layout (`by_layout`) ...
LAYOUT_COST = True  # ... and tokens x classes >= keys (the tests turn it off: LAYOUT_MIN alone decides)
LAYOUT_ELEMENTS = 1 << 24  # rotated key elements per chunk of documents: bounded memory
DENSE = 512  # query rows x classes up to which the rest go by `by_class_dense` (no key blocks)
PREFIX_ALONE = True  # the prefix's queries by one fused causal SDPA over the prefix (the tests turn it off)
FUSED = True  # the importance by fused SDPA where the documents fit the head size (the tests turn it off)


@dataclass(frozen=True)
class Segments:
    """The token classes of a batch. cls [B, S]: a document index, PREFIX, SUFFIX or PAD for every key column (the
    queries are the last T columns); pos [B, S]: each column's given position (position_ids); n: documents per row
    (a row with fewer has empty ones). What depends only on these (the mask, the key blocks, which queries go by
    layout) is made once and kept: the hook makes one Segments per forward, so every layer shares them."""

    cls: torch.Tensor
    pos: torch.Tensor
    n: int
    ids: torch.Tensor | None = None  # [B, S] token ids: given, an invariant variant computes in a canonical order
    _kept: dict = field(default_factory=dict, compare=False, repr=False)

    def _keep(self, key, make):
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    @property
    def onehot(self) -> torch.Tensor:
        """[B, S, n] float: column j belongs to document d."""
        return self._keep("onehot", lambda: (self.cls[..., None] == torch.arange(self.n, device=self.cls.device))
                          .float())

    def layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(length [B, n], given start position [B, n] (0 for an empty document), the documents' first position
        [B]): the layout every re-assignment starts from."""
        def make():
            oh = self.onehot
            length = oh.sum(1)
            big = torch.iinfo(torch.long).max
            start = torch.where(oh.bool(), self.pos[..., None], big).amin(1)
            start = torch.where(length > 0, start, 0)
            first = torch.where(length > 0, start, big).amin(1)
            return length, start, torch.where(first == big, 0, first)

        return self._keep("layout", make)

    def classes(self) -> torch.Tensor:
        """[B, S]: each column's class as an index into the n + 2 shifts (`pine_plan.class_index`)."""
        return self._keep("classes", lambda: class_index(self.cls, self.n))

    def starts(self) -> torch.Tensor:
        """[B, n + 2]: each class's first given position (documents, prefix, suffix; 0 for an empty one)."""
        def make():
            ci = self.classes()
            big = torch.iinfo(torch.long).max
            first = torch.full((ci.shape[0], self.n + 2), big, device=ci.device).scatter_reduce(
                1, ci, self.pos, "amin")
            return torch.where(first == big, 0, first)

        return self._keep("starts", make)

    def local(self) -> torch.Tensor:
        """[B, S]: each column's offset in its class (its given position minus its class's first)."""
        return self._keep("local", lambda: self.pos - self.starts().gather(1, self.classes()))

    def canonical(self, t: int):
        """(perm [B, S], the last t columns' perm [B, t], its inverse, the Segments in that order) or None: the
        columns in an order that does not depend on the documents' (padding, prefix, the documents by their token
        ids, suffix; each class's tokens in their order), the documents relabelled the same way."""
        def make():
            got = canonical_order(self.cls, self.ids, self.n, t)
            if got is None or got is IDENTITY:
                return got
            perm, cls = got
            q_perm = perm[:, -t:] - (perm.shape[1] - t)
            return perm, q_perm, torch.argsort(q_perm, dim=1), Segments(cls, self.pos.gather(1, perm), self.n,
                                                                        self.ids.gather(1, perm))

        return self._keep(("canonical", t), make)

    def allowed(self, t: int, variant: str) -> torch.Tensor:
        return self._keep(("allowed", t, variant), lambda: allowed(self.cls, t, variant in BLOCKED,
                                                                   variant in CAUSAL))

    def blocks(self) -> "Blocks":
        return self._keep("blocks", lambda: blocks(self.classes(), self.n + 2, self.pos))

    def plan(self, t: int, per_chunk: int, variant: str) -> "Plan":
        """Which of the last t query columns go by layout (whole documents of LAYOUT_MIN tokens or more, in chunks
        of per_chunk documents) and which by class (the rest)."""
        return self._keep(("plan", t, per_chunk, variant),
                          lambda: plan(self.cls[:, -t:], self.n, per_chunk, self.allowed(t, variant), self.blocks,
                                       LAYOUT_MIN, self.cls if PREFIX_ALONE else None, LAYOUT_COST))


def importance(q: torch.Tensor, k: torch.Tensor, seg: Segments, ok: torch.Tensor, scaling: float) -> torch.Tensor:
    """[B, H, T, n]: each query's importance of each document (module docstring), from un-rotated q [B, H, T, D]
    and k [B, Hk, S, D]. The token-level softmax summed per key document is an attention whose values are the
    documents' one-hot columns: with no more documents than the head size, one fused SDPA (no [T, S] matrix in
    memory) in the model's dtype with fp32 accumulation, the columns padded to the head size (the fused kernel wants
    values as wide as the keys); with more, the softmax in fp32 over chunks of queries times the one-hot matrix
    (one pass, where the fused kernel would need one per head size of documents)."""
    b, h, t, d = q.shape
    n, hk = seg.n, k.shape[1]
    col = torch.where(seg.cls >= 0, seg.cls, n)  # [B, S]: a document, or n for every other key
    if n <= d and FUSED:
        hot = seg._keep(("hot", d, hk, q.dtype), lambda: (col[..., None] == torch.arange(d, device=col.device))
                        .to(q.dtype)[:, None].expand(b, hk, -1, d).contiguous())  # [B, Hk, S, D]
        per_token = F.scaled_dot_product_attention(q, k, hot, attn_mask=ok[:, None], scale=scaling,
                                                   enable_gqa=hk != h)[..., :n].float()
    else:
        g, s = h // hk, k.shape[2]
        hot = seg.onehot[:, None, None]  # [B, 1, 1, S, n]
        qg = q.view(b, hk, g, t, d)
        step = max(1, (1 << 24) // max(1, b * h * s))
        per_token = torch.cat([torch.matmul(torch.softmax(
            (torch.matmul(qg[:, :, :, z], k[:, :, None].transpose(-1, -2)).float() * scaling).masked_fill(
                ~ok[:, None, None, z], -math.inf), dim=-1), hot) for z in
            (slice(a, a + step) for a in range(0, t, step))], 3).view(b, h, t, n)
    per_token = per_token / seg.layout()[0].clamp(min=1)[:, None, None, :]  # [B, H, T, n]
    q_cls = seg.cls[:, -t:]
    if not bool((q_cls >= 0).any()):  # no document among the queries (decoding): token to document
        return per_token
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
        key = -imp if variant == "reversed" else imp
        if bool((q_cls >= 0).any()):  # a document query: its own document last
            key = key.masked_fill((q_cls[:, None, :, None] == torch.arange(n, device=dev)).expand_as(key), math.inf)
        order = torch.argsort(key, dim=-1, stable=True)  # ties: the lower index first
        lens = length[:, None, None, :].expand_as(key).gather(-1, order)
        starts = first[:, None, None, None] + (lens.cumsum(-1) - lens).long()
        new = torch.zeros_like(order).scatter_(-1, order, starts)  # [B, H, T, n]
        delta[..., :n] = new - start[:, None, None, :]
    own_cls = torch.where(q_cls >= 0, q_cls, torch.where(q_cls == SUFFIX, n + 1, n))  # [B, T]
    shift = delta.gather(3, own_cls[:, None, :, None].expand(b, delta.shape[1], t, 1))[..., 0]
    return delta, shift


def attend(q, k, v, seg: Segments, rotate: Rotary, scaling: float, variant: str = "pine",
           window: int | None = None, k_local: torch.Tensor | None = None) -> torch.Tensor:
    """`_attend`, and for an invariant variant whose Segments carry the token ids, in the canonical column order
    (`Segments.canonical`): every sum over keys then runs in the same order whatever the documents' order, so the
    outputs agree to the bit, not to float tolerance. Without it a near-tie in the importance (two documents a head
    reads alike, to the sixth digit) was broken by the summation order's rounding, and a sweep's rows moved with the
    slot (SmolLM2 kv-lookup, fp32: two slots of ten 0.046 nats apart)."""
    canon = seg.canonical(q.shape[2]) if seg.ids is not None and INVARIANT[variant] else None
    if canon is None or canon is IDENTITY:
        return _attend(q, k, v, seg, rotate, scaling, variant, window, k_local)
    perm, q_perm, back, cseg = canon
    out = _attend(take(q, q_perm), take(k, perm), take(v, perm), cseg, rotate, scaling, variant, window,
                  None if k_local is None else take(k_local, perm))
    return take(out, back)


def _attend(q, k, v, seg: Segments, rotate: Rotary, scaling: float, variant: str = "pine",
            window: int | None = None, k_local: torch.Tensor | None = None) -> torch.Tensor:
    """PINE attention for the last T columns: q [B, Hq, T, D], k and v [B, Hk, S, D] un-rotated (a cache's columns
    first); rotate: the layer's RoPE (`rotation`); -> [B, Hq, T, Dv] (module docstring). window: a sliding layer's
    window, on the re-assigned distances; k_local: k rotated at `seg.local()`, if the caller keeps it (a decoding
    cache). The keys are rotated at their offsets in their class (a document's at 0, 1, ...) and put in blocks class
    by class (`Blocks`); whole documents' queries then go by layout (`by_layout`), the rest by class (`by_class`,
    or `by_class_dense` for a few queries: decoding). Every rotation is at a position the re-assignment fixes
    whatever the documents' order (a key's offset in its document, a document's new start, a query's new position),
    never at a given position: in bf16 a rotation's rounding depends on its angle, so rotating at given positions
    and correcting by the shift made the rounding depend on the order (log-probabilities 0.6 nats apart on
    SmolLM2's kv-lookup)."""
    b, hq, t, d = q.shape
    s, n = k.shape[2], seg.n
    ok = seg.allowed(t, variant)
    plan = seg.plan(t, max(1, LAYOUT_ELEMENTS // (hq * s * d)), variant)
    lead = plan.lead  # the leading prefix and padding queries: nothing moves for them, no importance needed
    imp = importance(q[:, :, lead:], k, seg, ok[:, lead:], scaling) if variant in ("pine", "reversed", "causal") \
        else None
    delta, shift = shifts(imp, seg, t - lead, variant)  # [B, H', T - lead, C], [B, H', T - lead]
    if lead:
        delta = torch.cat([delta.new_zeros(*delta.shape[:2], lead, n + 2), delta], 2)
        shift = torch.cat([shift.new_zeros(*shift.shape[:2], lead), shift], 2)
    delta, shift = delta.expand(b, hq, t, n + 2), shift.expand(b, hq, t)
    q_pos = seg.pos[:, s - t:][:, None] + shift  # [B, H, T]: each query's re-assigned position
    k_local = rotate(k, seg.local()[:, None].expand(b, k.shape[1], s)) if k_local is None else k_local
    new = seg.starts()[:, None, None, :] + delta  # [B, H, T, C]: each class's new start, per query
    out = v.new_zeros(b, hq, t, v.shape[-1])
    if plan.prefix:
        by_prefix(q, k_local, v, seg, ok, q_pos, rotate, scaling, window, plan.prefix, out)
    if plan.rest is None and not plan.layouts:
        return out
    if not plan.layouts and plan.rest[0].shape[1] * (n + 2) * hq <= DENSE:  # a few queries (decoding): no blocks
        by_class_dense(q, k_local, v, seg, delta, new, q_pos, rotate, scaling, window, *plan.rest, out)
        return out
    bl = seg.blocks()
    kb, vb = bl.put(k_local), bl.put(v)  # [B, Hk, K, D]
    if plan.layouts:  # the keys a document's queries may see: those before the suffix's block
        kh, vq = Rotary.half(kb[:, :, :bl.seen]), vb[:, :, :bl.seen].repeat_interleave(hq // k.shape[1], 1)
        for chunk in plan.layouts:  # chunks of documents
            by_layout(q, kb, kh, vq, bl, delta, new, q_pos, rotate, scaling, window, *chunk, out)
    if plan.rest is not None:
        by_class(q, kb, vb, bl, delta, new, q_pos, rotate, scaling, window, *plan.rest, out)
    return out
