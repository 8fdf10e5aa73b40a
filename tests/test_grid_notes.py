"""What a grid prints beside its cells, as `sweep` does (eval/rownotes.py): answers the generation limit cut, and
among them those that loop ("The answer is: The answer is: ..."), for which "raise max_new_tokens" is the wrong
advice; and `fill` with `sizes` refused in one line instead of `sizes` ignored. Tiny model, seconds."""

from __future__ import annotations

import itertools

import pytest

from posbias import GridConfig, PosbiasError, SweepConfig, run_grid, run_sweep
from posbias.cli import main
from posbias.eval.rownotes import format_cut, is_loop
from posbias.scoring import engines

pytestmark = pytest.mark.usefixtures("one_thread")
LOOP = "The answer is: The answer is: The answer is: The answer is: The ans"
UNFINISHED = "The special magic number mentioned in the provided text is the one that"
DONE = "1234567"


@pytest.fixture
def replies(monkeypatch):
    """Each generated row's answer in place of the model's, by turns: a loop cut at the limit, an answer cut
    mid-way, a finished one."""
    said = itertools.cycle([(LOOP, True), (UNFINISHED, True), (DONE, False)])

    def reply(scorer, pred, row, cut):
        text, cut = next(said)
        return {"correct": False, "prediction": text, "cut": cut}

    monkeypatch.setattr(engines.Generate, "_judge", staticmethod(reply))


@pytest.mark.parametrize("text, loop", [
    (LOOP, True), ("1234567 1234567 1234567 1234567 123", True), ("x" * 24, True), ("ab\n" * 12, True),
    (UNFINISHED, False), ("xxxx", False),  # too short to call a loop (the limit was 4 tokens)
    ("The answer is: 12. The answer is: 13. The answer is: 14. The answer is: 15", False),  # a list, not a loop
    ("Yes. " + "The answer is: " * 2, False),  # two copies only
])
def test_a_loop_is_one_unit_repeated_to_the_limit(text, loop):
    assert is_loop(text) == loop


def test_the_advice_for_loops_is_not_to_raise_the_limit():
    cut = {"rows": 5, "of": 9, "max_new_tokens": 16, "loops": 3, "loop_example": "The answer is: The answer is: ..."}
    unfinished, looping = format_cut(cut)
    assert unfinished.startswith("2 of 9 answers reached the 16-token limit unfinished: raise max_new_tokens")
    assert looping.startswith("3 of 9 answers reached the 16-token limit repeating themselves (e.g. 'The answer is: ")
    assert "more tokens would not end them" in looping and "raise max_new_tokens (" not in looping
    assert format_cut({**cut, "rows": 3}) == [looping]  # every cut answer loops: no advice to raise the limit
    assert format_cut({"rows": 2, "of": 9, "max_new_tokens": 16}) == [  # a sweep.json written before loops counted
        "2 of 9 answers reached the 16-token limit unfinished: raise max_new_tokens (--max-new-tokens) if they were "
        "cut mid-answer"]


def test_a_sweep_counts_looping_answers_apart_from_those_cut_mid_answer(loaded, replies):
    res = run_sweep(SweepConfig(task="kv-lookup", task_options={"digits": 3}, positions="0,2", n=3, engine="generate",
                                max_new_tokens=16), loaded=loaded, progress=False)
    assert res.summary["cut"] == {"rows": 4, "of": 6, "max_new_tokens": 16, "loops": 2, "loop_example": LOOP[:60] + " ..."}
    text = res.format()
    assert "2 of 6 answers reached the 16-token limit unfinished: raise max_new_tokens" in text
    assert "2 of 6 answers reached the 16-token limit repeating themselves" in text


def test_a_grid_prints_each_lengths_cut_answers_and_loops_as_a_sweep_does(model_dir, loaded, replies, tmp_path):
    res = run_grid(GridConfig(model=str(model_dir), task="niah", sizes="700,900", depths="0%,100%", n=3,
                              dtype="fp32", engine="generate", max_new_tokens=16), tmp_path / "g", loaded=loaded,
                   progress=False)
    text = res.format()
    for s in res.record["sizes"]:
        c = s["summary"]["cut"]
        assert c["of"] == 6 and c["rows"] == 4 and c["loops"] == 2, c
        assert f"note: at {s['size']} tokens, 2 of 6 answers reached the 16-token limit unfinished: raise" in text
        assert f"note: at {s['size']} tokens, 2 of 6 answers reached the 16-token limit repeating themselves" in text
    for name, what in (("closed", "closed-book"), ("needle", "needle-alone")):  # the references' own answers too
        c = res.record["references"][name]["cut"]
        assert c["of"] == 3 and f"note: {what} reference, " in text, c


@pytest.mark.data("nq")  # niah's default haystack
def test_fill_with_sizes_is_refused_in_one_line_and_either_fix_runs(model_dir, loaded, tmp_path, monkeypatch, capsys):
    cfg = dict(model=str(model_dir), task="niah", depths="0%,100%", n=1, dtype="fp32")
    with pytest.raises(PosbiasError) as e:
        GridConfig(**cfg, fill="30%", sizes="512").validate()
    assert "`fill`" in e.value.problem and "`sizes` (512)" in e.value.problem
    assert e.value.fix == "drop `sizes` to size them by the window, or drop `fill` to run `sizes=512`"
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", ["posbias", "grid", "--model", str(model_dir), "--task", "niah", "--fill", "30%",
                                     "--lengths", "512", "--dtype", "fp32", "--quiet", "--out", str(out)])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "--fill" in err and "--sizes 512" in err, err
    assert not out.exists()
    by_fill = run_grid(GridConfig(**cfg, fill="30%"), tmp_path / "f", loaded=loaded, progress=False)
    by_size = run_grid(GridConfig(**cfg, sizes="512"), tmp_path / "s", loaded=loaded, progress=False)
    assert [s["size"] for s in by_fill.record["sizes"]] == [614] and [s["size"] for s in by_size.record["sizes"]] == [512]
