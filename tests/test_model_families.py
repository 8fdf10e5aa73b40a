"""Model-family conformance: tiny random models built from configs (no weights) for every family that
users point posbias at, in fp32. Each model's own `generation_config` asks for repetition_penalty=1.3 and
no_repeat_ngram_size=2, which posbias must ignore (greedy decoding is the one rule). For each family:

- prefix sharing: the shared and plain paths give identical verdicts, predictions and logprobs under both engines,
  or the model falls back to the plain path with a note naming why (and then the shared forward really differs:
  the fallback is needed, not merely cautious);
- decoding: generation is pure greedy (equal to an uncached argmax loop), and teacher forcing calls a row correct
  exactly when greedy generation emits its answer;
- methods: every registered training-free method either applies exactly (changes the logits inside, leaves them
  bit-identical after removal, and its identity setting equals the unmodified model) or refuses in one line that
  names why, and the refusals are the expected ones.

Sliding windows are 8 tokens, far shorter than the prompts, so a window the shared path missed changes logits.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import char_tokenizer, prime_calibration, random_seqs
from posbias import METHODS, Loaded, PosbiasError, get_method, get_task
from posbias.measure import Scorer
from posbias.models.compat import cache_key, output_cache
from posbias.models.moice import Routers
from posbias.scoring.encode import Encoded, left_pad
from posbias.scoring.generate import generate_greedy
from posbias.scoring.teacher_forced import score_teacher_forced

pytestmark = pytest.mark.usefixtures("one_thread")

W = 8  # sliding window of every windowed family
FACTS, DIGITS = 4, 3
TASK = dict(facts=FACTS, digits=DIGITS)


def _prompt_len() -> int:
    """Tokens of a kv-lookup prompt (all equal: fixed digits); Phi-3's longrope switches factors just past it."""
    task = get_task("kv-lookup", **TASK)
    tok = char_tokenizer()
    from posbias.scoring.encode import encode

    return len(encode(tok, task.build(task.examples(1, seed=0)[0], 0), True).prompt_ids)


# family -> (config class in transformers, its extra settings)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen2-window": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=W, max_window_layers=1)),
    "qwen3": ("Qwen3Config", dict(head_dim=16)),
    "mistral": ("MistralConfig", dict(sliding_window=W)),
    "mixtral": ("MixtralConfig", dict(sliding_window=W, num_local_experts=2, num_experts_per_tok=1)),
    "phi3": ("Phi3Config", dict(sliding_window=W)),
    "phi3-longrope": ("Phi3Config", dict(sliding_window=None, rope_parameters="longrope")),
    "phi3-partial": ("Phi3Config", dict(sliding_window=W, partial_rotary_factor=0.5)),  # RoPE on half of each head
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=W)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=W, layer_types=["sliding_attention", "full_attention",
                                                                                     "sliding_attention"])),
    "olmo2": ("Olmo2Config", {}),
    "starcoder2": ("Starcoder2Config", dict(sliding_window=W)),
    "gpt_neox": ("GPTNeoXConfig", dict(rotary_pct=0.5)),
    "gpt2": ("GPT2Config", {}),
}
# prefix sharing cannot be exact: the frequencies depend on the sequence length
FALLS_BACK = {"phi3-longrope": "longrope"}
# method -> families it refuses, and a word its one-line refusal must contain
NO_ROPE = {"gpt2": "rotary", "phi3-longrope": "longrope", "gpt_neox": "self_attn"}
REFUSES: dict[str, dict[str, str]] = {m: dict(NO_ROPE) for m in ("pi", "layers", "lpes", "buckets", "moice")}
REFUSES["mspoe"] = REFUSES["mspoe-query"] = {**NO_ROPE, "gpt_neox": "gpt_neox"}
REFUSES["none"] = {}
REFUSES["hidden"] = {"gpt2": "decoder layers", "gpt_neox": "q_proj", "phi3": "q_proj", "phi3-longrope": "q_proj",
                     "phi3-partial": "q_proj"}  # hidden scaling needs no RoPE, but separate q/k projections
