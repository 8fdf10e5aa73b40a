"""PINE's attention (models/pine.py) on random q, k, v: the batched computation equals the paper's loop as written,
and the outputs do not depend on the documents' order for pine, reversed and PCW, while they do for the fixed
positions and NIA (the paper's ablations); a test that fails when either component is removed."""

from __future__ import annotations

import sys

import pytest
import torch

from posbias.models import pine as pine_module
from posbias.models.pine import INVARIANT, VARIANTS, Segments, attend
from posbias.models.pine_plan import PAD, PREFIX, SUFFIX
from posbias.models.pine_reference import reference
from posbias.models.rope import rotation

pytestmark = pytest.mark.usefixtures("one_thread")

LENS = (4, 2, 5)  # three documents between a prefix of 3 and a suffix of 3 tokens
PRE, SUF, D, HQ, HK = 3, 3, 8, 4, 2


@pytest.fixture(params=[(1, 512, True, True), (3, 512, False, True), (100, 0, True, False), (100, 10 ** 9, False, True)],
                ids=["all-by-layout", "long-by-layout", "all-by-class", "all-by-class-dense"])
def layout_min(request, monkeypatch):
    """Every path of `attend`: whole documents by layout (their keys rotated once per document, fused SDPA), the
    queries by class over key blocks (each query rotated once per token class), and by class over the keys in
    column order (decoding's few queries). 3 sends the documents of 4 and 5 tokens by layout and the one of 2 by
    class, in one forward. The importance by fused SDPA in two of them, by the softmax in memory in the other two.
    The prefix's queries by themselves (one fused causal SDPA) in three, by class in the third."""
    monkeypatch.setattr(pine_module, "LAYOUT_MIN", request.param[0])
    monkeypatch.setattr(pine_module, "DENSE", request.param[1])
    monkeypatch.setattr(pine_module, "FUSED", request.param[2])
    monkeypatch.setattr(pine_module, "PREFIX_ALONE", request.param[3])
    monkeypatch.setattr(pine_module, "LAYOUT_COST", False)  # by layout wherever LAYOUT_MIN says
    return request.param


def _layout(order, pad: int = 0):
    """cls, pos and, per column, the (kind, index) of the token it holds: documents in `order`."""
    cls, src = [PAD] * pad, [("pad", k) for k in range(pad)]
    cls += [PREFIX] * PRE
    src += [("pre", k) for k in range(PRE)]
    for slot, d in enumerate(order):
        cls += [slot] * LENS[d]
        src += [(f"doc{d}", k) for k in range(LENS[d])]
    cls += [SUFFIX] * SUF
    src += [("suf", k) for k in range(SUF)]
    pos = [0] * pad + list(range(len(cls) - pad))
    return torch.tensor([cls]), torch.tensor([pos]), src


def _tokens(seed: int = 0):
    """q, k, v per token (kind, index), the same whatever the order."""
    g = torch.Generator().manual_seed(seed)
    names = [("pre", k) for k in range(PRE)] + [(f"doc{d}", k) for d in range(3) for k in range(LENS[d])]
    names += [("suf", k) for k in range(SUF)] + [("pad", k) for k in range(4)]
    return {nm: (torch.randn(HQ, D, generator=g), torch.randn(HK, D, generator=g), torch.randn(HK, D, generator=g))
            for nm in names}


def _run(order, fn, variant, toks, pad: int = 0, window=None, t: int | None = None, ids: bool = False):
    cls, pos, src = _layout(order, pad)
    q = torch.stack([toks[s][0] for s in src], 1)[None]  # [1, HQ, S, D]
    k = torch.stack([toks[s][1] for s in src], 1)[None]
    v = torch.stack([toks[s][2] for s in src], 1)[None]
    t = t or q.shape[2]
    names = sorted(toks)  # a token id per (kind, index): the same token whatever the order
    seg = Segments(cls, pos, 3, torch.tensor([[names.index(s) for s in src]]) if ids else None)
    rot = rotation(1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))
    out = fn(q[:, :, -t:], k, v, seg, rot, D ** -0.5, variant, window)
    return {s: out[0, :, i] for i, s in enumerate(src[-t:]) if s[0] != "pad"}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("window", [None, 6])
def test_the_batched_attention_is_the_papers_loop(variant, window, layout_min):
    toks = _tokens(1)
    for order, pad in (((0, 1, 2), 0), ((2, 0, 1), 2)):
        slow = _run(order, reference, variant, toks, pad, window)
        for ids in (False, True):  # in the given column order, and in the canonical one
            fast = _run(order, attend, variant, toks, pad, window, ids=ids)
            for name in slow:
                torch.testing.assert_close(fast[name].float(), slow[name], atol=2e-5, rtol=1e-4, msg=f"{variant} {name}")


def test_decoding_one_token_against_the_cache_is_the_full_forwards_last_row(layout_min):
    toks = _tokens(2)
    full = _run((1, 2, 0), attend, "pine", toks)
    last = _run((1, 2, 0), attend, "pine", toks, t=1)
    torch.testing.assert_close(last[("suf", SUF - 1)], full[("suf", SUF - 1)], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_outputs_do_not_depend_on_the_documents_order_exactly_where_the_paper_says(variant, layout_min):
    """pine, reversed and PCW: every token's output the same under all six orders; fixed positions and NIA: the
    suffix's output moves (RoPE sees the documents' order). With the reassignment or the bidirectional mask removed
    (the variants fixed and nia), the check fails: it can fail for the reason it names."""
    toks = _tokens(3)
    runs = [_run(order, attend, variant, toks) for order in ((0, 1, 2), (2, 1, 0), (1, 0, 2), (1, 2, 0))]
    worst = max(float((r[name] - runs[0][name]).abs().max()) for r in runs[1:] for name in runs[0])
    if INVARIANT[variant]:
        assert worst < 1e-5, (variant, worst)
    else:
        assert worst > 1e-3, (variant, worst)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if INVARIANT[v]])
def test_with_the_token_ids_the_outputs_agree_to_the_bit(variant, layout_min, monkeypatch):
    """Given the token ids, an invariant variant computes in the canonical column order: every token's output is
    the same to the bit under every order (test_the_batched_attention_is_the_papers_loop holds it to the loop with
    the ids too). The case that needs it: documents 0 and 2
    have the same queries and keys (so every importance ties between them) and different values; without the ids
    the tie falls by slot, the two swap places with the order, and the outputs move (on a real model a near-tie to
    the sixth digit fell by the summation order's rounding the same way: SmolLM2's kv-lookup rows 0.046 nats
    apart)."""
    monkeypatch.setattr(sys.modules[__name__], "LENS", (4, 2, 4))
    toks = _tokens(4)
    for i in range(4):
        toks[("doc2", i)] = (toks[("doc0", i)][0], toks[("doc0", i)][1], toks[("doc2", i)][2])
    orders = ((0, 1, 2), (2, 1, 0), (1, 0, 2), (1, 2, 0))
    runs = [_run(order, attend, variant, toks, 2, 6, ids=True) for order in orders]
    assert all(torch.equal(r[name], runs[0][name]) for r in runs[1:] for name in runs[0]), variant
    if variant != "pcw":  # PCW ranks nothing: no tie to fall
        loose = [_run(order, attend, variant, toks, 2, 6) for order in orders]
        assert max(float((r[name] - loose[0][name]).abs().max()) for r in loose[1:] for name in loose[0]) > 1e-3
