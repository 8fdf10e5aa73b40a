"""Generation limits that suit the data: a user's QA file derives max_new_tokens from its longest answer, and every
generated answer says whether the limit cut it short (in-process on both scoring paths; served in test_conformance),
counted in the sweep's summary and printed."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_loaded
from posbias import SweepConfig, run_sweep


def _forced(char: str):
    """A tiny model whose greedy choice is always `char` (a hook lifts its logit far above the others)."""
    lo = tiny_loaded("llama")
    target = lo.tokenizer.convert_tokens_to_ids(char)

    def lift(module, inputs, out):
        out[..., target] += 1e4
        return out

    lo.model.get_output_embeddings().register_forward_hook(lift)
    return lo


def _file(tmp_path, answer: str = "1907"):
    lines = [{"id": f"q{i}", "question": f"When did station {i} open?", "answers": [answer if i == 0 else "1907"],
              "documents": [f"Station {i} opened in 1907.", f"Station {i + 5} opened in 1911.", "The line is long."],
              "gold": 0} for i in range(3)]
    p = tmp_path / "qa.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_a_files_limit_is_derived_from_its_longest_answer_and_recorded(tmp_path):
    lo = tiny_loaded("llama")
    long = "the station opened in the summer of 1907, two years after the line"
    res = run_sweep(SweepConfig(task=f"jsonl:{_file(tmp_path, long)}", positions="0", n=1), tmp_path / "r", loaded=lo,
                    progress=False)
    tokens = len(lo.tokenizer(" " + long, add_special_tokens=False)["input_ids"])  # characters, for this tokenizer
    assert res.config["max_new_tokens"] == 48 + tokens
    assert res.config["max_new_tokens_from"] == f"48 + the file's longest answer ({tokens} tokens)"
    fingerprint = json.loads((tmp_path / "r" / "run.json").read_text())["fingerprint"]["config"]
    assert fingerprint["max_new_tokens"] == 48 + tokens  # a longer answer in the file is another run
    given = run_sweep(SweepConfig(task=f"jsonl:{_file(tmp_path, long)}", positions="0", n=1, max_new_tokens=5),
                      loaded=lo, progress=False)
    assert given.config["max_new_tokens"] == 5 and "max_new_tokens_from" not in given.config


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("char, cut", [("x", True), ("\n", False)])
def test_answers_cut_at_the_limit_are_flagged_and_counted(tmp_path, shared, char, cut):
    lo = _forced(char)
    res = run_sweep(SweepConfig(task=f"jsonl:{_file(tmp_path)}", positions="0,2", n=3, max_new_tokens=4,
                                prefix_sharing=shared), loaded=lo, progress=False)
    assert [r["cut"] for r in res.rows] == [cut] * 6
    assert res.summary["cut"] == {"rows": 6 if cut else 0, "of": 6, "max_new_tokens": 4}
    assert ("6 of 6 answers reached the 4-token limit" in res.format()) == cut
    if cut:
        assert all(r["prediction"] == "xxxx" for r in res.rows), res.rows[0]["prediction"]
