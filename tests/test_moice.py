"""MoICE (models/moice.py, methods/moice.py, mitigate/moice/): independent expected values on tiny models,
training, resume after a kill, bad input, and one short real-model check."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import posbias.mitigate.moice.train as train_mod
from conftest import char_tokenizer, dies_after, position_sensitive, random_seqs, same_weights_with_rope, tiny_loaded, tiny_model
from posbias import Loaded, PosbiasError, get_method
from posbias.core.losses import load_balancing_loss
from posbias.models.compat import cache_key, output_cache
from posbias.models.moice import PAPER_BASES, Routers, mix_experts, moice, rotate, routing_weights
from posbias.moice import TrainConfig, run_train
from posbias.scoring.encode import left_pad

pytestmark = pytest.mark.usefixtures("one_thread")
SEQS = random_seqs([20, 33, 41], 100, seed=3)
THETA = {"llama": 1e4, "qwen2": 1e4, "gemma3": 1e6}


def _model(arch: str, layers: int = 3):
    tok = char_tokenizer()
    return position_sensitive(tiny_model(arch, len(tok), layers=layers))


@torch.no_grad()
def _logits(model, seqs=SEQS):
    return model(**left_pad(seqs, 0), use_cache=False).logits


def _forced(model, bases, j: int) -> Routers:
    """Routers whose logits favour expert j for every token and head (top_k 1): one SwiGLU feature
    f = act(a) * a with a = q . u is > 0 for a != 0 (silu and gelu alike), and W2 maps it to +f for j, -f elsewhere."""
    r = Routers.for_model(model, bases, top_k=1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in (r.w1, r.w2, r.w3):
            w.zero_()
        u = torch.randn(r.w1.shape[:3], generator=g) * 0.05
        r.w1[..., 0], r.w3[..., 0] = u, u
        r.w2[:, :, 0, :] = -1.0
        r.w2[:, :, 0, j] = 1.0
    return r


def _with_theta(model, arch: str, base: float):
    """The same weights with rope_theta = base (Gemma-3: the global kind; the sliding kind scaled by 1e4 / 1e6)."""
    if arch != "gemma3":
        return same_weights_with_rope(model, rope_type="default", rope_theta=base)
    return same_weights_with_rope(model, **{"sliding_attention": {"rope_type": "default", "rope_theta": base * 1e-2},
                                            "full_attention": {"rope_type": "default", "rope_theta": base}})


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_all_weight_on_one_base_equals_the_model_with_that_theta(arch):
    model = _model(arch)
    bases = [THETA[arch] * b for b in (1.0, 3.0, 0.5)]
    for j in (1, 2):
        with moice(model, _forced(model, bases, j)):
            got = _logits(model)
        want = _logits(_with_theta(model, arch, bases[j]))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(got, _logits(model), atol=1e-3)  # the base matters on this model


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_base_the_models_own_gives_the_model_for_any_routers(arch):
    model = _model(arch)
    routers = Routers.for_model(model, [THETA[arch]] * 4, top_k=3, seed=5)
    with moice(model, routers):
        got = _logits(model)
    torch.testing.assert_close(got, _logits(model), atol=1e-5, rtol=1e-5)


def test_mixing_is_the_convex_combination_of_two_eager_attentions():
    from transformers.models.llama.modeling_llama import eager_attention_forward

    model = tiny_model("llama", 100)
    attn = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    b, h, hk, t, d = 2, 4, 2, 9, 16
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n in (h, hk, hk))
    pos = torch.arange(t)[None].expand(b, -1)
    inv = torch.stack([1.0 / (base ** (torch.arange(0, d, 2).float() / d)) for base in (1e4, 5e4)])  # (2, D/2)
    ang = pos[None, ..., None].float() * inv[:, None, None, :]
    emb = torch.cat([ang, ang], -1)  # (2, B, T, D)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None].expand(b, 1, t, t)
    w = torch.rand(b, t, h, 1, generator=g)
    weights = torch.cat([w, 1 - w], -1)  # (B, T, H, 2)
    got = mix_experts(eager_attention_forward, attn, q, k, v, mask, (cos, sin), (cos, sin), weights, scaling=d**-0.5)
    o = [eager_attention_forward(attn, rotate(q, cos[j][:, None], sin[j][:, None]), rotate(k, cos[j][:, None], sin[j][:, None]),
                                 v, mask, scaling=d**-0.5)[0] for j in range(2)]
    torch.testing.assert_close(got, w * o[0] + (1 - w) * o[1], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(o[0], o[1], atol=1e-3)


def test_top_k_keeps_exactly_k_weights_per_token_and_head():
    logits = torch.randn(2, 7, 3, 5, generator=torch.Generator().manual_seed(0))
    for k in (1, 2, 5):
        w = routing_weights(logits, k)
        assert ((w > 0).sum(-1) == k).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 7, 3))
        assert torch.equal(w.argmax(-1), logits.argmax(-1))
    model = _model("qwen2")
    with torch.no_grad(), moice(model, Routers.for_model(model, top_k=3)) as state:
        state.record = True
        model(**left_pad(SEQS, 0))
    assert len(state.logits) == 0  # cleared on exit
    with torch.no_grad(), moice(model, Routers.for_model(model, top_k=3)) as state:
        state.record = True
        model(**left_pad(SEQS, 0))
        ws = [routing_weights(x, state.top_k) for x in state.logits]
    assert len(ws) == 3 and all(((x > 0).sum(-1) == 3).all() for x in ws)


def test_balance_loss_is_constant_at_top_k_n_and_balanced_at_its_minimum():
    logits = [torch.randn(2, 5, 3, 4, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(2)]
    full = load_balancing_loss(logits, 4)
    assert abs(float(full.detach()) - 4.0) < 1e-5  # top_k = N: N * sum_j P_j = N
    assert float(load_balancing_loss(logits, 1).detach()) > 1.0
    uniform = [torch.zeros(2, 5, 3, 4)]
    assert abs(float(load_balancing_loss(uniform, 1)) - 1.0) < 1e-5  # f_j = 1/N at best (ties -> expert 0: not here)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    kept = load_balancing_loss([x[:, :2] for x in logits], 1, mask[:, :2])
    assert torch.allclose(load_balancing_loss(logits, 1, torch.cat([mask[:, :2], torch.zeros(2, 3, dtype=torch.long)], 1)), kept)


@torch.no_grad()
def test_gemma3_cached_decoding_equals_a_full_forward():
    model = _model("gemma3")
    ids = torch.tensor(random_seqs([30], 100, seed=4))  # longer than the sliding window (8)
    with moice(model, Routers.for_model(model, top_k=4)):
        full = model(input_ids=ids).logits[:, -3:]
        pre = model(input_ids=ids[:, :-2], use_cache=True)
        s1 = model(input_ids=ids[:, -2:-1], **{cache_key(model): output_cache(pre)}, use_cache=True)
        s2 = model(input_ids=ids[:, -1:], **{cache_key(model): output_cache(s1)}, use_cache=True).logits[:, -1]
    torch.testing.assert_close(torch.stack([pre.logits[:, -1], s1.logits[:, -1], s2], 1), full, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- training


def _cfg(**kw) -> TrainConfig:
    base = dict(model="tiny", dtype="fp32", task="kv-lookup", task_options={"facts": 3, "digits": 3}, steps=4, batch=4,
                micro_batch=2, n=4, lr=0.05, aux_coef=0.3, top_k=2)
    return TrainConfig(**{**base, **kw})


@pytest.fixture
def sharp():
    lo = tiny_loaded("llama")
    position_sensitive(lo.model)
    return lo


def test_training_lowers_the_loss_and_changes_only_the_routers(sharp, tmp_path):
    before = {k: v.clone() for k, v in sharp.model.state_dict().items()}
    res = run_train(_cfg(), tmp_path / "m", loaded=sharp, progress=False)
    assert res.losses[-1]["ce"] < res.losses[0]["ce"]  # the same 4 examples every step: comparable
    assert all(torch.equal(v, sharp.model.state_dict()[k]) for k, v in before.items())
    assert all(p.requires_grad for p in sharp.model.parameters())  # flags restored
    init = Routers.for_model(sharp.model, top_k=2)
    assert not torch.equal(init.w1, res.routers.w1.cpu())
    rec = json.loads((tmp_path / "m" / "moice.json").read_text())
    assert rec["fitted_on"] == {"task": "kv-lookup", "seed": 0, "skip": 3000, "n": 4}
    assert [r["step"] for r in rec["losses"]] == [0, 1, 2, 3] and rec["routers"]["file"] == "routers.safetensors"
    method = get_method(f"moice:{tmp_path / 'm'}")
    assert method.fitted_on == rec["fitted_on"] and method.config()["sha256"] == rec["routers"]["sha256"]
    assert torch.equal(method.routers.w2, res.routers.w2.cpu())


def test_resume_after_a_kill_gives_bit_identical_routers(sharp, tmp_path, monkeypatch):
    whole = run_train(_cfg(), tmp_path / "a", loaded=sharp, progress=False)
    restore = dies_after(monkeypatch, train_mod, "train_step", 3)
    with pytest.raises(KeyboardInterrupt):
        run_train(_cfg(), tmp_path / "b", loaded=sharp, progress=False)
    restore()
    assert not (tmp_path / "b" / "moice.json").exists()
    with pytest.raises(PosbiasError, match="unfinished"):
        get_method(f"moice:{tmp_path / 'b'}")
    again = run_train(_cfg(), tmp_path / "b", loaded=sharp, resume=True, progress=False)
    for name in ("w1", "w2", "w3"):
        assert torch.equal(getattr(whole.routers, name), getattr(again.routers, name))
    rows = [json.loads(x) for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["loss"] for r in again.losses] == [r["loss"] for r in whole.losses]


def test_bad_input_is_one_line_before_anything_is_written(sharp, tmp_path):
    out = tmp_path / "x"
    with pytest.raises(PosbiasError, match="top_k"):
        run_train(_cfg(top_k=9), out, loaded=sharp, progress=False)
    gpt2 = Loaded(tiny_model("gpt2", 100), char_tokenizer(), {"name": "tiny-gpt2", "context_window": 2048})
    with pytest.raises(PosbiasError, match="rotary"):
        run_train(_cfg(), out, loaded=gpt2, progress=False)
    assert not out.exists()
    with pytest.raises(PosbiasError, match="no MoICE routers"):
        get_method(f"moice:{tmp_path / 'missing'}")
    (tmp_path / "r").mkdir()
    Routers(2, 4, 16, PAPER_BASES, 7).save(tmp_path / "r" / "routers.safetensors")  # 2 layers: the model has 3
    three = Loaded(_model("llama"), char_tokenizer(), {"name": "tiny", "context_window": 2048})
    method = get_method(f"moice:{tmp_path / 'r'}")
    with pytest.raises(PosbiasError, match="layers, heads, head_dim") as e:
        method.check(three)
    assert "\n" not in str(e.value)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "routers.safetensors").write_text("not a file")
    with pytest.raises(PosbiasError, match="not a MoICE routers file"):
        get_method(f"moice:{tmp_path / 'bad'}")


@pytest.mark.real
def test_real_smollm2_applies_and_restores_bit_identically(smollm2, tmp_path):
    Routers.for_model(smollm2.model, seed=0).save(tmp_path / "routers.safetensors")
    method = get_method(f"moice:{tmp_path}")
    method.check(smollm2)
    ids = torch.tensor([smollm2.tokenizer("The code for 482913 is 771204. What is the code for 482913?")["input_ids"]])
    with torch.inference_mode():
        before = smollm2.model(input_ids=ids).logits
        with method.apply(smollm2):
            inside = smollm2.model(input_ids=ids).logits
        after = smollm2.model(input_ids=ids).logits
    assert torch.equal(before, after) and not torch.equal(before, inside)
    assert torch.isfinite(inside).all()


def test_cli_trains_and_compare_uses_the_routers_but_not_on_their_examples(model_dir, tmp_path):
    from typer.testing import CliRunner

    from posbias import SweepConfig, run_compare
    from posbias.cli import app

    out = tmp_path / "m"
    args = ["moice", "train", "--model", str(model_dir), "--dtype", "fp32", "--task", "kv-lookup", "--facts", "3",
            "--digits", "3", "--steps", "2", "--batch", "2", "--top-k", "2", "--bases", "10000,20000,40000",
            "--out", str(out), "--quiet"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert f"--method moice:{out}" in res.output
    assert json.loads((out / "run.json").read_text())["kind"] == "moice"
    rec = json.loads((out / "moice.json").read_text())
    assert rec["bases"] == [10000.0, 20000.0, 40000.0] and rec["top_k"] == 2 and rec["steps"] == 2
    sweep = SweepConfig(model=str(model_dir), task="kv-lookup", task_options={"facts": 3, "digits": 3}, positions="0,2",
                        n=2, dtype="fp32")
    cmp = run_compare(sweep, ["none", f"moice:{out}"], tmp_path / "cmp", progress=False).record
    assert len(cmp["methods"]) == 2
    with pytest.raises(PosbiasError, match="3000..3003"):
        run_compare(replace(sweep, skip=2999), ["none", f"moice:{out}"], tmp_path / "c2", progress=False)
    res = CliRunner().invoke(app, args)  # the folder holds a finished run: one line, exit 2 through main()
    assert res.exit_code != 0
