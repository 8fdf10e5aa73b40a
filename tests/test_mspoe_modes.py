"""Ms-PoE's per-query-head mode and Ms-PoE on Gemma-3 (two RoPE kinds, sliding-window layers, q/k norms), on tiny
random models (fp32). Expected values are built here directly with torch ops (RoPE from its formula, softmax
attention by hand), not through the code under test."""

import pytest
import torch

import posbias.models.mspoe as mspoe_module
from conftest import char_tokenizer, position_sensitive, random_seqs, same_weights_with_rope, tiny_model
from posbias.errors import PosbiasError
from posbias.methods import get_method
from posbias.models.mspoe import mspoe
from posbias.scoring.encode import left_pad

VOCAB = len(char_tokenizer(chat=False))
PAD = 0
SHARP = [torch.tensor([2.0, 12.0, 6.0, 1.0]), torch.tensor([12.0, 2.0, 6.0, 3.0]), torch.tensor([1.0, 6.0, 12.0, 2.0])]
FORCED = torch.tensor([0.1, 0.9, 0.5, 0.3])  # query-head scores -> per-head ranks 3, 0, 1, 2; group means 0.5, 0.4


def sharp(model, arch: str):
    """Heads with attention outliers (random init is near-uniform: every score 0, a trivial ordering). Gemma-3
    normalises q and k before RoPE, so scaling q_proj does nothing there: its q_norm / k_norm weights are raised."""
    if arch != "gemma3":
        return position_sensitive(model, SHARP[: len(model.model.layers)])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(2.0)  # Gemma's RMSNorm multiplies by (1 + weight): x3
            layer.self_attn.k_norm.weight.fill_(2.0)
            layer.self_attn.v_proj.weight.mul_(2.0)
    return model


@pytest.fixture(scope="module")
def gemma(one_thread):
    return sharp(tiny_model("gemma3", VOCAB, layers=3), "gemma3")


@pytest.fixture(scope="module")
def llama(one_thread):
    return sharp(tiny_model("llama", VOCAB, layers=2), "llama")


@torch.inference_mode()
def _logits(model, seqs):
    return model(**left_pad(seqs, PAD), use_cache=False).logits


# ----------------------------------------------------------------------------- the spec


def test_spec_modes_config_and_label():
    q, g = get_method("mspoe:query"), get_method("mspoe:1.2-1.8")
    assert (q.mode, q.min_ratio, q.max_ratio) == ("query", 1.2, 1.8) and g.mode == "group"
    assert get_method("mspoe:1-1.4:query").config() == {"name": "mspoe", "min_ratio": 1.0, "max_ratio": 1.4,
                                                        "layers": None, "mode": "query"}
    assert get_method("mspoe").config()["mode"] == "group"
    assert q.label == "mspoe:1.2-1.8:query" and g.label == "mspoe:1.2-1.8:group"
    assert get_method(q.label).config() == q.config()  # a label is a spec
    for bad in ("mspoe:fast", "mspoe:1.2-1.8:query:x", "mspoe:query:1.2-1.8"):
        with pytest.raises(PosbiasError, match="bad Ms-PoE spec"):
            get_method(bad)


# ----------------------------------------------------------------------------- hand-built attention


def _rope(x, pos, theta: float):
    """x [H, T, D] rotated at (fractional) positions pos [H, T]: RoPE from its formula."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[..., None] * inv  # [H, T, D/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


@torch.inference_mode()
def _by_hand(attn, h, ratios, theta: float, window: int | None = None):
    """self_attn output for one sequence h [T, E] with head h's q and k at positions t / ratios[h]."""
    hq, d = attn.config.num_attention_heads, attn.head_dim
    g = hq // attn.config.num_key_value_heads
    t = h.shape[0]
    q = attn.q_proj(h).view(t, hq, d).transpose(0, 1)  # [Hq, T, D]
    k = attn.k_proj(h).view(t, -1, d).transpose(0, 1).repeat_interleave(g, 0)  # [Hq, T, D], head i reads KV i // G
    v = attn.v_proj(h).view(t, -1, d).transpose(0, 1).repeat_interleave(g, 0)
    if hasattr(attn, "q_norm"):  # Gemma-3 normalises q and k before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    pos = torch.arange(t, dtype=torch.float32)[None] / ratios[:, None]  # [Hq, T]
    q, k = _rope(q, pos, theta), _rope(k, pos, theta)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None]
    allowed = (j <= i) & ((i - j < window) if window else True)
    logits = (q @ k.transpose(1, 2)) * attn.scaling
    out = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v  # [Hq, T, D]
    return attn.o_proj(out.transpose(0, 1).reshape(t, hq * d))


