"""Where niah's needle goes in real, hard-wrapped prose (tasks/depths.py, tasks/haystack.py, tasks/text.py): only
after a sentence's end, never after a title, a colon or a dash; long quotations split at their own sentence ends;
a one-file haystack's seam marked by a paragraph break; asked depths that land on one place refused before any row
is scored; true depths further than the tolerance printed (sweep) and each grid cell's mean true depth shown.

The haystack, tests/data/keeper.txt, was written for these tests (hard-wrapped at 70 columns): a title page of
lines without a period and with numbers (VOLUME II, 1881), a paragraph that ends in a colon and a dash ("wrote to
the Board as follows:--"), and a quoted letter of two paragraphs, nine sentences, left open at the first paragraph's
end as old books print them. The tiny character-level model counts one token per character."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posbias import GridConfig, PosbiasError, SweepConfig, run_grid, run_sweep
from posbias.scoring.scorer import Scorer
from posbias.tasks import get_task
from posbias.tasks.depths import TOLERANCE, nearest
from posbias.tasks.text import QUOTE_SPLIT, sentences, text_files

pytestmark = pytest.mark.usefixtures("one_thread")
DATA = Path(__file__).parent / "data"
KEEPER, SF = DATA / "keeper.txt", DATA / "sf-needle.jsonl"
NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
TEXT = KEEPER.read_text()
UNITS = sentences(TEXT)
LAST, FIRST = UNITS[-1], UNITS[0]  # the file's last sentence and its title's first line


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    """Run from the repository's root: a haystack window is seeded by the haystack's path as given, and these tests
    give the relative path (the windows, and the figures measured on them, are the same on every checkout)."""
    monkeypatch.chdir(Path(__file__).parent.parent)


@pytest.fixture
def needles(tmp_path) -> Path:
    """NIAH's needle on 40 lines: 40 examples, each its own seeded window of the haystack."""
    p = tmp_path / "sf40.jsonl"
    p.write_text(SF.read_text() * 40)
    return p


def _task(loaded, needles, tokens=1024, haystack="tests/data/keeper.txt"):
    task = get_task("niah", tokens=tokens, needle=str(needles), haystack=str(haystack))
    Scorer(loaded, task, "generate")  # binds the model's token counters
    return task


def _hay(prompt) -> str:
    """The haystack of a prompt: between the intro and the question (paragraph breaks inside it kept)."""
    return prompt.user.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]


def test_the_test_haystack_is_hard_wrapped_prose_with_what_the_issue_names():
    assert max(map(len, TEXT.splitlines())) <= 71 and TEXT.count("\n") > 60
    colon = next(u for u in UNITS if u.endswith("as follows:--"))
    letter = TEXT[TEXT.index('"Sir,'):TEXT.index('servant."') + 9]
    assert len(colon) > 150 and len(letter) > 2 * QUOTE_SPLIT and len(re.findall(r"[.]\s", letter)) >= 8
    assert UNITS[:6] == ["THE KEEPER'S YEAR", "Letters from the Harrow Point Light",
                         "Written Down by Its Keeper and Now Printed for His Friends", "VOLUME II", "1881", "CHAPTER I"]


# ----------------------------------------------------------------------------- long quotations

def test_a_quotation_longer_than_quote_split_is_split_at_its_own_sentence_ends():
    first = next(u for u in UNITS if u.startswith('"Sir,'))
    assert first == '"Sir, I have the honour to report that the station at Harrow Point is in good order.'
    assert max(len(u) for u in UNITS if '"' in u) < QUOTE_SPLIT  # no unit holds the letter whole
    assert 'I have the honour to remain your obedient servant."' in UNITS
    short = 'He said "Stop. Now." Then he left. She wrote: "Come at once. Bring the lamp. It is dark here."'
    assert sentences(short) == ['He said "Stop. Now."', "Then he left.",  # short quotations stay whole
                                'She wrote: "Come at once. Bring the lamp. It is dark here."']
    open_para = '"' + " ".join(f"Line {i} of the letter is here." for i in range(12))  # open to its paragraph's end
    assert len(sentences(open_para)) == 12 and len(sentences(open_para[:120])) == 1


# ----------------------------------------------------------------------------- the needle follows a sentence's end

def test_the_needle_goes_only_after_a_sentences_end_never_after_a_colon_a_dash_or_a_title(loaded, needles):
    task = _task(loaded, needles)
    seen = {"seam": 0, "colon_window": 0}
    for ex in task.examples(40):
        units, offsets, seams, bounds = task._fit(ex)
        seen["colon_window"] += any(u.endswith(":--") for u in units)
        for slot in range(0, 1001, 5):  # each depth on its own: no check of asked depths against each other
            hay = _hay(task.build(ex, slot))
            before, after = hay[:hay.index(NEEDLE)].rstrip(), hay[hay.index(NEEDLE) + len(NEEDLE):]
            assert not before or re.search(r"[.!?][\"')\]]*$", before) or after.startswith("\n\n"), before[-60:]
            assert not before.endswith((":", "-", ":--")) and not before.endswith(tuple(UNITS[:6])), before[-60:]
            seen["seam"] += after.startswith("\n\n")
    assert seen["colon_window"] >= 2 and seen["seam"] > 0  # the colon's paragraph was there to be avoided


# ----------------------------------------------------------------------------- the seam of a one-file haystack

def test_a_one_file_haystack_marks_where_it_wraps_round_with_a_paragraph_break(loaded, needles):
    task = _task(loaded, needles)
    seam = re.compile(re.escape(LAST) + f"( {re.escape(NEEDLE)})?\n\n" + re.escape(FIRST + " "))
    wrapped = 0
    for ex in task.examples(40):
        hay = _hay(task.build(ex, 500))
        wraps = LAST in hay and FIRST in hay
        wrapped += wraps
        assert bool(seam.search(hay)) == wraps and hay.count("\n\n") == wraps  # the one break: the seam
    assert wrapped >= 3 and len(text_files(str(KEEPER), ())) == 1


