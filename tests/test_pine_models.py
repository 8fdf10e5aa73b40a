"""PINE inside real model code (models/pine_hook.py) on tiny random models of the RoPE families posbias supports
(Llama, Qwen-2, Gemma-3 with sliding and global layers): for every order of three documents the last token's
log-probabilities agree to float tolerance and greedy generation through the KV cache is the same; with the
re-assignment or the bidirectional mask left out (variants fixed, causal) they do not. A learned-position model
(GPT-2) is refused in one line. Outside the context the model is bit for bit as before."""

from __future__ import annotations

import itertools

import pytest
import torch

from posbias import PosbiasError
from posbias.models.pine_hook import pine
from posbias.models.pine_plan import PREFIX, SUFFIX

pytestmark = pytest.mark.usefixtures("one_thread")

PREFIX_TEXT, DOCS, SUFFIX_TEXT = "Facts:", ["\nred is 41.", "\nblue is 7.", "\ngreen is 590."], "\nQ: blue? A:"


def _model(arch: str):
    from tiny import char_tokenizer, tiny_model

    tok = char_tokenizer(chat=False)
    return tiny_model(arch, len(tok), seed=3, layers=3), tok


def _prompt(tok, order):
    ids, classes = [tok.bos_token_id], [PREFIX]
    pre = tok(PREFIX_TEXT, add_special_tokens=False)["input_ids"]
    ids, classes = ids + pre, classes + [PREFIX] * len(pre)
    for slot, d in enumerate(order):
        t = tok(DOCS[d], add_special_tokens=False)["input_ids"]
        ids, classes = ids + t, classes + [slot] * len(t)
    suf = tok(SUFFIX_TEXT, add_special_tokens=False)["input_ids"]
    return ids + suf, classes + [SUFFIX] * len(suf)


def _last_logprobs(model, tok, order, variant="pine"):
    ids, classes = _prompt(tok, order)
    with torch.no_grad(), pine(model, variant) as handle:
        handle.rows = [classes]
        x = torch.tensor([ids])
        out = model(input_ids=x, position_ids=torch.arange(len(ids))[None]).logits[0, -1]
    return torch.log_softmax(out.float(), -1)


def _greedy(model, tok, order, steps=6, variant="pine", last=False):
    from transformers import DynamicCache

    ids, classes = _prompt(tok, order)
    got, cache = [], DynamicCache()
    with torch.no_grad(), pine(model, variant) as handle:
        handle.rows = [classes]
        x, pos = torch.tensor([ids]), torch.arange(len(ids))[None]
        for _ in range(steps):
            logits = model(input_ids=x, position_ids=pos, cache=cache, use_cache=True).logits[0, -1]
            nxt = int(logits.argmax())
            got.append(nxt)
            x, pos = torch.tensor([[nxt]]), pos[:, -1:] + 1
    return (got, torch.log_softmax(logits.float(), -1)) if last else got


ORDERS = list(itertools.permutations(range(3)))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_pine_outputs_do_not_depend_on_the_documents_order(arch):
    model, tok = _model(arch)
    ref = _last_logprobs(model, tok, ORDERS[0])
    worst = max(float((_last_logprobs(model, tok, o) - ref).abs().max()) for o in ORDERS[1:])
    assert worst == 0.0, worst  # to the bit: the token ids give PINE its canonical order (models/pine.attend)
    plain = [_greedy(model, tok, o) for o in ORDERS]
    assert all(g == plain[0] for g in plain), plain


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("variant", ["fixed", "causal"])
def test_without_reassignment_or_the_bidirectional_mask_the_order_shows(arch, variant):
    model, tok = _model(arch)
    ref = _last_logprobs(model, tok, ORDERS[0], variant)
    worst = max(float((_last_logprobs(model, tok, o, variant) - ref).abs().max()) for o in ORDERS[1:])
    assert worst > 1e-3, (variant, worst)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_decoding_through_the_cache_equals_a_full_forward(arch):
    """The decoding steps read a store kept in the canonical column order after the prefill (the documents by their
    token ids, not as given: (2, 0, 1) is not that order), the full forward computes in it from the given order."""
    model, tok = _model(arch)
    ids, classes = _prompt(tok, (2, 0, 1))
    steps, last = _greedy(model, tok, (2, 0, 1), steps=3, last=True)
    full_ids = ids + steps[:2]
    with torch.no_grad(), pine(model) as handle:
        handle.rows = [classes]  # the two decoded tokens follow the prompt: SUFFIX, as in decoding
        logits = model(input_ids=torch.tensor([full_ids]), position_ids=torch.arange(len(full_ids))[None]).logits
    assert int(logits[0, -1].argmax()) == steps[2]
    assert torch.allclose(torch.log_softmax(logits[0, -1].float(), -1), last, atol=1e-4), arch


