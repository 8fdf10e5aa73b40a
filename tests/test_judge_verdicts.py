"""Judges as strangers bring them (issue 67): a template that asks for reasoning first and a verdict in a pattern
([[A]], [[B]], [[C]] for a tie) is read where the pattern puts it, a tie counts as a tie, teacher forcing scores the
labels inside the pattern; a run whose verdicts go unread says so first and prints nothing as measured; a one-slot
sweep prints no gap or position test. The reasoning-first judge is a tiny Llama taught, in a few hundred steps, to
write an explanation over two lines and then the pattern: the real generation path reads it."""

from __future__ import annotations

import json
import re

import pytest
import torch

from posbias import SweepConfig, get_task, run_sweep
from posbias.core.order import TIE, UNREAD, order_figures
from posbias.scoring.encode import encode
from posbias.tasks.judge_template import load_template

pytestmark = pytest.mark.usefixtures("one_thread")

REASONING = {"prompt": "Judge the two answers to the question. Explain first, then give your verdict as [[{label_a}]], "
                       "[[{label_b}]] or [[C]] for a tie.\n\nQuestion: {question}\n\n[{label_a}] {answer_a}\n\n"
                       "[{label_b}] {answer_b}",
             "answer_prefix": "", "verdict": "[[{label}]]", "tie": "C", "max_new_tokens": 80}
ITEMS = [{"id": "lean", "question": "Name a colour.", "answers": ["Red.", "Blue."], "preferred": 0},
         {"id": "even", "question": "Name a fruit.", "answers": ["Pear.", "Plum."], "preferred": 0},
         {"id": "right", "question": "What is 2+2?", "answers": ["4.", "5."], "preferred": 0}]


def _files(tmp_path, template=REASONING):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in ITEMS))
    tpl = tmp_path / "reasoning.json"
    tpl.write_text(json.dumps(template))
    return pairs, tpl


def _replies(item: str, position: int) -> str:
    """What the taught judge writes for each item and placement (the correct answer at `position`): a lean to slot A
    whatever it holds, a tie on the fruit, the right answer to the sum in both orders."""
    verdict = {"lean": "A", "even": "C", "right": "AB"[position]}[item]
    return f"Both answers are short.\nOn balance I pick this one. [[{verdict}]]"


