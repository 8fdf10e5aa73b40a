"""What a notebook does in its first ten lines: positions as a list, a model it already holds (`wrap_model`), and a
run that records the model it ran (tiny models, no weights)."""

import json

import pytest
import torch

import posbias
from conftest import char_tokenizer, tiny_model
from posbias import PosbiasError, SweepConfig, run_compare, run_sweep, wrap_model

CFG = dict(task="kv-lookup", task_options={"facts": 4, "digits": 3}, n=3, max_batch=4)


@pytest.fixture(scope="module")
def held():
    """A model and a tokenizer without a pad token, as a user holds them after their own from_pretrained."""
    tok = char_tokenizer()
    model = tiny_model("llama", len(tok)).train()  # train mode: wrap_model must put it in eval mode
    tok.pad_token = None
    return model, tok


@pytest.mark.parametrize("given, spec", [([0, 2, 3], "0,2,3"), ((0, 3), "0,3"), (2, "2"), ("0,2", "0,2"),
                                          ("all", "all"), (None, None)])
def test_positions_as_a_list_an_int_or_the_cli_string(given, spec):
    assert SweepConfig(positions=given).validate().positions == spec


@pytest.mark.parametrize("bad", [[0.5], [], True, {"a": 1}, ["0", "1"]])
def test_bad_positions_are_one_line_errors(bad):
    with pytest.raises(PosbiasError, match="`positions` must be slots"):
        SweepConfig(positions=bad).validate()


def test_pairs_as_a_list_of_tuples():
    assert posbias.get_task("kv-2hop").placements([(0, 1), (8, 9)]) == [(0, 1), (8, 9)]
    assert posbias.lpes.SearchConfig(positions=[0, 5, 9]).validate().positions == (0, 5, 9)


def test_wrap_model_sets_the_pad_token_and_eval_mode(held):
    model, tok = held
    lo = wrap_model(model, tok, name="my-finetune")
    assert isinstance(lo, posbias.Loaded) and lo.tokenizer.pad_token == tok.eos_token and not lo.model.training
    assert lo.info["name"] == "my-finetune" and lo.info["dtype"] == "fp32" and lo.info["device"] == "cpu"
    with pytest.raises(PosbiasError, match="`model` must be a transformers causal LM"):
        wrap_model("gpt2", tok)


def test_a_sweep_on_a_wrapped_model_records_and_titles_its_name(held, tmp_path):
    lo = wrap_model(*held, name="my-finetune")
    res = run_sweep(SweepConfig(**CFG, positions=[0, 3]), tmp_path / "s", loaded=lo, progress=False)
    rec = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert rec["config"]["model"] == "my-finetune" and rec["config"]["dtype"] == "fp32"  # not the default bf16
    assert rec["config"]["positions"] == "0,3" and [p["position"] for p in res.per_position] == [0, 3]
    cmp = run_compare(SweepConfig(**CFG, positions=[0, 3]), ["none", "pi:1.1"], tmp_path / "c", loaded=lo,
                      progress=False)
    assert cmp.record["config"]["model"] == "my-finetune"
    assert len(cmp.rows) == 2 * 3 * 2 and {r["method"] for r in cmp.rows} == {"none", "pi:1.1"}  # entries x n x slots
    assert {(r["example_id"], r["position"]) for r in cmp.rows if r["method"] == "none"} == \
        {(r["example_id"], r["position"]) for r in res.rows}
    assert "pi:1.1" in cmp.format() and cmp.format().count("\n") >= 2  # a header and one line per entry
    assert res.format().startswith("kv-lookup on my-finetune: 3 examples x 2 positions") and "average" in res.format()
    assert {json.loads((tmp_path / "c" / e["dir"] / "sweep.json").read_text())["config"]["model"]
            for e in cmp.entries} == {"my-finetune"}


def test_a_dtype_or_device_the_loaded_model_contradicts_is_refused(held, tmp_path):
    tok = char_tokenizer()
    lo = wrap_model(tiny_model("llama", len(tok)).to(torch.bfloat16), tok, name="half")  # bf16 on the CPU
    for asked, message in [({"dtype": "fp32"}, "`dtype=fp32` contradicts the loaded model, which is dtype bf16"),
                           ({"device": "cuda"}, "`device=cuda` contradicts the loaded model, which is device cpu")]:
        with pytest.raises(PosbiasError, match=message):
            run_sweep(SweepConfig(**CFG, **asked), tmp_path / "x", loaded=lo, progress=False)
        assert not (tmp_path / "x").exists()  # refused before the folder is written
    fp32 = wrap_model(*held, name="full")  # left at their defaults (bf16, cpu), the loaded model's values win
    assert SweepConfig(**CFG).validate().bound_to(fp32.info).dtype == "fp32"


CONFIGS = ("SweepConfig", "GridConfig", "explain.AttentionConfig", "explain.ShiftingConfig", "lpes.SearchConfig",
           "distill.DistillConfig", "moice.TrainConfig", "explain.TheoryConfig", "lpes.GAConfig")


@pytest.mark.parametrize("name", CONFIGS)
def test_public_configs_document_every_field(name):
    """`help(posbias.SweepConfig)` shows what each field means (a field's own `name:` line, or its mixin's)."""
    import dataclasses
    import re

    cls = posbias
    for part in name.split("."):
        cls = getattr(cls, part)
    for f in dataclasses.fields(cls):
        owner = next(c for c in cls.__mro__ if f.name in getattr(c, "__annotations__", {}))
        assert re.search(rf"^\s*(\w+, )*{f.name}(, \w+)*: \S", owner.__doc__ or "", flags=re.M), f"{owner.__name__}.{f.name}"
        if owner is not cls:  # an inherited field: the config names it and points to where it is described
            assert f.name in cls.__doc__ and f"`{owner.__name__}`" in cls.__doc__, f"{name}.{f.name}"
