"""`posbias show` / `posbias.measure.show_prompt`: one row's prompt exactly as the model receives it, and the chat
template's hash and default system turn in every sweep's record (tiny random models; one real-model test)."""

from __future__ import annotations

import json
import sys

import pytest

import posbias
from conftest import char_tokenizer, tiny_loaded, tiny_model
from posbias import SweepConfig, run_sweep
from posbias.errors import PosbiasError
from posbias.measure import ShownPrompt, show_prompt, show_prompts
from posbias.models.load import Loaded
from test_public_api import result_problems, row_problems

pytestmark = pytest.mark.usefixtures("one_thread")

KV = {"facts": 4, "digits": 3}
# a template that writes a system turn of its own when the conversation has none (as SmolLM2's does)
SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|system|>\nBe brief.\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def loaded_with(template: str | None, max_pos: int = 2048, name: str = "tiny") -> Loaded:
    """A tiny Llama on the character tokenizer with this chat template (None: none)."""
    tok = char_tokenizer(chat=False)
    if template is not None:
        tok.chat_template = template
    return Loaded(model=tiny_model("llama", len(tok), max_pos), tokenizer=tok,
                  info={"name": name, "context_window": max_pos, "dtype": "fp32", "device": "cpu"})


@pytest.fixture(scope="module")
def lo():
    return tiny_loaded("llama", max_pos=16384)  # nq's ten documents are ~8000 characters: one token each here


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "mine.jsonl"
    docs = [{"title": f"Place {k}", "text": f"Place {k} is a small town known for its {w} market."}
            for k, w in enumerate(["fish", "salt", "wool", "clock", "glass"])]
    rows = [{"id": f"q{i}", "question": f"Which town has the {w} market?", "answers": [f"Place {i}"],
             "documents": docs, "gold": i} for i, w in enumerate(["fish", "salt", "wool"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"jsonl:{path}"


CASES = {  # id -> (task, task options, the placement as a sweep names it, as show_prompt takes it)
    "kv-lookup": ("kv-lookup", KV, [2], 2),
    "nq": ("nq", {}, [4], "40%"),
    "kv-2hop": ("kv-2hop", KV, "0:1", "0:1"),
    "judge-kv": ("judge-kv", {}, [1], 1),
    "jsonl": (None, {}, [3], 3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_shown_prompt_is_the_row_a_sweep_scores(lo, jsonl, case, tmp_path):
    """Text, token count, example and placement are those of the sweep's row 0 with the same settings, and the gold
    item's character and token spans point at its text."""
    task, opts, positions, position = CASES[case]
    task = task or jsonl
    res = run_sweep(SweepConfig(task=task, task_options=opts, positions=positions, n=1, seed=3), loaded=lo, progress=False)
    shown = show_prompt(task, position, 0, loaded=lo, task_options=opts, seed=3)
    (row,) = res.rows
    assert (shown.example_id, shown.n_tokens) == (row["example_id"], row["prompt_tokens"])
    assert posbias.get_task(task, **opts).placements(positions) == [shown.position]
    enc = lo.tokenizer(shown.text, add_special_tokens=False, return_offsets_mapping=True)  # chat: no specials added
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    assert len(ids) == shown.n_tokens and shown.chat_used and shown.text.endswith(shown.answer_prefix + (
        " " if shown.options else ""))  # an order task: the labels' shared leading space joins the prompt
    assert [g["slot"] for g in shown.gold] == (list(shown.position) if isinstance(shown.position, tuple) else [shown.position])
    for g in shown.gold:
        a, b = g["chars"]
        assert shown.text[a:b] == g["text"]
        s, e = g["tokens"]
        assert (offsets[s][0], offsets[e - 1][1]) == (a, b)  # its first token starts it, its last ends it
    assert shown.answers == list(row["answers"])
    if case == "judge-kv":
        assert shown.options == ["A", "B"] and "options: A, B" in shown.format()
    if case == "kv-2hop":
        assert "first-hop item at slot 0" in shown.format() and "second-hop item at slot 1" in shown.format()


def test_the_result_is_typed_like_every_public_result(lo):
    shown = show_prompt("kv-lookup", 3, loaded=lo, task_options=KV)
    assert result_problems(ShownPrompt) == [] and row_problems(shown.rows) == []
    assert json.loads(json.dumps(shown.record)) == shown.record and "text" not in shown.rows[0]
    text = shown.format()
    assert text.startswith(f"task kv-lookup, example {shown.example_id} at slot 3: {shown.n_tokens} tokens")
    assert shown.text in text and f"tokens {shown.gold[0]['tokens'][0]} to" in text


def test_a_template_that_adds_a_system_turn_is_reported():
    lo = loaded_with(SYSTEM_TEMPLATE)
    shown = show_prompt("kv-lookup", 1, loaded=lo, task_options=KV)
    assert shown.system == "Be brief." and shown.text.startswith("<|system|>\nBe brief.\n<|user|>\n")
    assert "(system turn: 'Be brief.')" in shown.format().splitlines()[0]
    plain = show_prompt("kv-lookup", 1, loaded=tiny_loaded("llama"), task_options=KV)  # a template with no system turn
    assert plain.system is None and plain.chat_used and "(no system turn)" in plain.format()
    off = show_prompt("kv-lookup", 1, loaded=lo, task_options=KV, chat="off")
    assert (off.chat_used, off.system, off.template_sha256) == (False, None, None) and "chat template off" in off.format()
    assert off.text.startswith("Below is a list")


def test_the_template_hash_and_system_turn_are_in_the_run_fingerprint(tmp_path):
    """Two templates give two fingerprints; without the template (chat off) the record has no `template`."""
    cfg = SweepConfig(task_options=KV, positions=[0], n=1)
    got = {}
    for name, template in (("system", SYSTEM_TEMPLATE), ("plain", char_tokenizer().chat_template)):
        lo = loaded_with(template)
        run_sweep(cfg, tmp_path / name, loaded=lo, progress=False)
        config = json.loads((tmp_path / name / "run.json").read_text())["fingerprint"]["config"]
        shown = show_prompt("kv-lookup", 0, loaded=lo, task_options=KV)
        assert config["template"] == {"sha256": shown.template_sha256, "system": shown.system}
        got[name] = config["template"]
    assert got["system"]["sha256"] != got["plain"]["sha256"] and len(got["plain"]["sha256"]) == 64
    assert (got["system"]["system"], got["plain"]["system"]) == ("Be brief.", None)
    off = run_sweep(SweepConfig(task_options=KV, positions=[0], n=1, chat="off"), loaded=loaded_with(SYSTEM_TEMPLATE),
                    progress=False)
    assert "template" not in off.config and off.config["chat_used"] is False


def test_bad_input_is_one_error():
    lo = tiny_loaded("llama")
    for position, words in ((9, "out of range"), ("0,2", "names 2 placements"), ("all", "names 4 placements"),
                            ("0:1", "pairs of slots")):
        with pytest.raises(PosbiasError, match=words) as e:
            show_prompt("kv-lookup", position, loaded=lo, task_options=KV)
        assert "`positions" not in str(e.value)  # the parameter here is `position`
    with pytest.raises(PosbiasError, match=r"names \d+ placements"):
        show_prompt("kv-2hop", "connected,reversed,disconnected", loaded=lo, task_options=KV)
    with pytest.raises(PosbiasError, match="unknown task"):
        show_prompt("nope", loaded=lo)
    pool = posbias.get_task("nq").pool_size
    with pytest.raises(PosbiasError, match=f"no example {pool}"):
        show_prompt("nq", 0, pool, loaded=lo)
    with pytest.raises(PosbiasError, match="served without a tokenizer"):
        show_prompt("kv-lookup", model="openai:model=m,base_url=http://127.0.0.1:9/v1")
    assert show_prompt("kv-2hop", (2, 0), loaded=lo, task_options=KV).position == (2, 0)  # one pair from Python
    assert show_prompt("kv-lookup", loaded=lo, task_options=KV).position == 0  # the task's first default placement


def _cli(monkeypatch, capsys, *args):
    from posbias.cli import main

    monkeypatch.setattr(sys, "argv", ["posbias", "show", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_the_cli_prints_the_prompt_of_a_saved_model(model_dir, monkeypatch, capsys):
    """`--model DIR` loads only the tokenizer; the text is show_prompt's format(), --json its record; a bad
    position is one line and exit status 2."""
    args = ["--model", str(model_dir), "--facts", "4", "--digits", "3", "--seed", "2", "--example", "1"]
    code, out, err = _cli(monkeypatch, capsys, *args, "--position", "3")
    want = show_prompt("kv-lookup", 3, 1, model=str(model_dir), task_options=KV, seed=2)
    assert code == 0 and out == want.format() + "\n" and "<|assistant|>\nThe code for" in out
    code, out, _ = _cli(monkeypatch, capsys, *args, "--position", "100%", "--json")
    assert code == 0 and json.loads(out) == want.record
    code, out, err = _cli(monkeypatch, capsys, *args, "--position", "7")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert err.startswith("posbias: error: position 7 is out of range") and " -- " in err
    code, out, err = _cli(monkeypatch, capsys, *args, "--position", "0,1")  # several: each prompt in turn
    assert code == 0 and out.startswith("[1 of 2] task kv-lookup") and "\n\n[2 of 2] task kv-lookup" in out, err


@pytest.mark.parametrize("task, spec, want", [
    ("kv-lookup", "all", [0, 1, 2, 3]), ("kv-lookup", "0,2,3", [0, 2, 3]), ("kv-lookup", "0%,100%", [0, 3]),
    ("kv-2hop", "0:1,3:2", [(0, 1), (3, 2)]), ("kv-2hop", "connected", "connected"),
])
def test_the_cli_shows_every_placement_a_positions_spec_names(model_dir, monkeypatch, capsys, task, spec, want):
    """`--position` takes what `--positions` takes (the forms show's own hints and sweep's suggest): one prompt per
    placement, in the sweep's order, each show_prompt's; --json a list of their records."""
    args = ["--model", str(model_dir), "--task", task, "--facts", "4", "--digits", "3", "--position", spec]
    code, out, err = _cli(monkeypatch, capsys, *args)
    placed = posbias.get_task(task, **KV).placements(spec)
    assert want == "connected" or placed == want
    shown = [show_prompt(task, p, model=str(model_dir), task_options=KV) for p in placed]
    assert code == 0 and out == "\n\n".join(f"[{k} of {len(shown)}] {s.format()}" for k, s in enumerate(shown, 1)) + "\n", err
    code, out, err = _cli(monkeypatch, capsys, *args, "--json")
    assert code == 0 and json.loads(out) == [s.record for s in shown], err


def test_show_prompts_resolves_a_spec_as_a_sweep_does(lo):
    got = show_prompts("kv-lookup", "all", 1, loaded=lo, task_options=KV, seed=2)
    assert [s.position for s in got] == [0, 1, 2, 3]
    assert [s.record for s in got] == [show_prompt("kv-lookup", p, 1, loaded=lo, task_options=KV, seed=2).record
                                       for p in range(4)]
    assert [s.position for s in show_prompts("kv-2hop", [(2, 0), (0, 1)], loaded=lo, task_options=KV)] == [(2, 0), (0, 1)]
    assert [s.position for s in show_prompts("kv-lookup", loaded=lo, task_options=KV)] == [0]  # the first default
    for kw, words in (({"positions": "9"}, "out of range"), ({"example": -1}, "no example -1"), ({"skip": -1}, "skip")):
        with pytest.raises(PosbiasError, match=words) as e:
            show_prompts("kv-lookup", **{"positions": "0", **kw}, loaded=lo, task_options=KV)
        assert "`positions" not in str(e.value)  # the parameter is show's `position` (the CLI's --position)


def test_the_placements_given_as_pairs_are_refused_naming_position(model_dir, monkeypatch, capsys):
    """--pairs is kv-uuid's pair count; placements given as --pairs (as two-hop tasks once took them) are refused in
    one line naming show's --position, and the hint followed shows the prompt."""
    args = ["--model", str(model_dir), "--task", "kv-2hop", "--facts", "4", "--digits", "3"]
    code, _, err = _cli(monkeypatch, capsys, *args, "--pairs", "0:1")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--pairs is kv-uuid's count of key-value pairs, and task kv-2hop takes none" in err, err
    assert "-- use --position 0:1 and drop --pairs" in err, err
    code, out, err = _cli(monkeypatch, capsys, *args, "--position", "0:1")  # the hint, followed
    assert code == 0 and "at slot 0:1" in out, err


def test_smollm2s_default_system_turn_and_token_count(smollm2):
    """SmolLM2's template adds a system turn of its own to every prompt; show reports it, and its token count is the
    sweep's for kv-lookup slot 5; the tokenizer alone (no `loaded`) gives the very same prompt."""
    shown = show_prompt("kv-lookup", 5, loaded=smollm2)
    assert shown.system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert shown.text.startswith("<|im_start|>system\n" + shown.system + "<|im_end|>\n<|im_start|>user\n")
    res = run_sweep(SweepConfig(positions=[5], n=1), loaded=smollm2, progress=False)
    assert res.rows[0]["prompt_tokens"] == shown.n_tokens and res.rows[0]["example_id"] == shown.example_id
    assert res.config["template"] == {"sha256": shown.template_sha256, "system": shown.system}
    alone = show_prompt("kv-lookup", 5)
    assert alone.record == {**shown.record, "model": alone.model} and alone.model == "smollm2-135m"
    s, e = shown.gold[0]["tokens"]
    assert shown.gold[0]["text"] in smollm2.tokenizer.decode(
        smollm2.tokenizer(shown.text, add_special_tokens=False)["input_ids"][s:e])


def test_an_unknown_setting_or_a_negative_skip_is_refused_in_one_line():
    """show_prompt's settings are a sweep's config names (ShowSettings): a misspelt one is named, not ignored."""
    lo = tiny_loaded("llama")
    with pytest.raises(PosbiasError, match="show_prompt takes no setting 'seeds'.*use settings among: model, chat, seed"):
        show_prompt("kv-lookup", 0, loaded=lo, seeds=3)
    with pytest.raises(PosbiasError, match="`skip` must be >= 0"):
        show_prompts("kv-lookup", "0,1", loaded=lo, skip=-1)
