"""Judge templates (tasks/judge_template.py): a user's prompt with named placeholders for judge tasks, checked before
any model loads, recorded with its sha256 in the fingerprint and shown by `show`; the built-in questions
(`ask=correct|preference`) are templates on the same code path whose prompts are byte for byte those written before
templates existed."""

from __future__ import annotations

import hashlib
import json

import pytest

from posbias import PosbiasError, SweepConfig, get_task, run_sweep
from posbias.measure import show_prompt
from posbias.tasks.arrange import char_ranges
from posbias.tasks.judge_template import ASKS, builtin

pytestmark = pytest.mark.usefixtures("one_thread")

MTBENCH = """Compare the two assistants' answers to the user question below; the order must not matter.
Reply with "{label_a}" or "{label_b}".

[User Question]
{question}

[The Start of Assistant {label_a}'s Answer]
{answer_a}
[The End of Assistant {label_a}'s Answer]

[The Start of Assistant {label_b}'s Answer]
{answer_b}
[The End of Assistant {label_b}'s Answer]
"""
LLMBAR = {"prompt": "Pick the output that carries out the instruction exactly, no more and no less; a longer output is "
                    "not better for being longer. A literal {{brace}} stays.\n\n# Instruction:\n{question}\n\n"
                    "# Output ({label_a}):\n{answer_a}\n\n# Output ({label_b}):\n{answer_b}\n\n"
                    "# Which output follows the instruction, ({label_a}) or ({label_b})?",
          "answer_prefix": "Better output:", "labels": ["a", "b"]}


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _pairs(tmp_path, n=3, **extra):
    return _write(tmp_path / "pairs.jsonl", [{"id": f"p{i}", "question": f"Say {i}.", "answers": [f"{i}", f"not {i} {{x}}"],
                                              "preferred": 0, **extra} for i in range(n)])


def _template(tmp_path, content, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps(content) if isinstance(content, dict) else content)
    return path


# --- the built-in questions: the old prompts, byte for byte ------------------------------------------------------

def _old_judge_prompt(task, item, position):
    """tasks/order.py's judge prompt before templates (commit 8b2e3be), verbatim."""
    labels = task.labels_of(item)
    ref = f"Reference:\n{item.context}\n\n" if item.context else ""
    reply = " or ".join(labels) if task.k == 2 else ", ".join(labels)
    instruction, question = ASKS[task.ask]
    items = [f"[Answer {lb}]\n{c}" for lb, c in zip(labels, task.arrangement(item, position))]
    user = (instruction.format(ref=", using the reference" if item.context else "") + "\n\n"
            f"{ref}Question: {item.question}\n\n" + "\n\n".join(items) + f"\n\n{question} Reply with {reply} only.")
    return user, "Verdict:", items


@pytest.mark.parametrize("spec, options", [
    ("judge-kv", {}), ("judge-kv", {"options": 3, "ask": "preference"}), ("judge-kv", {"labels": "digits", "options": 4}),
    ("judge-nq", {}), ("judge-nq", {"reference": "no", "ask": "preference"}), ("file", {}),
    ("file", {"ask": "correct", "labels": "digits"})])
def test_the_built_in_questions_render_the_old_prompts_byte_for_byte(tmp_path, spec, options):
    if spec == "file":  # one line with a reference, one without, braces in the text
        spec = "judge:" + str(_write(tmp_path / "j.jsonl", [
            {"id": "x", "question": "Q {a}?", "answers": ["one {b}", "two"], "preferred": 1, "context": "Ref {c}."},
            {"id": "y", "question": "Q2", "answers": ["three", "four"], "preferred": 0}]))
    task = get_task(spec, **options)
    assert task.template.sha256 is None and task.config()["ask"] == task.ask and "template" not in task.config()
    for item in task.examples(2):
        for p in task.all_placements():
            prompt = task.prompt(item, p)
            assert (prompt.user, prompt.answer_prefix, list(prompt.items)) == _old_judge_prompt(task, item, p)


def test_builtins_are_templates_of_the_user_form():
    t = builtin("preference", 3).check(3)
    assert "{answer_c}" in t.prompt and "{context}" in t.with_context and "{context}" not in t.prompt


