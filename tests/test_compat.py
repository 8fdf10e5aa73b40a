"""models/compat.py's grouped sdpa (transformers 5.19's sdpa copies the keys and values to every query head at each
decode step, 5.24 packs the query; every release copies them under a mask): the packed single query gives the
grouped-query attention of the unpacked definition, head by head, on every mask shape a decode step meets; masked
multi-token calls on CPU give the stock function's output bit for bit, without its copies; every other call is
passed to the stock function untouched; packing is added exactly where the installed release lacks it."""

from __future__ import annotations

import types

import pytest
import torch

from posbias.models.compat import grouped_sdpa, install_grouped_sdpa

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
    out, _ = grouped_sdpa(_stock(), _never)(module, q, k, v, visible)
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
    f = grouped_sdpa(stock, _never)
    k = torch.zeros(1, 2, 5, 4)
    f(module, torch.zeros(1, 6, 2, 4), k, k, None)  # two query tokens
    f(module, torch.zeros(1, 6, 1, 4), k, k, None, position_bias=torch.zeros(1, 6, 1, 5))  # a position bias
    grouped_sdpa(stock, lambda *_: True)(module, torch.zeros(1, 6, 1, 4), k, k, None)  # SDPA groups the heads itself
    f(types.SimpleNamespace(num_key_value_groups=1), torch.zeros(1, 2, 1, 4), k, k, None)  # no grouping
    assert [c[0][2] for c in calls] == [2, 1, 1, 1] and all(c[1] is None for c in calls)
    f(module, torch.zeros(1, 6, 1, 4), k, k, None)  # a packed call: three queries per KV head, never causal
    assert calls[-1] == (torch.Size([1, 2, 3, 4]), False)
    grouped_sdpa(stock, _never, pack=False)(module, torch.zeros(1, 6, 1, 4), k, k, None)  # the release packs itself
    assert calls[-1] == (torch.Size([1, 6, 1, 4]), None)
    mask = torch.ones(1, 1, 2, 5, dtype=torch.bool)
    f(module, torch.zeros(1, 6, 2, 4), k, k, mask)  # masked, but with a gradient (training): stock
    assert calls[-1] == (torch.Size([1, 6, 2, 4]), None)


def test_installed_once_packing_only_where_the_release_lacks_it():
    from transformers.integrations import sdpa_attention as sdpa
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    record = install_grouped_sdpa()
    registered = ALL_ATTENTION_FUNCTIONS.get("sdpa")
    assert registered.__wrapped__ is sdpa.sdpa_attention_forward
    assert record["sdpa_one_query"].endswith("(backport)") == (not hasattr(sdpa, "pack_gqa"))
    assert record["sdpa_masked_queries"] == "enable_gqa on CPU"
    assert install_grouped_sdpa() == record and ALL_ATTENTION_FUNCTIONS.get("sdpa") is registered  # idempotent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_rep,d", [(3, 64), (4, 256)])  # SmolLM2's grouping and head size; Gemma-3's
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_masked_queries_on_cpu_are_the_stock_result_bit_for_bit(dtype, n_rep, d, mask_kind):
    """The shared path's branch forwards: several queries over cached columns, some hidden; SDPA grouping the heads
    itself gives exactly what stock gives on copied keys (verdicts cannot move), and stock's copy is not made."""
    from transformers.integrations import sdpa_attention as sdpa

    torch.manual_seed(1)
    b, hkv, q_len, cols = 2, 2, 37, 300
    q = torch.randn(b, hkv * n_rep, q_len, d, dtype=dtype)
    k, v = torch.randn(b, hkv, cols, d, dtype=dtype), torch.randn(b, hkv, cols, d, dtype=dtype)
    visible = torch.rand(b, 1, q_len, cols) > 0.3
    visible[..., -1] = True
    additive = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    mask = visible if mask_kind == "bool" else additive
    module = types.SimpleNamespace(num_key_value_groups=n_rep, is_causal=True, training=False)
    stock = sdpa.sdpa_attention_forward
    copies = []

    def counting(module, query, key, value, mask, *args, **kwargs):
        copies.append(1)
        return stock(module, query, key, value, mask, *args, **kwargs)

    with torch.inference_mode():
        want, _ = stock(module, q, k, v, mask, dropout=0.0, scaling=d ** -0.5)
        got, _ = grouped_sdpa(counting, sdpa.use_gqa_in_sdpa)(module, q, k, v, mask, dropout=0.0, scaling=d ** -0.5)
    assert not copies  # SDPA grouped the heads: stock (and its repeat_kv) was not called
    assert got.shape == want.shape and torch.equal(got, want)
    with torch.enable_grad():  # a gradient (training): stock, untouched
        grouped_sdpa(counting, sdpa.use_gqa_in_sdpa)(module, q, k, v, mask, dropout=0.0)
    assert copies == [1]
