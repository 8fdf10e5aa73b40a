"""Conformance suite: every registered training-free method, on two tiny RoPE architectures (Llama and
Qwen2, grouped-query attention), must

- parse from its spec and describe itself as JSON that round-trips through the registry, also through the
  generic key=value spec derived from that JSON (every registered method, decision rules included);
- yield an `Active` from `apply`, change the logits inside (except `none`) and leave the model
  bit-identical after exit, also when the block raises;
- give each row of a left-padded batch the logits that row gets alone (batch / padding invariance);
- give the same next-token logits through the KV cache (prefill, then one decode step) as one full
  forward told where the prompt ends: what generation and teacher forcing each rely on.

A newly registered method fails `test_every_registered_method_has_an_example` until it is added
to the examples, so it cannot skip the suite; EXTRA names further modes of a method (Ms-PoE per query head).
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import char_tokenizer, method_examples, position_sensitive, random_seqs, tiny_model
from conftest import prime_calibration as _prime
from posbias import METHODS, Active, Loaded, PosbiasError, get_method
from posbias.measure import split_specs
from posbias.methods import DecisionRule
from posbias.models.compat import cache_key, output_cache
from posbias.scoring.encode import left_pad

pytestmark = pytest.mark.usefixtures("one_thread")

EXTRA = ("mspoe-query",)  # further modes of a registered method, each through the whole suite
# the order decision rules, the reordering methods and the order ensembles leave the model as it is (changes_model
# False): tests/test_order.py, tests/test_judging.py, tests/test_mitigations.py and tests/test_curve_ensemble.py cover them
DECISIONS = {n for n, c in METHODS.items()
             if issubclass(c, DecisionRule) or c.rearranges or (not c.changes_model and n != "none")}
LAYERS = 4  # Ms-PoE leaves the first two layers alone by default: a 4-layer model has two it changes
ARCHS = ("llama", "qwen2")


def _examples(tmp_path) -> dict[str, str]:
    """An example spec of every registered method that changes the model, and of each EXTRA mode."""
    return {k: v for k, v in method_examples(tmp_path, LAYERS).items() if k not in DECISIONS}


@pytest.fixture(scope="module", params=ARCHS)
def loaded(request):
    tok = char_tokenizer()
    g = torch.Generator().manual_seed(0)
    sharpness = [torch.rand(4, generator=g) * 3 + 0.5 for _ in range(LAYERS)]  # heads differ: Ms-PoE's ranking matters
    model = position_sensitive(tiny_model(request.param, len(tok), layers=LAYERS), q_scale=sharpness)
    return Loaded(model, tok, {"name": f"tiny-{request.param}", "context_window": 2048})


@pytest.fixture(params=sorted({*METHODS, *EXTRA} - DECISIONS))
def method(request, tmp_path):
    return get_method(_examples(tmp_path)[request.param])


def _ids(n: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.tensor(random_seqs([n], 100, seed))


def test_every_registered_method_has_an_example(tmp_path):
    assert set(_examples(tmp_path)) == (set(METHODS) - DECISIONS) | set(EXTRA)
    assert {n for n in DECISIONS if METHODS.origins[n] == "posbias"} == {"swap", "aswap", "pride", "reorder", "attnsort",
                                                                         "curve", "ensemble"}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_registered_method_says_what_it_is(name):
    """`posbias methods` prints each class's first docstring line: none may be blank."""
    assert (METHODS[name].__doc__ or "").strip().split("\n")[0], f"{name} has no docstring for `posbias methods`"


def test_spec_and_config_round_trip(method):
    again = get_method(method.spec)
    assert json.loads(json.dumps(method.config())) == again.config()
    assert type(again) is type(method) and again.label == method.label


def _text(value) -> str:
    """A config value as a spec writes it (posbias/specs.py: a list's items after its key)."""
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def pairs_spec(method) -> str:
    """The key=value spec of a built method, from its config(): every key its spec takes that config() records."""
    config = method.config()
    pairs = [f"{k}={_text(config[k])}" for k in type(method).spec_params() if config.get(k) is not None]
    return f"{method.name}:{','.join(pairs)}" if pairs else method.name


