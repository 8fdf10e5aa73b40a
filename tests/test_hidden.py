"""Positional hidden-channel scaling (Yu et al. 2025): the operator against a hand-written reference, the prompt-end
rule, the channel statistics on planted curves, the search pipeline end to end (files, resume, the held-out
check, the model check) on tiny random models. Conformance (exactness, padding, cache) runs in
test_method_conformance.py and test_model_families.py through the registry."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import char_tokenizer, random_seqs, tiny_model
from posbias import Loaded, PosbiasError, SweepConfig, get_method, run_compare
from posbias.core.positional_channels import find_candidates, monotone_direction
from posbias.hidden import HiddenScale, SearchConfig, run_search
from posbias.mitigate.hidden import search as search_mod
from posbias.models.hidden import hidden_scaling, middle_layers

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 6


def _tiny(arch: str = "llama", layers: int = LAYERS) -> Loaded:
    tok = char_tokenizer()
    model = tiny_model(arch, len(tok), layers=layers)
    with torch.no_grad():  # sharper q.k so positions matter
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    return Loaded(model, tok, {"name": f"tiny-{arch}-{layers}", "context_window": 2048})


@pytest.fixture(scope="module")
def lo():
    return _tiny()


def _rotate(x, cos, sin):  # x (B, h, T, D); cos/sin (B, T, D)
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rot * sin[:, None]


def _reference_attention(attn, x, xs, cos, sin):
    """The paper's operator for the last row, by hand: query and keys from xs (channel scaled), values from x."""
    B, T, _ = x.shape
    D = attn.head_dim
    q = attn.q_proj(xs).view(B, T, -1, D).transpose(1, 2)  # (B, Hq, T, D)
    k = attn.k_proj(xs).view(B, T, -1, D).transpose(1, 2)  # (B, Hk, T, D)
    v = attn.v_proj(x).view(B, T, -1, D).transpose(1, 2)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    w = torch.softmax(q[:, :, -1:] @ k.transpose(-1, -2) / math.sqrt(D), dim=-1)  # the last row sees every key
    out = (w @ v).transpose(1, 2).reshape(B, 1, -1)
    return attn.o_proj(out)  # (B, 1, H)


@torch.no_grad()
def test_the_last_row_is_the_papers_operator_and_earlier_rows_are_untouched(lo):
    """In the first scaled layer (its input equals the unmodified model's), the last row's attention output is
    softmax(q_s k_s^T) v with q_s, k_s from the scaled normed input and v from the unscaled one; the other rows
    are the unmodified model's exactly."""
    layer = 2
    attn = lo.model.model.layers[layer].self_attn
    seen = {}

    def capture():  # registered last, so it sees the self_attn output after the method's own hooks
        return [attn.register_forward_pre_hook(lambda m, a, k: seen.update(x=k["hidden_states"].clone(),
                                                                           pe=k["position_embeddings"]), with_kwargs=True),
                attn.register_forward_hook(lambda m, a, k, o: seen.update(out=o[0].clone()), with_kwargs=True)]

    ids = torch.tensor(random_seqs([30], 100, seed=3))
    hooks = capture()
    try:
        lo.model(input_ids=ids)
        base_x, base_out, (cos, sin) = seen["x"], seen["out"], seen["pe"]
        with hidden_scaling(lo.model, 7, -1.0, [layer, layer + 1]):
            hooks += capture()
            lo.model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    assert torch.equal(seen["x"], base_x)  # the layers below are untouched
    xs = base_x.clone()
    xs[..., 7] *= -1.0
    torch.testing.assert_close(seen["out"][:, :-1], base_out[:, :-1], atol=0, rtol=0)
    torch.testing.assert_close(seen["out"][:, -1:], _reference_attention(attn, base_x, xs, cos, sin), atol=1e-5, rtol=1e-5)
    assert (seen["out"][:, -1] - base_out[:, -1]).abs().max() > 1e-4  # and the scaling did something