REFUSES["calib"] = {"gpt2": "self_attn", "gpt_neox": "self_attn"}  # calibration reweights a self_attn's attention
REFUSES["pine"] = {**NO_ROPE, "phi3-partial": "partial rotary", "gemma2": "soft-capping"}
LAYERS = 3
# measured and documented (docs/mitigations.md), not yet understood: generation with a KV cache under attention
# calibration differs from one full forward on Gemma-2 (teacher forcing, one full forward, is unaffected)
KNOWN_GAPS: dict[tuple[str, str], str] = {}  # (family, method) -> why it is expected to fail


def build(family: str):
    import transformers as tf

    cls_name, extra = FAMILIES[family]
    extra = dict(extra)
    tok = char_tokenizer()
    common = dict(vocab_size=len(tok), pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if cls_name == "GPT2Config":
        cfg = tf.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=4, n_positions=2048, **common)
    else:
        if extra.get("rope_parameters") == "longrope":  # short factors up to the prompt, long ones past it
            orig = _prompt_len()
            extra["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                        "long_factor": [3.0] * 8, "original_max_position_embeddings": orig}
            extra["original_max_position_embeddings"] = orig  # Phi-3 copies its own (default 4096) into the above
        heads = dict(num_attention_heads=4, num_key_value_heads=2) if cls_name != "GPTNeoXConfig" else dict(
            num_attention_heads=4)
        cfg = getattr(tf, cls_name)(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                    max_position_embeddings=2048, **heads, **common, **extra)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random init attends almost uniformly: sharpen q.k so positions (and windows) matter
        for name, p in model.named_parameters():
            if name.endswith("weight") and any(k in name for k in ("q_proj", "k_proj", "qkv_proj", "query_key_value",
                                                                    "c_attn")):
                p.mul_(4.0)
        model.get_output_embeddings().weight.mul_(20.0)  # decisive greedy choices
    # settings a model's generation_config may carry; posbias decodes greedily whatever they say
    model.generation_config.repetition_penalty = 1.3
    model.generation_config.no_repeat_ngram_size = 2
    return Loaded(model, tok, {"name": f"tiny-{family}", "context_window": 2048})


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param, build(request.param)


def _by_key(results):
    return {(r["example_id"], json.dumps(r["position"])): r for r in results}


@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_prefix_sharing_is_exact_or_falls_back_with_a_note(family, engine):
    name, lo = family
    task = get_task("kv-lookup", **TASK)
    rows = Scorer(lo, task).rows(task.examples(2, seed=0), list(range(FACTS)))
    shared_scorer = Scorer(lo, task, engine, 6)
    settings = shared_scorer.settings("none")
    plain = _by_key(Scorer(lo, task, engine, 6, prefix_sharing=False).score(rows))
    shared = _by_key(shared_scorer.score(rows))
    if name in FALLS_BACK:
        assert settings["scoring_path"] == "plain", settings
        assert FALLS_BACK[name] in settings["scoring_note"] and "\n" not in settings["scoring_note"]
        assert shared == plain
        return
    assert settings["scoring_path"] == "prefix-shared", settings
    assert plain.keys() == shared.keys()
    for k in plain:
        assert (plain[k]["correct"], plain[k]["prediction"]) == (shared[k]["correct"], shared[k]["prediction"]), k
        if engine == "teacher-forced":
            assert shared[k]["logprob"] == pytest.approx(plain[k]["logprob"], abs=1e-4), k


@pytest.mark.parametrize("name", sorted(FALLS_BACK))
@torch.inference_mode()
def test_a_fallback_is_needed(name):
    """Where the capability check refuses prefix sharing, the shared forward (cached spine, then the branch)
    really differs from a plain forward of the same tokens: the refusal is needed, not merely cautious."""
    from posbias.models.prefix import SharedKV, prefill, prefix_exact

    lo = build(name)
    assert FALLS_BACK[name] in prefix_exact(lo.model)
    n = _prompt_len()
    seq = random_seqs([n + 4], 100, seed=3)[0]
    spine, branch = seq[: n - 10], seq[n - 10:]  # spine within the short factors, the whole row past them
    shared = SharedKV(lo.model, prefill(lo.model, [spine], 0), torch.tensor([0]), torch.tensor([len(spine)]))
    pos = torch.arange(len(spine), len(seq))[None]
    got = shared.forward(torch.tensor([branch]), pos, torch.ones_like(pos, dtype=torch.bool))[0]
    plain = lo.model(input_ids=torch.tensor([seq])).logits[0, len(spine):]
    assert (got - plain).abs().max() > 1e-2


@torch.inference_mode()
def _argmax_loop(model, prompt: list[int], steps: int, stops: set[int]) -> list[int]:
    """Greedy decoding the slow, obvious way: a full uncached forward per token, argmax, stop after a stop token."""
    seq, out = list(prompt), []
    for _ in range(steps):
        t = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        out.append(t)
        seq.append(t)
        if t in stops:
            break
    return out


def _prompts(lo, n: int = 4) -> list[Encoded]:
    task = get_task("kv-lookup", **TASK)
    return Scorer(lo, task).rows(task.examples(1, seed=1), list(range(n)))


def test_generation_is_pure_greedy(family):
    """The plain path's generate (batched, left-padded, KV cache) equals an uncached argmax loop, although the
    model's generation_config asks for a repetition penalty and no repeated bigrams."""
    from posbias.scoring.generate import _newline_ids, eos_ids

    name, lo = family
    rows = _prompts(lo)
    got = generate_greedy(lo.model, lo.tokenizer, rows, 0, 12, multiline=True)
    stops = set(eos_ids(lo.model, lo.tokenizer))
    want = [lo.tokenizer.decode(_argmax_loop(lo.model, r.prompt_ids, 12, stops), skip_special_tokens=True).strip()
            for r in rows]
    assert got == want
    cut = generate_greedy(lo.model, lo.tokenizer, rows, 0, 12)
    nl = stops | set(_newline_ids(lo.tokenizer))
    assert cut == [lo.tokenizer.decode(_argmax_loop(lo.model, r.prompt_ids, 12, nl), skip_special_tokens=True).split("\n")[0]
                   for r in rows]


def test_teacher_forcing_agrees_with_generation(family):
    """Teacher forcing calls an answer correct iff greedy generation emits it: the generated continuation is
    correct, the same with its last token changed is not."""
    name, lo = family
    rows = _prompts(lo)
    gen = generate_greedy(lo.model, lo.tokenizer, rows, 0, 6, multiline=True)
    ids = [lo.tokenizer(g, add_special_tokens=False)["input_ids"] for g in gen]
    keep = [(r, a) for r, g, a in zip(rows, gen, ids) if a and g == g.strip()]  # text that tokenises back as generated
    assert keep, "no row generated a plain continuation"
    right = [Encoded(r.prompt, r.prompt_ids, [a]) for r, a in keep]
    wrong = [Encoded(r.prompt, r.prompt_ids, [a[:-1] + [a[-1] + 1 if a[-1] + 1 < len(lo.tokenizer) else 4]]) for r, a in keep]
    assert all(d["correct"] for d in score_teacher_forced(lo.model, lo.tokenizer, right, 0))
    assert not any(d["correct"] for d in score_teacher_forced(lo.model, lo.tokenizer, wrong, 0))


def _method_specs(tmp_path, lo) -> dict[str, tuple[str, str]]:
    """method -> (a spec that acts, the spec of its identity setting)."""
    from posbias.models.rope import rope_info

    try:
        theta = rope_info(lo.model).rope_theta or 10000.0
    except PosbiasError:
        theta = 10000.0
    ones = ",".join(["1"] * LAYERS)
    f_act, f_id = tmp_path / "act.json", tmp_path / "id.json"
    f_act.write_text(json.dumps({"factors": [1.0, 2.0, 1.5]}))
    f_id.write_text(json.dumps({"factors": [1.0] * LAYERS}))
    routers = {}
    for key, bases, k in (("act", (theta, 2 * theta, 3 * theta), 2), ("id", (theta,), 1)):
        d = tmp_path / f"moice-{key}"
        d.mkdir(exist_ok=True)
        Routers(LAYERS, 4, 16, bases, top_k=k, seed=0).save(d / "routers.safetensors")
        routers[key] = d
    return {"none": ("none", "none"), "pi": ("pi:1.5", "pi:1"), "layers": ("layers:1,2,1.5", f"layers:{ones}"),
            "lpes": (f"lpes:{f_act}", f"lpes:{f_id}"), "mspoe": ("mspoe:1.2-1.8", "mspoe:1-1"),
            "mspoe-query": ("mspoe:1.2-1.8:query", "mspoe:1-1:query"),
            "buckets": (f"buckets:{theta},{3 * theta}", f"buckets:{theta}"),
            "moice": (f"moice:{routers['act']}", f"moice:{routers['id']}"), "hidden": ("hidden:5:-1", "hidden:5:1"),
            "calib": ("calib:prompt", "calib:prompt"),  # calibration acts only on primed rows: unprimed, it is the identity
            "pine": ("pine", "pine:fixed")}  # fixed positions with no separate documents is the plain model


def test_every_registered_method_is_covered():
    decisions = {n for n, c in METHODS.items() if not c.changes_model and n != "none"}  # model untouched: test_order.py
    own = {n for n in METHODS if METHODS.origins[n] == "posbias"}  # a plugin's methods: the conformance suites run them
    assert {m.split("-")[0] for m in REFUSES} == own - decisions


@pytest.mark.parametrize("method", sorted(REFUSES))
@torch.no_grad()
def test_method_applies_exactly_or_refuses_in_one_line(family, method, tmp_path):
    name, lo = family
    acting, identity = (get_method(s) for s in _method_specs(tmp_path, lo)[method])
    try:
        acting.check(lo)
    except PosbiasError as e:
        assert name in REFUSES[method], f"{method} refused {name}: {e}"
        assert "\n" not in str(e) and REFUSES[method][name] in str(e), str(e)
        return
    assert name not in REFUSES[method], f"{method} was expected to refuse {name}"
    if (name, method) in KNOWN_GAPS:
        pytest.xfail(KNOWN_GAPS[(name, method)])
    ids = torch.tensor(random_seqs([40], 100, seed=4))
    before = lo.model(input_ids=ids).logits
    with acting.apply(lo) as active:
        prime_calibration(active, ids.tolist())
        inside = lo.model(input_ids=ids).logits
    assert torch.equal(lo.model(input_ids=ids).logits, before)
    assert torch.equal(inside, before) == (method == "none")
    identity.check(lo)
    with identity.apply(lo):
        same = lo.model(input_ids=ids).logits
    torch.testing.assert_close(same, before, atol=1e-4, rtol=1e-4)
    seqs = random_seqs([20, 33], 100, seed=5)
    with acting.apply(lo) as active:  # a left-padded batch row by row (the scorer's batches), and the KV cache
        prime_calibration(active, seqs)
        batch = lo.model(**left_pad(seqs, 0)).logits[:, -1]
        alone = []
        for s in seqs:
            prime_calibration(active, [s])
            alone.append(lo.model(input_ids=torch.tensor([s])).logits[:, -1])
        alone = torch.cat(alone)
        active.set_prompt_end(torch.tensor([ids.shape[1] - 2]))  # the prompt is ids[:, :-1]
        prime_calibration(active, ids[:, :-1].tolist(), torch.tensor([ids.shape[1] - 2]))
        full = lo.model(input_ids=ids).logits[:, -1]
        prime_calibration(active, ids[:, :-1].tolist())
        pre = lo.model(input_ids=ids[:, :-1], use_cache=True)
        step = lo.model(input_ids=ids[:, -1:], **{cache_key(lo.model): output_cache(pre)}, use_cache=True).logits[:, -1]
    torch.testing.assert_close(batch, alone, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(step, full, atol=1e-4, rtol=1e-4)


def test_the_decoding_rule_is_recorded_and_the_model_config_restored(family):
    name, lo = family
    task = get_task("kv-lookup", **TASK)
    scorer = Scorer(lo, task, "generate", 4)
    assert scorer.settings()["decoding"] == {"rule": "greedy", "model_generation_config_ignored": {
        "no_repeat_ngram_size": 2, "repetition_penalty": 1.3}}
    scorer.score(scorer.rows(task.examples(1, seed=0), [0]))
    assert lo.model.generation_config.repetition_penalty == 1.3  # swapped back after generating