def _taught_judge(task, steps: int = 400):
    """A tiny Llama (char tokenizer, no chat template) trained on the task's six prompts to write _replies."""
    from tiny import tiny_loaded

    lo = tiny_loaded("llama", chat=False)
    tok, model = lo.tokenizer, lo.model
    seqs = []
    for item in task.examples(len(ITEMS)):
        for p in (0, 1):
            prompt = encode(tok, task.prompt(item, p), chat=False, options=False).prompt_ids
            reply = tok(_replies(item.id, p), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            seqs.append((prompt, reply))
    torch.manual_seed(0)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        loss = 0.0
        for prompt, reply in seqs:
            ids = torch.tensor([prompt + reply])
            labels = ids.clone()
            labels[0, : len(prompt)] = -100
            loss = loss + model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() / len(seqs) < 0.002:
            break
    model.eval()
    return lo


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("judge")
    pairs, tpl = _files(tmp)
    task = get_task(f"judge:{pairs}", template=str(tpl))
    lo = _taught_judge(task)
    cfg = SweepConfig(task=f"judge:{pairs}", task_options={"template": str(tpl)}, n=3, engine="generate")
    return lo, cfg, run_sweep(cfg, tmp / "s", loaded=lo, progress=False)


def test_a_reasoning_first_template_is_read_at_its_verdict_and_a_tie_is_a_tie(judged):
    _, _, res = judged
    got = {(r["example_id"], r["position"]): r["choice"] for r in res.rows}
    assert got == {("lean", 0): 0, ("lean", 1): 0, ("even", 0): TIE, ("even", 1): TIE, ("right", 0): 0, ("right", 1): 1}
    assert all("\n" in r["prediction"] and not r["cut"] for r in res.rows)  # the whole reply, not its first line
    order = res.summary["order"]
    assert order["unread"] == 0 and order["tie"] == pytest.approx(2 / 6) and "unread" not in res.summary
    # slot A twice (two candidates: the bias), a tie twice (consistent), the right one twice (consistent)
    assert order["consistency"]["value"] == pytest.approx(2 / 3) and order["flips"]["items"] == 1
    assert order["strict_accuracy"]["value"] == pytest.approx(1 / 3)
    assert order["preference_fairness"]["value"] == pytest.approx(-1 / 3)  # one primacy pair of three, no tie counted
    assert res.record["config"]["max_new_tokens"] == 80  # the template's room
    assert "could not be read" not in res.format() and "unread verdicts 0.000 | ties 0.333" in res.format()


def test_teacher_forcing_scores_the_labels_inside_the_pattern(judged, tmp_path):
    lo, cfg, _ = judged
    task = get_task(cfg.task, **cfg.task_options)
    prompt = task.prompt(task.examples(1)[0], 0)
    assert prompt.verdict_head == "[["
    forced = encode(lo.tokenizer, prompt, chat=False)
    plain = encode(lo.tokenizer, prompt, chat=False, options=False)
    assert lo.tokenizer.decode(forced.prompt_ids[len(plain.prompt_ids):]) == " [["  # the pattern's head, then a label
    assert [lo.tokenizer.decode([t]) for t in forced.option_ids] == ["A", "B"]
    res = run_sweep(SweepConfig(task=cfg.task, task_options=cfg.task_options, n=3), loaded=lo, progress=False)
    assert all(r["choice"] in (0, 1) and len(r["option_logprobs"]) == 2 for r in res.rows)  # a forced choice: no tie


def test_the_verdict_pattern_reads_the_last_match_and_nothing_else():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        path.write_text(json.dumps(REASONING))
        tpl = load_template(path)
    read = lambda text: tpl.read(text, ("A", "B"))  # noqa: E731
    assert read("Format: [[A]], [[B]] or [[C]]. I choose [[ B ]]") == 1
    assert read("It is a tie. [[C]]") == TIE
    assert read("A is better.") == UNREAD and read("[[D]]") == UNREAD and read("[1]") == UNREAD


@pytest.mark.parametrize("change, message", [
    ({"verdict": "[[label]]"}, "'verdict' must be text around {label} \\(once\\)"),
    ({"verdict": None, "tie": "C"}, "there is no 'verdict'"),
    ({"tie": " C"}, "'tie' must be a label without white space"),
    ({"max_new_tokens": 0}, "'max_new_tokens' must be a whole number from 1 to 4096"),
    ({"tie": "A"}, "the tie label 'A' is also a slot's label"),
])
def test_a_bad_verdict_key_is_refused_in_one_line(tmp_path, change, message):
    from posbias import PosbiasError

    tpl = {k: v for k, v in {**REASONING, **change, "labels": ["A", "B"]}.items() if v is not None}
    pairs, path = _files(tmp_path, tpl)
    with pytest.raises(PosbiasError, match=message) as e:
        get_task(f"judge:{pairs}", template=str(path))
    assert "\n" not in str(e.value) and e.value.fix


def test_a_run_with_every_verdict_unread_says_so_first_and_prints_no_figure(judged, tmp_path):
    """The issue's run: a template asking for [[A]]/[[B]]/[[C]] and a model that answers otherwise. The untaught tiny
    model names no verdict: the first line says so with the pattern asked for and the fix; no average, gap, position
    test or order figure is printed as measured."""
    from tiny import tiny_loaded

    _, cfg, _ = judged
    res = run_sweep(cfg, loaded=tiny_loaded("llama", chat=False), progress=False)
    assert all(r["choice"] == UNREAD for r in res.rows)
    u = res.summary["unread"]
    assert (u["verdicts"], u["of"], u["measured"], u["by_slot"]) == (6, 6, False, [3, 3])
    text = res.format().splitlines()
    first = next(i for i, line in enumerate(text) if "verdicts could not be read" in line)
    assert text[first].startswith("NOT MEASURED: 6 of 6 verdicts could not be read (100%)")
    assert "[[A]], [[B]], [[C]]" in text[first] and "--engine teacher-forced" in text[first]
    figures = re.compile(r"gap \d|gap -|position effect \(|fairness -?\d|flips: \d|consistency \d|average \d")
    assert first == 0 and not [line for line in text if figures.search(line)]  # the printout's first line says why
    assert any(line.startswith("average, best, worst, gap, position test: not measured (6 of 6") for line in text)


def test_under_the_limit_the_unread_share_is_a_warning_first_and_figures_follow():
    import numpy as np

    from posbias.eval.judging import unread_lines
    from posbias.eval.sweep_text import format_table

    u = {"verdicts": 1, "of": 10, "share": 0.1, "limit": 0.2, "measured": True, "by_slot": [1, 0], "labels": ["A", "B"],
         "verdict": None, "tie": None, "example": " [1]"}
    assert unread_lines(u)[0].startswith("warning: 1 of 10 verdicts could not be read (10%): the replies name none of "
                                         "A or B (one reply: ' [1]') -- use --engine teacher-forced")
    choices = np.array([[0, 1]] * 4 + [[-1, 1]])
    summary = {"average": 0.9, "average_ci": [0.5, 1.0], "best": 1.0, "best_position": 1, "worst": 0.8,
               "worst_position": 0, "gap": 0.2, "gap_ci": [0.0, 0.6], "std": 0.1, "unread": u,
               "order": order_figures(choices, [0, 1], 2)}
    per = [{"position": p, "n": 5, "correct": c, "accuracy": c / 5, "ci_low": 0.0, "ci_high": 1.0} for p, c in ((0, 4), (1, 5))]
    text = format_table(per, summary).splitlines()
    assert text[0].startswith("warning: 1 of 10") and any(line.startswith("average 0.900") for line in text)


def test_a_one_slot_sweep_prints_no_gap_and_no_position_test(loaded):
    res = run_sweep(SweepConfig(task="kv-lookup", positions="0", n=4), loaded=loaded, progress=False)
    text = res.format()
    assert "at the one slot measured (0): no best, worst, gap or position test" in text
    assert not re.search(r"gap \d|position effect \(|best \d", text)