@torch.no_grad()
def test_the_prompt_end_picks_the_scaled_rows_for_one_forward(lo):
    ids = torch.tensor(random_seqs([40], 100, seed=4))
    base = lo.model(input_ids=ids).logits
    with get_method("hidden:7:-1").apply(lo) as active:
        active.set_prompt_end(torch.tensor([30]))
        told = lo.model(input_ids=ids).logits
        again = lo.model(input_ids=ids).logits  # the prompt end applied to one forward only: now the last column
    assert torch.equal(told[:, :30], base[:, :30]) and (told[:, 30:] - base[:, 30:]).abs().amax(-1).min() > 1e-4
    assert torch.equal(again[:, :39], base[:, :39]) and not torch.equal(again[:, 39], base[:, 39])
    with get_method("hidden:7:-1").apply(lo) as active, pytest.raises(PosbiasError, match="one column per row"):
        active.set_prompt_end(torch.tensor([3, 4]))
        lo.model(input_ids=ids)


def test_explicit_spec_round_trips_and_refuses_bad_channels(lo):
    m = get_method("hidden:7:-0.5:2-4")
    assert (m.channel, m.scale, m.layers, m.label) == (7, -0.5, [2, 3, 4], "hidden:7:-0.5:2-4")
    assert middle_layers(32) == list(range(10, 26)) and middle_layers(30) == list(range(9, 24))  # the public 10..25 of 32
    with pytest.raises(PosbiasError, match="hidden channel 64 is out of range"):
        get_method("hidden:64:0").check(lo)
    with pytest.raises(PosbiasError, match="do not fit a 6-layer"):
        get_method("hidden:3:0:4-9").check(lo)
    for bad in ("hidden", "hidden:1:2:3:4", "hidden:1:x", "hidden:/nonexistent"):
        with pytest.raises(PosbiasError):
            get_method(bad)


def test_monotone_smooth_channels_are_found_and_ranked():
    rng = np.random.default_rng(0)
    L, T, H = 10, 200, 16
    mean = rng.normal(size=(L, T, H))  # noise: rarely monotone in more than L // 4 layers
    t = np.arange(T)
    mean[:, :, 3] = np.log1p(t) + rng.normal(size=(L, T)) * 1e-3  # increasing, smooth
    mean[:, :, 9] = -np.sqrt(t) + rng.normal(size=(L, T)) * 0.05  # decreasing, rougher
    mean[:, :, 12] = np.sin(t / 20.0)  # smooth but not monotone
    mean[:, :, 5] = 1.0  # constant: neither
    got = find_candidates(mean, top_k=2)
    assert [(c["channel"], c["direction"]) for c in got] == [(3, 1), (9, -1)]
    assert got[0]["monotone_layers"] == list(range(2, L - 1))
    assert list(monotone_direction(mean[4, 60:, [3, 9, 12, 5]].T)) == [1, -1, 0, 0]


def _cfg(**kw) -> SearchConfig:
    base = dict(model="tiny", task_options={"facts": 4, "digits": 3}, n=3, skip=100, dtype="fp32", samples=6, length=64,
                top_k=2, scales=(0.0, -1.0))
    return SearchConfig(**{**base, **kw})


def test_search_writes_a_result_the_method_reads_and_compare_keeps_held_out(lo, tmp_path):
    out = tmp_path / "s"
    res = run_search(_cfg(), out, loaded=lo, progress=False)
    rec = json.loads((out / "hidden.json").read_text())
    assert rec["channel"] == res.channel and rec["layers"] == middle_layers(LAYERS) == [2, 3, 4]
    assert len(rec["evaluations"]) == 2 * len(rec["candidates"]) and 1 <= len(rec["candidates"]) <= 2
    best = max(rec["evaluations"], key=lambda e: (e["mean_accuracy"], -e["loss"]))
    assert (best["channel"], best["scale"]) == (res.channel, res.scale)
    assert rec["fitted_on"] == {"task": "kv-lookup", "seed": 0, "skip": 100, "n": 3, "positions": [0, 2, 3]}
    m = get_method(f"hidden:{out}")
    assert (m.channel, m.scale, m.layers, m.fitted_on) == (res.channel, res.scale, res.layers, rec["fitted_on"])
    m.check(lo)
    with pytest.raises(PosbiasError, match="was found on tiny-llama-6, not on tiny-qwen2-6"):
        m.check(_tiny("qwen2"))
    sweep = SweepConfig(model="tiny", task_options={"facts": 4, "digits": 3}, n=2, skip=99, positions="0,3", dtype="fp32")
    with pytest.raises(PosbiasError, match="overlap"):
        run_compare(sweep, ["none", f"hidden:{out}"], tmp_path / "c", loaded=lo, progress=False)
    again = run_search(_cfg(), out, loaded=lo, progress=False, resume=True)  # finished: the cached result
    assert again.record == res.record