@torch.inference_mode()
def _layer_io(model, ids, layer: int, **kw):
    """(input hidden states [T, E], output [T, E]) of one self_attn on one sequence, under mspoe(**kw)."""
    seen = {}

    def grab(m, args, kwargs, out):
        seen["in"], seen["out"] = kwargs.get("hidden_states", args[0] if args else None)[0], out[0][0]

    hook = model.model.layers[layer].self_attn.register_forward_hook(grab, with_kwargs=True)
    try:
        with mspoe(model, **kw):
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        hook.remove()
    return seen["in"], seen["out"]


RATIOS = {"query": torch.tensor([1.8, 1.2, 1.4, 1.6]),  # linspace(1.2, 1.8, 4)[rank], ranks 3, 0, 1, 2
          "group": torch.tensor([1.2, 1.2, 1.8, 1.8])}  # groups (0.1, 0.9) and (0.5, 0.3): means 0.5 > 0.4


@pytest.mark.parametrize("mode", ["query", "group"])
def test_forced_ranking_matches_attention_by_hand_llama(llama, monkeypatch, mode):
    monkeypatch.setattr(mspoe_module, "outlier_scores", lambda q, *a: FORCED.expand(q.shape[0], -1).clone())
    ids = random_seqs([19], VOCAB, seed=7)[0]
    h, out = _layer_io(llama, ids, 1, min_ratio=1.2, max_ratio=1.8, layers=(0, 1), mode=mode)
    want = _by_hand(llama.model.layers[1].self_attn, h, RATIOS[mode], llama.config.rope_parameters["rope_theta"])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layer,theta,window", [(0, 1e4, 8), (2, 1e6, None)])  # a sliding layer, the global layer
def test_forced_ranking_matches_attention_by_hand_gemma(gemma, monkeypatch, layer, theta, window):
    monkeypatch.setattr(mspoe_module, "outlier_scores", lambda q, *a: FORCED.expand(q.shape[0], -1).clone())
    ids = random_seqs([21], VOCAB, seed=8)[0]  # longer than the window of 8
    h, out = _layer_io(gemma, ids, layer, min_ratio=1.2, max_ratio=1.8, layers=(0, 1, 2), mode="query")
    torch.testing.assert_close(out, _by_hand(gemma.model.layers[layer].self_attn, h, RATIOS["query"], theta, window),
                               atol=1e-5, rtol=1e-4)
    unscaled = _by_hand(gemma.model.layers[layer].self_attn, h, torch.ones(4), theta, window)
    assert not torch.allclose(out, unscaled, atol=1e-3)  # the ratios matter on this layer


# ----------------------------------------------------------------------------- the two modes


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_modes_are_identical_with_one_query_head_per_kv_head(arch, one_thread):
    layers = 3 if arch == "gemma3" else 2
    model = sharp(tiny_model(arch, VOCAB, layers=layers, kv_heads=4), arch)
    seqs = random_seqs([17, 12, 20], VOCAB, seed=9)
    with mspoe(model, 1.2, 1.8, layers=range(layers)) as ms:
        group, ranks = _logits(model, seqs), torch.stack([ms.ranks(i) for i in range(layers)])
    with mspoe(model, 1.2, 1.8, layers=range(layers), mode="query") as ms:
        query = _logits(model, seqs)
        assert torch.equal(torch.stack([ms.ranks(i) for i in range(layers)]), ranks)
    assert (ranks != torch.arange(4)).any()  # a non-trivial ordering is under test
    assert torch.equal(group, query)


