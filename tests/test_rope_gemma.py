"""The RoPE methods on a Gemma-3-shaped model: one rotary table per layer type (sliding layers theta 1e4,
global layers theta 1e6), each layer rotated with its own type's table (tiny random model, fp32)."""

import pytest
import torch

from conftest import char_tokenizer, position_sensitive, random_seqs, same_weights_with_rope, tiny_model
from posbias.models.buckets import attention_buckets, base_inv_freq, kind_bases
from posbias.models.rope import layer_rope_scaling, rope_info
from posbias.scoring.encode import left_pad

VOCAB = len(char_tokenizer(chat=False))
SEQS = random_seqs([30, 22, 27], VOCAB, seed=3)


@pytest.fixture(scope="module")
def gemma(one_thread):
    return position_sensitive(tiny_model("gemma3", VOCAB, layers=3))


@torch.inference_mode()
def _logits(model, seqs=SEQS):
    return model(**left_pad(seqs, 0), use_cache=False).logits


def _linear(model, factor: float):
    """The same weights with transformers' own linear RoPE scaling on both layer types."""
    return same_weights_with_rope(model, **{
        "sliding_attention": {"rope_type": "linear", "factor": factor, "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": factor, "rope_theta": 1000000.0}})


def test_rope_info_reads_both_kinds(gemma):
    info = rope_info(gemma)
    assert [k.name for k in info.kinds] == ["full_attention", "sliding_attention"]
    assert info.layer_kinds == [1, 1, 0] and info.rope_theta == 1e6  # the main kind is the global one
    want = 1.0 / (1e4 ** (torch.arange(0, 16, 2).float() / 16))  # theta 1e4, head_dim 16
    assert torch.allclose(info.kinds[1].inv_freq, want)


def test_ones_are_bit_identical_and_uniform_factor_is_linear_rope(gemma):
    base = _logits(gemma)
    with layer_rope_scaling(gemma, [1.0, 1.0, 1.0]):
        assert torch.equal(_logits(gemma), base)
    with layer_rope_scaling(gemma, [2.5] * 3):
        ours = _logits(gemma)
    assert torch.allclose(ours, _logits(_linear(gemma, 2.5)), atol=1e-5)
    assert not torch.allclose(ours, base, atol=1e-3)  # the scaling does something on this model
    assert torch.equal(_logits(gemma), base)  # restored


def test_a_factor_on_the_global_layer_only_touches_that_layer(gemma):
    """Scaling only layer 2 (global) equals a model whose global kind alone is linear-scaled."""
    mixed = same_weights_with_rope(gemma, **{
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 3.0, "rope_theta": 1000000.0}})
    with layer_rope_scaling(gemma, [1.0, 1.0, 3.0]):
        ours = _logits(gemma)
    assert torch.allclose(ours, _logits(mixed), atol=1e-5)


def test_buckets_scale_each_kind_by_its_own_base(gemma):
    info = rope_info(gemma)
    per = kind_bases(info, (1e6, 2e6))
    assert per == [(1e6, 2e6), (1e4, 2e4)]  # global as given; sliding keeps the same ratios to its 1e4
    want = 1.0 / (2e4 ** (torch.arange(0, 16, 2).float() / 16))
    assert torch.allclose(base_inv_freq(gemma, info, 2e4, kind=1), want)


def test_one_bucket_at_other_bases_equals_that_model(gemma):
    """A single bucket with base 4e6 on the global kind (sliding: 4e4) is the model with those thetas."""
    other = same_weights_with_rope(gemma, **{
        "sliding_attention": {"rope_type": "default", "rope_theta": 40000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 4000000.0}})
    with attention_buckets(gemma, bases=(4e6,)):
        ours = _logits(gemma)
    assert torch.allclose(ours, _logits(other).float(), atol=1e-4)
