"""Per-layer RoPE scaling (LPES eq. 2) and Attention Buckets on tiny random Llama/Qwen2/Mistral models (fp32)."""

import pytest
import torch

from conftest import ROPE_ARCHS, char_tokenizer, position_sensitive, random_seqs, same_weights_with_rope, tiny_model
from posbias.errors import PosbiasError
from posbias.models.buckets import TOOLBENCH_BASES, attention_buckets, combine_bucket_logits, default_bases
from posbias.models.rope import layer_rope_scaling, rope_info, uniform_rope_scaling
from posbias.scoring.encode import Encoded, left_pad
from posbias.scoring.teacher_forced import score_teacher_forced

TOKENIZER = char_tokenizer(chat=False)
VOCAB = len(TOKENIZER)
PAD = 0




@pytest.fixture(scope="module", params=ROPE_ARCHS)
def model(request, one_thread):
    return position_sensitive(tiny_model(request.param, VOCAB))




@torch.inference_mode()
def _logits(model, seqs):
    """Left-padded batch with position_ids = cumsum(mask) - 1 -> logits (B, T, V)."""
    return model(**left_pad(seqs, PAD), use_cache=False).logits




def _no_hooks(model):
    attns = rope_info(model).attns
    return not model._forward_pre_hooks and not model._forward_hooks and not any(a._forward_pre_hooks for a in attns)


@torch.inference_mode()
def _greedy(model, prompts, n_new=6):
    """Greedy generation with the KV cache (no EOS stop) -> new tokens (B, n_new)."""
    batch = left_pad(prompts, PAD)
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=n_new,
                         min_new_tokens=n_new, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    return out[:, batch["input_ids"].shape[1]:]


def _agrees_with_teacher_forcing(model, prompts, new):
    """Score the generated tokens as answers: teacher-forced argmax must reproduce every one of them."""
    rows = [Encoded(None, p, [n.tolist()]) for p, n in zip(prompts, new)]
    return all(r["correct"] for r in score_teacher_forced(model, TOKENIZER, rows, PAD))


# -- rope_info and argument checks --------------------------------------------------------


def test_gpt2_has_no_rope(one_thread):
    gpt2 = tiny_model("gpt2", VOCAB)
    for call in (lambda: rope_info(gpt2), lambda: layer_rope_scaling(gpt2, [2.0, 2.0]).__enter__(),
                 lambda: attention_buckets(gpt2).__enter__()):
        with pytest.raises(PosbiasError, match="gpt2") as e:
            call()
        assert "self_attn" in e.value.fix and "Qwen2/3" in e.value.fix


def test_rope_info(model):
    info = rope_info(model)
    assert len(info.attns) == model.config.num_hidden_layers
    assert info.inv_freq.shape == (8,) and info.attention_scaling == 1.0 and info.rope_theta == 10000.0


def test_factor_checks(model):
    with pytest.raises(PosbiasError, match="one factor per decoder layer"):
        layer_rope_scaling(model, [2.0]).__enter__()
    with pytest.raises(PosbiasError, match="> 0"):
        layer_rope_scaling(model, [2.0, 0.0]).__enter__()
    with pytest.raises(PosbiasError, match="> 1"):
        attention_buckets(model, bases=[]).__enter__()
    assert _no_hooks(model)


# -- layer_rope_scaling ------------------------------------------------------------------


def test_all_ones_is_bit_identical(model):
    seqs = random_seqs([7, 11], VOCAB)
    base = _logits(model, seqs)
    with layer_rope_scaling(model, [1.0, 1.0]):
        assert torch.equal(_logits(model, seqs), base)


def test_uniform_factor_is_linear_rope(model):
    seqs = random_seqs([9, 30], VOCAB)
    linear = same_weights_with_rope(model, rope_type="linear", factor=2.5, rope_theta=10000.0)
    want = _logits(linear, seqs)
    with uniform_rope_scaling(model, 2.5):
        got = _logits(model, seqs)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_logits(model, seqs), want, atol=1e-3)  # the scaling matters


def test_left_padding_matches_single_rows(model):
    seqs = random_seqs([5, 9, 13], seed=1, vocab=VOCAB)
    with layer_rope_scaling(model, [2.0, 0.5]):
        batch = _logits(model, seqs)
        for i, s in enumerate(seqs):
            assert torch.allclose(batch[i, -len(s):], _logits(model, [s])[0], atol=1e-5)