def test_query_mode_gives_every_query_head_its_own_ratio(llama):
    with mspoe(llama, 1.2, 1.8, layers=(0, 1), mode="query") as ms:
        _logits(llama, random_seqs([15, 11], VOCAB, seed=10))
        for i in (0, 1):
            ratios, scores = ms.head_ratios(i), ms.scores(i)
            assert ms.ranks(i).shape == (2, 4)
            assert sorted(ratios[0].tolist()) == pytest.approx([1.2, 1.4, 1.6, 1.8])  # 4 distinct, not 2
            top = torch.sort(-scores, dim=-1, stable=True).indices[:, 0]
            assert torch.allclose(ratios[torch.arange(2), top], torch.tensor(1.2))  # most position-aware head


# ----------------------------------------------------------------------------- Gemma-3


@pytest.mark.parametrize("mode", ["group", "query"])
def test_gemma_unit_ratios_are_bit_identical(gemma, mode):
    seqs = random_seqs([26, 14, 22], VOCAB, seed=11)
    base = _logits(gemma, seqs)
    with mspoe(gemma, 1.0, 1.0, layers=(0, 1, 2), mode=mode):
        assert torch.equal(_logits(gemma, seqs), base)
    with mspoe(gemma, 1.2, 1.8, layers=(0, 1, 2), mode=mode):
        assert not torch.allclose(_logits(gemma, seqs), base, atol=1e-3)
    assert torch.equal(_logits(gemma, seqs), base)  # restored


def test_gemma_uniform_ratio_is_linear_rope_on_both_kinds(gemma):
    """Each layer scaled with its own kind's frequencies: one ratio everywhere equals transformers' linear RoPE
    scaling of both the sliding (theta 1e4) and the global (theta 1e6) tables."""
    linear = same_weights_with_rope(gemma, **{
        "sliding_attention": {"rope_type": "linear", "factor": 1.5, "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 1.5, "rope_theta": 1000000.0}})
    seqs = random_seqs([26, 14, 22], VOCAB, seed=12)
    batch = left_pad(seqs, PAD)
    with mspoe(gemma, 1.5, 1.5, layers=(0, 1, 2), mode="query"):
        ours = _logits(gemma, seqs)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], _logits(linear, seqs)[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["group", "query"])
def test_gemma_left_padded_batch_equals_single_rows(gemma, mode):
    seqs = random_seqs([24, 9, 17], VOCAB, seed=13)
    width = max(map(len, seqs))
    with mspoe(gemma, 1.2, 1.8, layers=(0, 1, 2), mode=mode) as ms:
        out, ranks = _logits(gemma, seqs), [ms.ranks(i).clone() for i in range(3)]
        assert any((r != torch.arange(r.shape[1])).any() for r in ranks)  # non-trivial orderings
        for r, s in enumerate(seqs):
            alone = _logits(gemma, [s])
            torch.testing.assert_close(out[r, width - len(s):], alone[0], atol=1e-5, rtol=1e-5)
            assert all(torch.equal(ms.ranks(i)[0], ranks[i][r]) for i in range(3))


@pytest.mark.parametrize("mode", ["group", "query"])
@torch.inference_mode()
def test_gemma_generation_with_cache_matches_teacher_forcing(gemma, mode):
    """Prefill + decode through Gemma-3's sliding-window cache (prompts longer than the window) equals one full
    forward ranked at the last prompt token."""
    prompts = left_pad(random_seqs([14, 10, 16], VOCAB, seed=14), PAD)
    b, width, n = len(prompts["input_ids"]), prompts["input_ids"].shape[1], 5
    with mspoe(gemma, 1.2, 1.8, layers=(0, 1, 2), mode=mode) as ms:
        gen = gemma.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"], max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=PAD, output_logits=True,
                             return_dict_in_generate=True)
        mask = torch.cat([prompts["attention_mask"], torch.ones(b, n, dtype=torch.long)], dim=1)
        ranks = [ms.ranks(i).clone() for i in range(3)]
        assert any((r != torch.arange(r.shape[1])).any() for r in ranks)  # non-trivial orderings
        ms.order_query = torch.full((b,), width - 1)
        full = gemma(input_ids=gen.sequences, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                     use_cache=False).logits
        assert all(torch.equal(ms.ranks(i), ranks[i]) for i in range(3))
    forced = full[:, width - 1: width - 1 + n]
    torch.testing.assert_close(forced, torch.stack(gen.logits, dim=1), atol=1e-4, rtol=1e-4)
