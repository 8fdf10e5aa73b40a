"""Ms-PoE (per-KV-group multi-scale RoPE) on tiny random Llama/Qwen2/Mistral models (fp32, GQA 4 q / 2 kv heads)."""

import pytest
import torch

from conftest import ROPE_ARCHS, char_tokenizer, position_sensitive, random_seqs, same_weights_with_rope, tiny_model
from posbias.errors import PosbiasError
from posbias.models.mspoe import mspoe, outlier_scores, rank_groups, ratio_ladder
from posbias.scoring.encode import left_pad

VOCAB = len(char_tokenizer(chat=False))
PAD = 0
ALL = (0, 1)  # the tiny models have two layers; the default would skip both


# Per-query-head sharpening of each layer: random init gives near-uniform attention, where RoPE barely
# matters and every head scores 0 (a trivial, identity head ordering). Unequal sharpness gives heads with
# attention outliers, orderings that are not the identity and that differ between inputs.
HEAD_SHARPNESS = (torch.tensor([2.0, 2.0, 12.0, 12.0]), torch.tensor([12.0, 2.0, 6.0, 6.0]))




@pytest.fixture(scope="module", params=ROPE_ARCHS)
def model(request, one_thread):
    return position_sensitive(tiny_model(request.param, VOCAB), HEAD_SHARPNESS)




@torch.inference_mode()
def _logits(model, batch):
    return model(**batch, use_cache=False).logits




# ----------------------------------------------------------------------------- the math


def test_ratio_ladder_includes_both_ends():
    assert torch.allclose(ratio_ladder(1.2, 1.8, 4), torch.tensor([1.2, 1.4, 1.6, 1.8]))
    assert ratio_ladder(1.2, 1.8, 1).tolist() == [pytest.approx(1.2)]


def test_rank_groups_is_the_inverse_permutation():
    # group means 0.1, 0.9, 0.5 -> ranked order [1, 2, 0] -> ranks [2, 0, 1] (the public code would use [1, 2, 0])
    scores = torch.tensor([[0.1, 0.1, 0.8, 1.0, 0.5, 0.5]])
    assert rank_groups(scores, 2).tolist() == [[2, 0, 1]]
    assert rank_groups(torch.zeros(1, 4), 2).tolist() == [[0, 1]]  # ties: lower group index first


def test_outlier_scores_count_sharp_heads():
    s, d = 8, 8
    k = torch.eye(s, d)[None, None] * 10.0  # one KV head, key j points along axis j
    q = torch.stack([torch.eye(d)[3] * 10.0, torch.zeros(d)])[None]  # head 0 sharp on key 3, head 1 uniform
    valid = torch.ones(1, s, dtype=torch.bool)
    assert outlier_scores(q, k, valid, 1.0).tolist() == [[1 / 8, 0.0]]
    valid[0, :4] = False  # key 3 masked out: head 0 now uniform over 4 keys
    assert outlier_scores(q, k, valid, 1.0).tolist() == [[0.0, 0.0]]


# ----------------------------------------------------------------------------- the model


def test_unit_ratios_are_bit_identical(model):
    batch = left_pad(random_seqs([9, 6, 12], VOCAB), PAD)
    base = _logits(model, batch)
    with mspoe(model, 1.0, 1.0, layers=ALL):
        same = _logits(model, batch)
    with mspoe(model, 1.2, 1.8, layers=ALL):
        moved = _logits(model, batch)
    assert torch.equal(base, same)
    assert not torch.allclose(base, moved, atol=1e-3)