# --- a user's template -----------------------------------------------------------------------------------------------

def test_an_mtbench_text_template_and_an_llmbar_json_template_render_as_written(tmp_path):
    pairs = _pairs(tmp_path)
    mt = get_task(f"judge:{pairs}", template=str(_template(tmp_path, MTBENCH, "mt.txt")))
    item = mt.examples(1)[0]
    p = mt.prompt(item, 1)  # the preferred answer in slot 1: shown second
    first, second = mt.arrangement(item, 1)
    assert p.user == MTBENCH.rstrip("\n").format(label_a="A", label_b="B", question=item.question, answer_a=first,
                                                 answer_b=second)
    assert p.answer_prefix == "Verdict:" and p.options == ("A", "B") and p.answers == ("B",)
    char_ranges(p.user, p.items, 0, p.example_id)  # the answers are found verbatim, in slot order
    bar = get_task(f"judge:{pairs}", template=str(_template(tmp_path, LLMBAR)))
    p = bar.prompt(item, 0)
    assert "# Output (a):\n" + item.candidates[0] in p.user and "# Output (b):\n" in p.user
    assert "A literal {brace} stays." in p.user and "not 0 {x}" in p.user  # {{ }} and an answer's own braces
    assert p.answer_prefix == "Better output:" and p.options == ("a", "b") and p.answers == ("a",)
    assert bar.config()["labels"] == ["a", "b"]
    relabelled = get_task(f"judge:{pairs}", template=str(_template(tmp_path, LLMBAR)), labels="digits")
    assert relabelled.prompt(item, 0).options == ("1", "2") and "# Output (1):" in relabelled.prompt(item, 0).user


def test_the_template_is_recorded_with_its_hash_and_a_resume_with_another_is_refused(loaded, tmp_path):
    pairs, path = _pairs(tmp_path), _template(tmp_path, LLMBAR)
    cfg = SweepConfig(task=f"judge:{pairs}", task_options={"template": str(path)}, n=3)
    res = run_sweep(cfg, tmp_path / "s", loaded=loaded, progress=False)
    rec = res.record["task"]["template"]
    assert rec == {"name": "t.json", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "text": path.read_text()}
    assert "ask" not in res.record["task"]
    assert {r["prediction"] for r in res.rows} <= {"a", "b"}  # the verdicts are read as the template's labels
    run_sweep(cfg, tmp_path / "s", loaded=loaded, resume=True, progress=False)  # the same file: resumes
    path.write_text(json.dumps({**LLMBAR, "answer_prefix": "Verdict:"}))
    with pytest.raises(PosbiasError, match="template"):
        run_sweep(cfg, tmp_path / "s", loaded=loaded, resume=True, progress=False)


def test_show_names_the_template_and_prints_the_prompt_it_renders(loaded, tmp_path):
    pairs, path = _pairs(tmp_path), _template(tmp_path, LLMBAR)
    shown = show_prompt(f"judge:{pairs}", 1, loaded=loaded, chat=False, task_options={"template": str(path)})
    assert shown.judge_template == f"t.json (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()})"
    text = shown.format()
    assert f"judge template: {shown.judge_template}" in text and "# Output (a):\n" in text and "Better output:" in text
    assert show_prompt(f"judge:{pairs}", 1, loaded=loaded, chat=False).judge_template == "built-in, ask=preference"