@pytest.mark.parametrize("name", sorted({*METHODS, *EXTRA}))
def test_every_method_rebuilds_from_a_key_value_spec_of_its_config(name, tmp_path):
    """The generic form reaches every registered method, decision rules and reordering included."""
    method = get_method({**method_examples(tmp_path, LAYERS), "pride": "pride:20", "attnsort": "attnsort:2"}[name])
    spec = pairs_spec(method)
    again = get_method(spec)
    assert ("=" in spec) == bool(type(method).spec_params()), spec
    assert type(again) is type(method) and again.config() == method.config() and again.label == method.label, spec
    assert again.spec == spec and type(method).pairs_form() in type(method).spec_forms()
    assert split_specs(f"none,{spec},none") == ["none", spec, "none"]


@pytest.mark.parametrize("spec, message", [
    ("pi:colour=red", "method spec 'pi:colour=red' has no key 'colour' -- use its keys: factor, source"),
    ("mspoe:min_ratio=low", "'min_ratio' in method spec 'mspoe:min_ratio=low' takes a number, got 'low'"),
    ("mspoe:layers=a-b", "'layers' in method spec 'mspoe:layers=a-b' takes none or a list of whole numbers"),
    ("moice:top_k=3", "method spec 'moice:top_k=3' has no key 'top_k' -- use its keys: path"),
    ("layers:source=x", "has no key 'source' -- use its keys: factors"),
    ("lpes:curve=bezier", "has no key 'curve'"),
    ("attnsort:rounds=1,2", "'rounds' in method spec 'attnsort:rounds=1,2' takes a whole number, got '1,2'"),
    ("mspoe:1.2,max_ratio=1.8", "'1.2' in method spec 'mspoe:1.2,max_ratio=1.8' is not key=value"),
    ("pi:factor=1.2,factor=1.3", "'factor' is given twice"),
    ("none:x=1", "method spec 'none:x=1' has no key 'x' -- use its keys: none"),
    ("pi:source=none", "pi takes a factor or the factors.json of a search, one of them"),
    ("hidden:scale=2", "hidden needs a channel and a scale, or a search folder"),
    ("pi:factor=0", "must be finite positive numbers"),  # the constructor's own checks still run
])
def test_a_bad_key_value_method_spec_is_refused_in_one_line(spec, message):
    with pytest.raises(PosbiasError) as e:
        get_method(spec)
    assert message in str(e.value) and e.value.fix and "\n" not in str(e.value), str(e.value)


def test_a_missing_required_key_is_named():
    from posbias.methods.registry import from_pairs

    for name, key in (("lpes", "source"), ("moice", "path"), ("layers", "factors")):
        with pytest.raises(PosbiasError, match=f"method spec '{name}:' needs '{key}' -- add {key}=VALUE"):
            from_pairs(METHODS[name], "", f"{name}:")


def test_split_specs_keeps_key_value_specs_whole():
    assert split_specs("none,mspoe:min_ratio=1.2,max_ratio=1.8,pi:factor=1.5") == [
        "none", "mspoe:min_ratio=1.2,max_ratio=1.8", "pi:factor=1.5"]
    assert split_specs("layers:factors=1,1.5,mspoe:layers=2,3,mode=query,swap") == [
        "layers:factors=1,1.5", "mspoe:layers=2,3,mode=query", "swap"]
    assert split_specs("none,buckets:10000,20000,layers:1,1.1,bogus") == ["none", "buckets:10000,20000", "layers:1,1.1",
                                                                          "bogus"]
    assert split_specs("pi:1.5,factor=2") == ["pi:1.5", "factor=2"]  # a pair continues only a key=value spec
    assert get_method("mspoe:min_ratio=1.1,layers=2-3").config() == get_method("mspoe:1.1-1.8").config() | {"layers": [2, 3]}


@torch.no_grad()
def test_apply_changes_inside_and_restores_exactly(loaded, method):
    ids = _ids()
    before = loaded.model(input_ids=ids).logits
    with method.apply(loaded) as active:
        assert isinstance(active, Active)
        _prime(active, ids.tolist())
        inside = loaded.model(input_ids=ids).logits
    after = loaded.model(input_ids=ids).logits
    assert torch.equal(before, after)
    assert inside.shape == before.shape
    assert torch.equal(inside, before) == (method.name == "none")
    with pytest.raises(RuntimeError, match="boom"), method.apply(loaded):
        raise RuntimeError("boom")
    assert torch.equal(loaded.model(input_ids=ids).logits, before)