def test_a_folder_haystack_marks_each_files_start(loaded, needles, tmp_path):
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "a.txt").write_text("Alpha one is here. Alpha two is here.\n" * 15)
    (folder / "b.txt").write_text("Title Bee\n\n" + "Beta one is here. Beta two is here.\n" * 15)
    task = _task(loaded, needles, tokens=1200, haystack=folder)
    for ex in task.examples(3):
        parts = _hay(task.build(ex, 500)).split("\n\n")
        assert len(parts) >= 2 and all(p.startswith(("Alpha one", "Title Bee Beta one")) for p in parts[1:]), parts


# ----------------------------------------------------------------------------- depths: measured, refused, printed

def test_the_documented_depth_figures_at_1k_tokens_hold(loaded, needles):
    """tasks/depths.py and docs/long-context.md: at 1K tokens of this tokenizer (540-780 characters of haystack),
    depths 0-100% by 10 over 40 windows of keeper.txt, the worst distance from the asked depth is 20.0 points and 105
    of 440 placements lie further than the tolerance."""
    task = _task(loaded, needles)
    off = []
    for ex in task.examples(40):
        _, offsets, _, bounds = task._fit(ex)
        off += [abs(100 * offsets[nearest(offsets, bounds, d)] / offsets[-1] - d) for d in range(0, 101, 10)]
    assert TOLERANCE == 5.0 and round(max(off), 1) == 20.0 and sum(o > TOLERANCE for o in off) == 105


def test_asked_depths_that_land_on_one_place_are_refused_before_any_row_with_a_length_that_works(loaded, needles,
                                                                                                  tmp_path):
    opts = {"needle": str(needles), "haystack": "tests/data/keeper.txt", "tokens": 1024}
    every = ",".join(f"{d}%" for d in range(0, 101, 10))
    with pytest.raises(PosbiasError) as e:
        run_sweep(SweepConfig(task="niah", task_options=opts, positions=every, n=8, max_new_tokens=2), tmp_path / "s",
                  loaded=loaded, progress=False)
    m = re.search(r"the depths (\d+)% and (\d+)% put the needle of (\S+) at one place", e.value.problem)
    assert m and "after a sentence's end" in e.value.problem and "\n" not in str(e.value)
    assert not (tmp_path / "s" / "examples.jsonl").exists()  # refused before any row was scored
    longer = int(re.search(r"`tokens=(\d+)` or more", e.value.fix)[1])
    assert longer > 1024 and "depths further apart" in e.value.fix and "shorter sentences" in e.value.fix
    task = _task(loaded, needles, tokens=longer)  # the fix works for the example named
    ex = next(x for x in task.examples(8) if x.id == m[3])
    assert task.depth_clash(ex, task.placements(every)) is None
    assert _task(loaded, needles).depth_clash(ex, task.placements(every)) is not None


def test_a_sweep_prints_the_true_depth_of_needles_further_than_the_tolerance(loaded, needles):
    opts = {"needle": str(needles), "haystack": "tests/data/keeper.txt", "tokens": 1024}
    res = run_sweep(SweepConfig(task="niah", task_options=opts, positions="0%,30%,50%,70%,100%", n=8,
                                max_new_tokens=2), loaded=loaded, progress=False)
    text = res.format()
    for d in res.summary["true_depths"]:
        true = [r["needle_depths"][0] for r in res.rows if r["position"] == d["position"]]
        far = [t for t in true if abs(t - d["asked"]) > TOLERANCE]
        assert d["n"] == 8 and d["off"] == len(far) and d["mean"] == pytest.approx(sum(true) / 8, abs=0.01)
        line = f"depth {d['asked']:g}%: {len(far)} of 8 needles sit more than 5 points away (true depth {d['mean']:g}%"
        assert (line in text) == bool(far), (line, text)
    assert sum(d["off"] for d in res.summary["true_depths"]) >= 3  # the case the notes are for is here
    assert not any(f"depth {d:g}%:" in text for d in (0, 100))  # the edges are exact


def test_a_grid_cell_shows_its_needles_mean_true_depth_and_a_clash_is_refused_before_any_length(model_dir, loaded,
                                                                                                  needles, tmp_path):
    opts = {"needle": str(needles), "haystack": "tests/data/keeper.txt"}
    base = dict(model=str(model_dir), task="niah", task_options=opts, n=4, dtype="fp32", max_new_tokens=2)
    res = run_grid(GridConfig(sizes="1024", depths="0%,50%,100%", **base), tmp_path / "g", loaded=loaded,
                   progress=False)
    text = res.format()
    for c in res.record["cells"]:
        true = [r["needle_depths"][0] for r in res.rows if r["depth"] == c["depth"]]
        assert c["true_depth"] == pytest.approx(sum(true) / len(true), abs=0.01)
        row = next(line for line in text.splitlines() if line.startswith(f"{c['depth']}%".rjust(6)))
        assert f"{c['accuracy']:.2f} ({c['true_depth']:.1f})" in row
    assert "the needles' mean true depth" in text
    with pytest.raises(PosbiasError) as e:
        run_grid(GridConfig(sizes="1024,1800", depths="linear:11", **base), tmp_path / "c", loaded=loaded,
                 progress=False)
    assert "at 1024 tokens the depths" in e.value.problem and "in `sizes` or by `fill`" in e.value.fix
    assert not list((tmp_path / "c").glob("size-*"))  # before any length ran