@pytest.mark.parametrize("where", ["stats", "calibration"])
def test_a_killed_search_resumes_to_the_same_result(lo, tmp_path, monkeypatch, where):
    full = run_search(_cfg(), tmp_path / "full", loaded=lo, progress=False).record
    owner, name = (search_mod, "_save_sums") if where == "stats" else (search_mod, "_evaluate")
    real, calls = getattr(owner, name), {"n": 0}

    def dies_on_the_second_call(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(owner, name, dies_on_the_second_call)
    with pytest.raises(KeyboardInterrupt):
        run_search(_cfg(), tmp_path / "cut", loaded=lo, progress=False)
    assert not (tmp_path / "cut" / "hidden.json").exists()
    monkeypatch.setattr(owner, name, real)
    resumed = run_search(_cfg(), tmp_path / "cut", loaded=lo, progress=False, resume=True).record
    drop = ("seconds_this_call",)
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    if where == "stats":
        assert calls["n"] == 2  # it died in step (a), after one checkpoint
    with pytest.raises(PosbiasError, match="different configuration"):
        (tmp_path / "cut" / "hidden.json").unlink()
        run_search(_cfg(top_k=1), tmp_path / "cut", loaded=lo, progress=False, resume=True)


def test_a_model_too_shallow_for_the_search_is_refused_in_one_line(tmp_path):
    """Layers 2..L-2 hold the candidates: a 2-layer model used to end in numpy's 'need at least one array to stack'."""
    with pytest.raises(PosbiasError, match="has 2 layers"):
        run_search(_cfg(), tmp_path / "shallow", loaded=_tiny(layers=2), progress=False)
    assert not (tmp_path / "shallow").exists()


def test_search_refuses_bad_config(lo, tmp_path):
    for kw, text in (({"scales": (1.0,)}, "other than 1"), ({"select": "best"}, "unknown `select`"),
                     ({"positions": (0, 7)}, "slots in 0..3"), ({"layers": (3, 9)}, "do not fit a 6-layer"),
                     ({"engine": "generate", "select": "loss"}, "needs the answer's logprob")):
        with pytest.raises(PosbiasError, match=text):
            run_search(_cfg(**kw), tmp_path / "b", loaded=lo, progress=False)
        assert not (tmp_path / "b" / "run.json").exists()
    with pytest.raises(PosbiasError, match="unknown preset"):
        SearchConfig.from_preset("huge")
    assert SearchConfig.from_preset("paper").samples == 200 and HiddenScale.name == "hidden"


def test_selection_rules():
    """accuracy: the highest mean accuracy, the lower loss among equals; loss: the lowest answer loss (the paper preset)."""
    evs = [{"mean_accuracy": 0.5, "loss": 0.2}, {"mean_accuracy": 0.6, "loss": 0.9}, {"mean_accuracy": 0.6, "loss": 0.4}]
    assert max(evs, key=lambda e: search_mod._rank(e, "accuracy")) is evs[2]
    assert max(evs, key=lambda e: search_mod._rank(e, "loss")) is evs[0]
    assert SearchConfig.from_preset("paper").select == "loss" and SearchConfig().select == "accuracy"