@torch.no_grad()
def test_rows_of_a_padded_batch_equal_the_rows_alone(loaded, method):
    seqs = random_seqs([20, 33, 47], 100, seed=1)
    with method.apply(loaded) as active:
        _prime(active, seqs)
        batch = loaded.model(**left_pad(seqs, 0)).logits[:, -1]
        alone = []
        for s in seqs:
            _prime(active, [s])
            alone.append(loaded.model(input_ids=torch.tensor([s])).logits[:, -1])
        alone = torch.cat(alone)
    torch.testing.assert_close(batch, alone, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_cached_decoding_equals_a_full_forward(loaded, method):
    """Teacher forcing scores prompt + answer in one forward after telling the method where the prompt ends
    (Active.set_prompt_end); generation prefills the prompt and decodes with the cache. Both must agree."""
    ids = _ids(40, seed=5)
    with method.apply(loaded) as active:
        active.set_prompt_end(torch.tensor([ids.shape[1] - 2]))  # the prompt is ids[:, :-1]
        _prime(active, ids[:, :-1].tolist(), torch.tensor([ids.shape[1] - 2]))
        full = loaded.model(input_ids=ids).logits[:, -1]
        _prime(active, ids[:, :-1].tolist())
        pre = loaded.model(input_ids=ids[:, :-1], use_cache=True)
        step = loaded.model(input_ids=ids[:, -1:], **{cache_key(loaded.model): output_cache(pre)}, use_cache=True).logits[:, -1]
    torch.testing.assert_close(step, full, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_the_prompt_end_matters_where_a_method_reads_the_input(loaded):
    """Guard for the test above: Ms-PoE ranks its heads on the input, so without the prompt end a full forward
    ranks them at another token than generation does, and the logits differ."""
    ids = _ids(40, seed=7)  # an input whose last two tokens rank the heads differently (at ALPHA 3, seeds 5 and 6
    # happen to rank them alike on Qwen2)
    with get_method("mspoe").apply(loaded):
        full = loaded.model(input_ids=ids).logits[:, -1]
        pre = loaded.model(input_ids=ids[:, :-1], use_cache=True)
        step = loaded.model(input_ids=ids[:, -1:], **{cache_key(loaded.model): output_cache(pre)}, use_cache=True).logits[:, -1]
    assert (full - step).abs().max() > 1e-2


@pytest.mark.parametrize("h", range(LAYERS))
@torch.no_grad()
def test_per_layer_factor_h_acts_on_decoder_layer_h(loaded, h):
    """LPES eq. 2 scales layer h by s_h: with s_h = 2 and every other factor 1, the attention outputs of the
    layers below h are bit-identical to the unmodified model's and layer h's differ."""
    outs: dict[int, torch.Tensor] = {}
    hooks = [layer.self_attn.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o[0].clone()))
             for i, layer in enumerate(loaded.model.model.layers)]
    try:
        ids = _ids()
        loaded.model(input_ids=ids)
        base = dict(outs)
        factors = [1.0] * LAYERS
        factors[h] = 2.0
        with get_method("layers:" + ",".join(map(str, factors))).apply(loaded):
            loaded.model(input_ids=ids)
    finally:
        for hk in hooks:
            hk.remove()
    assert all(torch.equal(outs[i], base[i]) for i in range(h))
    assert not torch.allclose(outs[h], base[h], atol=1e-4)


@torch.no_grad()
def test_prefix_safe_methods_continue_a_shared_prefix_exactly(loaded, method):
    """A method that declares itself prefix-safe (scoring/prefix.py reuses a cached prompt prefix) gives, inside,
    the logits of a plain forward to rows that continue a spine's cache; the others say why they fall back."""
    from posbias.models.prefix import SharedKV, prefill

    assert isinstance(method.prefix_safe, bool)
    if not method.prefix_safe:
        assert method.prefix_note and method.prefix_note != "not declared prefix-safe"
        return
    spine = random_seqs([36], 100, seed=2)[0]
    rows = [(9, [5, 6, 7]), (30, [8, 9])]  # (spine tokens reused, own tokens)
    with method.apply(loaded):
        shared = SharedKV(loaded.model, prefill(loaded.model, [spine], 0), torch.tensor([0, 0]),
                          torch.tensor([p for p, _ in rows]))
        ids = torch.tensor([[5, 6, 7], [0, 8, 9]])  # left-padded own tokens
        pos = torch.tensor([[9, 10, 11], [0, 30, 31]])
        valid = torch.tensor([[True, True, True], [False, True, True]])
        got = shared.forward(ids, pos, valid)[:, -1]
        plain = torch.cat([loaded.model(input_ids=torch.tensor([spine[:p] + b])).logits[:, -1] for p, b in rows])
    torch.testing.assert_close(got, plain, atol=1e-4, rtol=1e-4)
