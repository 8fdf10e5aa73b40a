"""models/compat.py's backport of single-query GQA packing (transformers 5.19's sdpa copies the keys and values to
every query head at each decode step; 5.24 packs the query): the packed function gives the grouped-query attention
of the unpacked definition, head by head, on every mask shape a decode step meets; every other call is passed to
the stock function untouched; and the backport is in place exactly where the installed release lacks packing."""

from __future__ import annotations

import types

import pytest
import torch

from posbias.models.compat import backport_single_query_gqa, packed_sdpa

pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(q, k, v, mask, n_rep):
    """Attention by definition: each query head h reads KV head h // n_rep."""
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def _stock():
    from transformers.integrations import sdpa_attention as sdpa

    return sdpa.sdpa_attention_forward


def _never(*_):  # use_gqa: never let SDPA group the heads itself (the case the backport exists for: a mask given)
    return False


@pytest.mark.parametrize("n_rep", [3, 4])
@pytest.mark.parametrize("mask_kind", ["shared", "per_head"])
def test_packed_single_query_is_grouped_attention(n_rep, mask_kind):
    torch.manual_seed(0)
    b, hkv, d, cols = 3, 2, 16, 11
    h = hkv * n_rep
    q, k, v = torch.randn(b, h, 1, d), torch.randn(b, hkv, cols, d), torch.randn(b, hkv, cols, d)
    visible = torch.rand(b, 1 if mask_kind == "shared" else h, 1, cols) > 0.4
    visible[..., -1] = True  # the query's own column
    module = types.SimpleNamespace(num_key_value_groups=n_rep, is_causal=True, training=False)
    out, _ = packed_sdpa(_stock(), _never)(module, q, k, v, visible)
    assert out.shape == (b, 1, h, d)
    torch.testing.assert_close(out, _reference(q, k, v, visible, n_rep), rtol=1e-5, atol=1e-6)
    # a head read from the wrong KV group would differ: the check can see a mis-ordered packing
    wrong = _reference(q, k.flip(1), v.flip(1), visible, n_rep)
    assert not torch.allclose(out, wrong, atol=1e-3)


def test_other_calls_go_to_the_stock_function():
    calls = []

    def stock(module, query, key, value, mask, *args, **kwargs):
        calls.append((query.shape, kwargs.get("is_causal")))
        return query.transpose(1, 2), None

    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    f = packed_sdpa(stock, _never)
    k = torch.zeros(1, 2, 5, 4)
    f(module, torch.zeros(1, 6, 2, 4), k, k, None)  # two query tokens
    f(module, torch.zeros(1, 6, 1, 4), k, k, None, position_bias=torch.zeros(1, 6, 1, 5))  # a position bias
    packed_sdpa(stock, lambda *_: True)(module, torch.zeros(1, 6, 1, 4), k, k, None)  # SDPA groups the heads itself
    f(types.SimpleNamespace(num_key_value_groups=1), torch.zeros(1, 2, 1, 4), k, k, None)  # no grouping
    assert [c[0][2] for c in calls] == [2, 1, 1, 1] and all(c[1] is None for c in calls)
    f(module, torch.zeros(1, 6, 1, 4), k, k, None)  # a packed call: three queries per KV head, never causal
    assert calls[-1] == (torch.Size([1, 2, 3, 4]), False)


def test_backport_only_where_the_release_lacks_packing():
    from transformers.integrations import sdpa_attention as sdpa
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    active = backport_single_query_gqa()
    assert active == (not hasattr(sdpa, "pack_gqa"))
    registered = ALL_ATTENTION_FUNCTIONS.get("sdpa")
    if active:
        assert registered.__wrapped__ is sdpa.sdpa_attention_forward
        assert backport_single_query_gqa() and ALL_ATTENTION_FUNCTIONS.get("sdpa") is registered  # idempotent
    else:
        assert registered is sdpa.sdpa_attention_forward