def test_generation_with_cache_agrees_with_teacher_forcing(model):
    prompts = random_seqs([6, 10, 3], seed=2, vocab=VOCAB)
    with layer_rope_scaling(model, [0.5, 4.0]):
        new = _greedy(model, prompts)
        assert _agrees_with_teacher_forcing(model, prompts, new)
    assert not torch.equal(new, _greedy(model, prompts))  # the scaling changes what is generated


def test_tables_grow_past_max_positions(model):
    seqs = random_seqs([20], seed=3, vocab=VOCAB)
    with layer_rope_scaling(model, [3.0, 1.5]):
        want = _logits(model, seqs)
    with layer_rope_scaling(model, [3.0, 1.5], max_positions=4):
        assert torch.allclose(_logits(model, seqs), want, atol=1e-6)


def test_model_restored_after_exit(model):
    seqs = random_seqs([8, 12], seed=4, vocab=VOCAB)
    before = _logits(model, seqs)
    with pytest.raises(RuntimeError, match="boom"):
        with layer_rope_scaling(model, [2.0, 3.0]):
            assert not torch.allclose(_logits(model, seqs), before, atol=1e-3)
            raise RuntimeError("boom")
    assert _no_hooks(model) and not hasattr(model, "_posbias_rope_active")
    assert torch.equal(_logits(model, seqs), before)


def test_rope_modifications_do_not_stack(model):
    with attention_buckets(model, bases=[10000.0, 20000.0]):
        with pytest.raises(PosbiasError, match="already active"):
            layer_rope_scaling(model, [2.0, 2.0]).__enter__()
    assert _no_hooks(model)


# -- attention_buckets --------------------------------------------------------------------


def test_combine_rule():
    a = torch.tensor([[[0.0, 2.0, 1.0]]])  # copy 0, max 2
    b = torch.tensor([[[3.0, 0.0, 0.0]]])  # copy 1, max 3
    w = torch.softmax(torch.tensor([2.0, 3.0]), 0)
    assert torch.allclose(combine_bucket_logits(torch.cat([a, b]), 2), w[0] * a + w[1] * b)
    assert torch.equal(combine_bucket_logits(a, 1), a)


def test_default_bases_follow_the_original(model):
    assert default_bases(model) == TOOLBENCH_BASES  # tiny models have rope_theta 1e4, like Llama-2


def test_own_base_reduces_to_baseline(model):
    seqs = random_seqs([7, 12], seed=5, vocab=VOCAB)
    base = _logits(model, seqs)
    with attention_buckets(model, bases=[10000.0]):
        assert torch.equal(_logits(model, seqs), base)
    with attention_buckets(model, bases=[10000.0, 10000.0]):
        assert torch.allclose(_logits(model, seqs), base, atol=1e-6)


def test_copies_use_their_own_base(model):
    seqs = random_seqs([6, 15], seed=6, vocab=VOCAB)
    other = same_weights_with_rope(model, rope_type="default", rope_theta=30000.0)
    l_own, l_other = _logits(model, seqs), _logits(other, seqs)
    with attention_buckets(model, bases=[30000.0]):
        assert torch.allclose(_logits(model, seqs), l_other, atol=1e-5)
    with attention_buckets(model, bases=[10000.0, 30000.0]):
        got = _logits(model, seqs)
    assert got.shape == l_own.shape
    assert torch.allclose(got, combine_bucket_logits(torch.cat([l_own, l_other]), 2), atol=1e-5)


def test_buckets_left_padding_matches_single_rows(model):
    seqs = random_seqs([4, 11, 8], seed=7, vocab=VOCAB)
    with attention_buckets(model, bases=[10000.0, 18000.0, 25000.0]):
        batch = _logits(model, seqs)
        for i, s in enumerate(seqs):
            assert torch.allclose(batch[i, -len(s):], _logits(model, [s])[0], atol=1e-5)


def test_buckets_generation_agrees_with_teacher_forcing(model):
    prompts = random_seqs([5, 9], seed=8, vocab=VOCAB)
    with attention_buckets(model, bases=[10000.0, 17500.0, 25000.0]):
        new = _greedy(model, prompts)
        assert new.shape == (2, 6)
        assert _agrees_with_teacher_forcing(model, prompts, new)


def test_buckets_restore_the_model(model):
    seqs = random_seqs([9, 5], seed=9, vocab=VOCAB)
    before = _logits(model, seqs)
    with attention_buckets(model):
        _logits(model, seqs)
    assert _no_hooks(model) and not hasattr(model, "_posbias_rope_active")
    assert torch.equal(_logits(model, seqs), before)