def test_the_model_is_restored_and_gpt2_is_refused():
    model, tok = _model("llama")
    ids, _ = _prompt(tok, (0, 1, 2))
    x = torch.tensor([ids])
    before = model(input_ids=x).logits
    _last_logprobs(model, tok, (0, 1, 2))
    assert torch.equal(model(input_ids=x).logits, before)
    gpt2, _ = _model("gpt2")
    with pytest.raises(PosbiasError, match="pine: .*RoPE") as e:
        with pine(gpt2):
            pass
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("task,options", [("kv-lookup", {"facts": 5}), ("judge-kv", {"bind": "candidate"}),
                                          ("mc-kv", {"bind": "candidate"})])
@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_a_pine_sweep_gives_every_example_the_same_row_at_every_slot(engine, task, options):
    """kv-lookup, and a judge and multiple choice whose labels go with their candidates, through the whole pipeline
    (spans, token classes, the Scorer's batches): each example's rows agree at every slot (the separators between
    items are documents of their own), so the position test finds no example varying; without PINE the tiny
    model's kv-lookup rows differ by slot."""
    from posbias import SweepConfig, run_sweep
    from tiny import tiny_loaded

    lo = tiny_loaded("llama", chat=False)

    def rows(method):
        res = run_sweep(SweepConfig(task=task, task_options=options, positions="all", n=3, method=method,
                                    engine=engine), loaded=lo, progress=False)
        by = {}
        for r in res.rows:
            by.setdefault(r["example_id"], set()).add((r["prediction"], r.get("logprob")))  # to the bit
        return by, res.summary["position_test"]

    by, test = rows("pine")
    assert all(len(v) == 1 for v in by.values()) and test["n"] == 0, by
    if engine == "teacher-forced" and task == "kv-lookup":
        plain, _ = rows("none")
        assert all(len(v) > 1 for v in plain.values())


def test_pine_batches_hold_rows_of_one_shape_and_its_rows_agree_at_every_slot(tmp_path, monkeypatch):
    """Items of different lengths: a padded batch that mixed rows of different shapes would size PINE's key blocks
    (their widths are the batch's longest) and pad a row by the company it keeps, and in bf16 the order of a sum
    shows: SmolLM2 on LLMBar Natural (bind=candidate) had 7 of 100 pairs whose PINE rows differed by slot, 2 when
    scored one row at a time (those two: answers ending in newlines, which BPE merges with the separator's). So a
    PINE batch holds rows of one shape (Method.batch_keys: the prefix's, documents' and suffix's lengths in the
    canonical order), as one example's orders are: every slot's row agrees to the bit; without the keys, batches mix
    shapes. Rows of one shape from different examples still share a batch (judge-kv: the plain path's batch sizes)."""
    import json

    from posbias import SweepConfig, run_sweep
    from posbias.methods.pine import Pine, _PineActive
    from tiny import tiny_loaded

    lines = [{"id": f"p{i}", "question": f"Which is {i}?", "answers": [f"it is {i}" + " really" * (i % 4),
                                                                    f"no, {i + 1}" + " surely" * (3 - i % 3)],
              "preferred": 0} for i in range(8)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    lo = tiny_loaded("llama", chat=False)
    lo.model.to(torch.bfloat16)  # bf16, as SmolLM2 and Gemma-3 run here
    lo.info["dtype"] = "bf16"
    seen = []
    set_rows, shape = _PineActive.set_rows, Pine.batch_keys
    monkeypatch.setattr(_PineActive, "set_rows", lambda self, rows, reader=None: (
        seen.append(({len(r.prompt_ids) for r in rows}, shape(Pine(), rows, reader), {r.prompt.example_id for r in
                                                                                      rows})),
        set_rows(self, rows, reader))[1])

    def differing(task, options):
        seen.clear()
        res = run_sweep(SweepConfig(task=task, task_options=options, n=8, method="pine", max_batch=8), loaded=lo,
                        progress=False)
        by = {}
        for r in res.rows:
            by.setdefault(r["example_id"], set()).add((r["prediction"], tuple(sorted(r["option_logprobs"]))))
        return sum(len(v) > 1 for v in by.values())

    assert differing(f"judge:{path}", {"bind": "candidate"}) == 0
    assert seen and all(len(lengths) == 1 and len(set(keys)) == 1 for lengths, keys, _ in seen), seen
    assert differing("judge-kv", {"bind": "candidate"}) == 0 and any(len(ids) > 1 for *_, ids in seen), seen
    monkeypatch.setattr(Pine, "batch_keys", lambda self, rows, reader: None)
    differing(f"judge:{path}", {"bind": "candidate"})
    assert any(len(lengths) > 1 or len(set(keys)) > 1 for lengths, keys, _ in seen), seen