@pytest.mark.parametrize("content, message", [
    ("Q: {question} {answer_a} {answer_b} {answer_c} {verdict}", r"unknown placeholders \{answer_c\}, \{verdict\}"),
    ("{answer_a} {answer_b}", r"has no \{question\}"),
    ("{question} {answer_a}", r"has no \{answer_b\}"),
    ("{question} {answer_b} {answer_a}", "in slot order"),
    ("{question} {answer_a} {answer_b} {answer_a}", "each once"),
    ("{question} {answer_a} {answer_b} {", "Single '{'"),
    ("{question} {answer_a} {answer_b} {}", r"unknown placeholder \{\}"),
    ("{question!r} {answer_a} {answer_b}", "conversion or format spec"),
    ({"prompt": "{question} {answer_a} {answer_b}", "system": "Be fair."}, "unknown key 'system'"),
    ({"prompt": "{question} {answer_a} {answer_b}", "labels": ["a", "a"]}, "could not be told apart"),
    ({"prompt": "{question} {answer_a} {answer_b}", "labels": ["a", "b", "c"]}, "list of 2"),
    ({"prompt": "{question} {answer_a} {answer_b}", "prompt_with_context": "{question} {answer_a} {answer_b}"},
     r"prompt_with_context has no \{context\}"),
    ({"answer_prefix": "Verdict:"}, "has no 'prompt'"),
    ('{"prompt": "x",}', "not valid JSON"),
])
def test_a_bad_template_is_refused_in_one_line_naming_what_is_wrong(tmp_path, content, message):
    name = "t.json" if isinstance(content, dict) or content.startswith('{"') else "t.txt"
    path = _template(tmp_path, content, name)
    with pytest.raises(PosbiasError, match=message) as e:
        get_task(f"judge:{_pairs(tmp_path)}", template=str(path))
    assert "\n" not in str(e.value) and name in str(e.value)


def test_unknown_placeholders_are_listed_beside_the_known_ones(tmp_path):
    path = _template(tmp_path, "{question} {answer_a} {answer_b} {answer_c}", "t.txt")
    with pytest.raises(PosbiasError) as e:
        get_task(f"judge:{_pairs(tmp_path)}", template=str(path))
    assert "{question} {context} {answer_a} {answer_b} {label_a} {label_b}" in e.value.fix and "{{" in e.value.fix


def test_a_context_the_template_would_not_show_and_other_misuse_are_refused(tmp_path):
    plain = str(_template(tmp_path, "{question} {answer_a} {answer_b}", "plain.txt"))
    with pytest.raises(PosbiasError, match=r"pairs.jsonl:1 \(id p0\) gives a 'context'.*no \{context\}"):
        get_task(f"judge:{_pairs(tmp_path, context='ref')}", template=plain)
    with pytest.raises(PosbiasError, match="judge-kv shows its facts"):
        get_task("judge-kv", template=plain)
    with pytest.raises(PosbiasError, match="judge-nq shows each question's gold passage") as e:
        get_task("judge-nq", template=plain)
    assert "reference=no" in e.value.fix
    get_task("judge-nq", template=plain, reference="no")  # as the fix says
    with pytest.raises(PosbiasError, match=r"has no \{answer_c\}") as e:
        get_task("judge-kv", options=3, template=str(_template(tmp_path, "{context} {question} {answer_a} {answer_b}",
                                                                 "kv.txt")))
    assert "options=2" in e.value.fix
    with pytest.raises(PosbiasError, match="picks a built-in judge question") as e:
        get_task(f"judge:{_pairs(tmp_path)}", template=plain, ask="correct")
    assert e.value.fix == "drop `ask`"
    with pytest.raises(PosbiasError, match="does not exist"):
        get_task(f"judge:{_pairs(tmp_path)}", template=str(tmp_path / "nope.txt"))
    with pytest.raises(PosbiasError, match="does not take `template`"):
        get_task("mc-kv", template=plain)
    both = _template(tmp_path, {"prompt": "{question} {answer_a} {answer_b}",
                                "prompt_with_context": "{context}\n{question} {answer_a} {answer_b}"})
    task = get_task(f"judge:{_pairs(tmp_path, context='REF')}", template=str(both))
    assert task.prompt(task.examples(1)[0], 0).user.startswith("REF\n")


def test_the_cli_flag_is_judge_template_and_errors_name_it(tmp_path, monkeypatch, capsys):
    import sys

    from posbias.cli import main

    plain = _template(tmp_path, "{question} {answer_a} {answer_b}", "plain.txt")
    monkeypatch.setattr(sys, "argv", ["posbias", "sweep", "--task", f"judge:{_pairs(tmp_path)}", "--judge-template",
                                      str(plain), "--ask", "correct", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.endswith("-- drop --ask") and "--ask correct" in err and "--judge-template" in err