def test_uniform_ratio_is_linear_interpolation(model):
    r = 1.5
    batch = left_pad(random_seqs([9, 6, 12], VOCAB), PAD)
    theta = model.config.rope_parameters["rope_theta"]
    pi = _logits(same_weights_with_rope(model, rope_type="linear", factor=r, rope_theta=theta), batch)
    with mspoe(model, r, r, layers=ALL):
        ours = _logits(model, batch)
    real = batch["attention_mask"].bool()
    assert torch.allclose(ours[real], pi[real], atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_generation_with_cache_matches_teacher_forcing(model):
    prompts = left_pad(random_seqs([10, 7, 13], seed=1, vocab=VOCAB), PAD)
    b, width, n = len(prompts["input_ids"]), prompts["input_ids"].shape[1], 6
    with mspoe(model, 1.2, 1.8, layers=ALL) as ms:
        gen = model.generate(
            input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"], max_new_tokens=n,
            min_new_tokens=n, do_sample=False, pad_token_id=PAD, output_logits=True, return_dict_in_generate=True,
        )
        ranks = {i: ms.ranks(i).clone() for i in ALL}
        assert any((ranks[i] != torch.arange(2)).any() for i in ALL)  # a non-trivial ordering is under test
        mask = torch.cat([prompts["attention_mask"], torch.ones(b, n, dtype=torch.long)], dim=1)
        ms.order_query = torch.full((b,), width - 1)  # rank heads on the last prompt token, as generate did
        full = model(
            input_ids=gen.sequences, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=False
        ).logits
        assert all(torch.equal(ranks[i], ms.ranks(i)) for i in ALL)
    forced = full[:, width - 1 : width - 1 + n]
    assert torch.allclose(forced, torch.stack(gen.logits, dim=1), atol=1e-4, rtol=1e-4)
    assert torch.equal(forced.argmax(-1), gen.sequences[:, width:])


def test_gqa_groups_share_one_ratio_and_keep_relative_positions(model):
    batch = left_pad(random_seqs([12, 9], seed=2, vocab=VOCAB), PAD)
    shifted = {**batch, "position_ids": batch["position_ids"] + 5}
    with mspoe(model, 1.2, 1.8, layers=ALL) as ms:
        out = _logits(model, batch)
        for i in ALL:
            ratios, scores, ranks = ms.head_ratios(i), ms.scores(i), ms.ranks(i)
            assert ratios.shape == scores.shape == (2, 4) and ranks.shape == (2, 2)
            assert torch.equal(ratios[:, 0], ratios[:, 1]) and torch.equal(ratios[:, 2], ratios[:, 3])
            assert sorted(ratios[0, ::2].tolist()) == pytest.approx([1.2, 1.8])
            top = scores.view(2, 2, 2).mean(-1).argmax(-1)  # the most position-aware group ...
            assert torch.allclose(ratios.view(2, 2, 2)[torch.arange(2), top, 0], torch.tensor(1.2))  # ... gets min_ratio
        moved = _logits(model, shifted)
    # Consistent q/k ratios per group: logits depend on (i - j) / r only, so a common shift changes nothing.
    real = batch["attention_mask"].bool()
    assert torch.allclose(out[real], moved[real], atol=1e-4, rtol=1e-4)


def test_left_padded_batch_equals_single_rows(model):
    seqs = random_seqs([11, 5, 8], seed=3, vocab=VOCAB)
    batch = left_pad(seqs, PAD)
    width = batch["input_ids"].shape[1]
    with mspoe(model, 1.2, 1.8, layers=ALL) as ms:
        out = _logits(model, batch)
        ranks = ms.ranks(1).clone()
        for r, s in enumerate(seqs):
            alone = _logits(model, left_pad([s], PAD))
            assert torch.allclose(out[r, width - len(s) :], alone[0], atol=1e-5, rtol=1e-5)
            assert torch.equal(ms.ranks(1)[0], ranks[r])


def test_eager_backend_reads_the_padding_mask_too(model):
    batch = left_pad(random_seqs([10, 4], seed=4, vocab=VOCAB), PAD)
    with mspoe(model, 1.2, 1.8, layers=ALL) as ms:
        sdpa, ranks = _logits(model, batch), ms.ranks(1).clone()
    model.set_attn_implementation("eager")
    try:
        with mspoe(model, 1.2, 1.8, layers=ALL) as ms:
            eager = _logits(model, batch)
            assert torch.equal(ms.ranks(1), ranks)
    finally:
        model.set_attn_implementation("sdpa")
    real = batch["attention_mask"].bool()
    assert torch.allclose(sdpa[real], eager[real], atol=1e-4, rtol=1e-4)


def test_model_is_restored_on_exit(model):
    batch = left_pad(random_seqs([8, 5], seed=5, vocab=VOCAB), PAD)
    base = _logits(model, batch)
    impl = model.config._attn_implementation
    with pytest.raises(RuntimeError):
        with mspoe(model, 1.2, 1.8, layers=ALL):
            _logits(model, batch)
            raise RuntimeError("inside")
    with mspoe(model, 1.2, 1.8, layers=[1]):
        with torch.inference_mode():
            model.generate(**{k: batch[k] for k in ("input_ids", "attention_mask")}, max_new_tokens=2, pad_token_id=PAD)
    assert model.config._attn_implementation == impl
    assert not any(layer.self_attn._forward_pre_hooks for layer in model.model.layers)
    assert torch.equal(_logits(model, batch), base)


def test_refuses_models_without_rope_and_bad_arguments(one_thread):
    gpt2 = tiny_model("gpt2", VOCAB)
    with pytest.raises(PosbiasError, match="RoPE"):
        with mspoe(gpt2):
            pass
    llama = tiny_model("llama", VOCAB)
    with pytest.raises(PosbiasError, match="no layers"):  # default skips the first two of two layers
        with mspoe(llama):
            pass
    with pytest.raises(PosbiasError):
        with mspoe(llama, 1.8, 1.2, layers=ALL):
            pass
    with mspoe(llama, layers=ALL):
        with pytest.raises(PosbiasError, match="already"):
            with mspoe(llama, layers=ALL):
                pass
    assert llama.config._attn_implementation == "sdpa"
