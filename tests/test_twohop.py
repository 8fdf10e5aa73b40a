"""Two-hop reasoning: placements and modes, the tasks (musique, kv-2hop, two-hop JSONL), the reasoning metric,
pair sweeps (per-mode summary, heatmap, resume, compare), and Pos2Distill-R2 with its baselines on identical data."""

from __future__ import annotations

import json

import pytest

from conftest import dies_after
from posbias import PosbiasError, SweepConfig, get_task, load_model, run_compare, run_sweep
from posbias.core.metrics import final_answer, reasoning_em, subspan
from posbias.distill import DistillConfig, run_distill
from posbias.scoring import engines
from posbias.tasks import mode_of, move2, resolve_pairs

pytestmark = pytest.mark.usefixtures("one_thread")

PAPER_TABLE5 = [(0, 1), (5, 6), (12, 13), (17, 18), (0, 8), (5, 13), (6, 14), (8, 16), (8, 0), (13, 5), (14, 6), (16, 8)]


def test_modes_are_the_papers_placements_and_scale_to_other_sizes():
    assert resolve_pairs("connected,disconnected,reversed", 20) == PAPER_TABLE5
    ten = resolve_pairs("connected,disconnected,reversed", 10)
    assert len(ten) == 12 and all(0 <= i < 10 and 0 <= j < 10 and i != j for i, j in ten)
    assert [mode_of(p) for p in ten] == ["connected"] * 4 + ["disconnected"] * 4 + ["reversed"] * 4
    assert resolve_pairs("0:1,5:13,0:1", 20) == [(0, 1), (5, 13)]
    assert len(resolve_pairs("all", 5)) == 20 and len(resolve_pairs("grid:2", 5)) == 6  # slots 0, 2, 4
    for bad, msg in [("3:3", "both hops in slot 3"), ("0:20", "out of range"), ("0-1", "bad pair"), ("grid:x", "grid step")]:
        with pytest.raises(PosbiasError, match=msg):
            resolve_pairs(bad, 20)


def test_two_slots_place_the_hops_both_ways_and_refuse_a_gap():
    two = get_task("kv-2hop", facts=2)
    assert two.placements(None) == [(0, 1), (1, 0)]  # the default modes need a slot between the hops
    assert [two.build(two.examples(1)[0], p).position for p in two.placements(None)] == [(0, 1), (1, 0)]
    for mode in ("disconnected", "reversed"):
        with pytest.raises(PosbiasError, match="need at least 3 slots"):
            two.placements(mode)
    with pytest.raises(PosbiasError, match="is empty"):
        two.placements("")


def test_move2_places_both_hops_and_keeps_the_rest_in_order():
    items = list("ABCDEFG")
    assert move2(items, 0, 1, 5, 2) == ["C", "D", "B", "E", "F", "A", "G"]
    assert move2(items, 3, 1, 0, 6) == ["D", "A", "C", "E", "F", "G", "B"]


def test_musique_hops_follow_the_question_decomposition():
    task = get_task("musique")
    ex = task.examples(1)[0]
    p = task.build(ex, (17, 18))
    docs = [line for line in p.user.splitlines() if line.startswith("Document [")]
    assert len(docs) == 20 and p.position == (17, 18)
    assert ex.docs[ex.hops[0]].title in docs[17] and ex.docs[ex.hops[1]].title in docs[18]
    assert p.user.startswith("Let's first identify the relevant information") and "The answer is:" in p.user
    assert task.gold_target(p) == f"The answer is: {ex.answers[0]}"
    short = get_task("musique", docs=10)
    e10 = short.examples(1)[0]
    assert len(e10.docs) == 10 and e10.docs[0] == ex.docs[ex.hops[0]] and e10.docs[1] == ex.docs[ex.hops[1]]
    assert "citing" in get_task("musique", prompt="coc").build(ex, (0, 1)).user


def test_kv_2hop_is_a_chain_whose_hops_move_alone():
    task = get_task("kv-2hop", facts=6)
    ex = task.examples(1)[0]
    (a, b), (b2, c) = ex.pairs[0], ex.pairs[1]
    assert b == b2 and len({k for k, _ in ex.pairs}) == 6
    p, q = task.build(ex, (4, 5)), task.build(ex, (5, 0))
    assert p.answers == (c,) and p.answer_prefix == f"The code for the code for {a} is"
    assert sorted(p.user.splitlines()) == sorted(q.user.splitlines())  # the same facts, only the hops moved
    facts = [x for x in p.user.splitlines() if x.startswith("The code for")]
    assert facts[4] == f"The code for {a} is {b}." and facts[5] == f"The code for {b} is {c}."
    cot = get_task("kv-2hop", style="cot")
    assert cot.metric == "reasoning_em" and cot.multiline and cot.build(cot.examples(1)[0], (0, 1)).answer_prefix == ""


def test_two_hop_jsonl(tmp_path):
    good = {"question": "q", "answers": ["a"], "documents": ["w", "x", "y", "z"], "gold": [2, 0]}
    p = tmp_path / "h.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "gold": [1, 3]}) + "\n")
    task = get_task(f"jsonl:{p}")
    assert task.n_gold == 2 and task.metric == "reasoning_em"
    prompt = task.build(task._example(0), (0, 3))
    assert "Document [1](Title: ) y" in prompt.user and "Document [4](Title: ) w" in prompt.user
    for gold, msg in [([1, 1], "two different"), ([0, 9], "gold=\\[0, 9\\]"), ([0], "two different")]:
        p.write_text(json.dumps({**good, "gold": gold}) + "\n")
        with pytest.raises(PosbiasError, match=msg):
            get_task(f"jsonl:{p}")
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "gold": 1}) + "\n")
    with pytest.raises(PosbiasError, match="mixes one gold document and a pair"):
        get_task(f"jsonl:{p}")


def test_reasoning_metric_reads_the_text_after_the_last_marker():
    assert final_answer("x\nThe answer is: Paris.\nmore") == "Paris."
    assert final_answer("The answer is: A. Then the answer is: B") == "B"
    assert reasoning_em("So... The answer is: the Paris", ["Paris"]) and not reasoning_em("Paris", ["Paris"])
    assert not reasoning_em("The answer is: Paris, France", ["Paris"]) and subspan("The answer is: Paris, France", ["Paris"])


@pytest.mark.parametrize("text", [
    "The answer is:\nParis",  # the answer on the next line
    "Step 2: ...\nThe answer is:\n\n  Paris\n",  # after blank lines and indentation
    "The answer is: **Paris**",  # markdown emphasis
    "**The answer is:** Paris",  # the marker in bold
    "### The answer is:\n**Paris**",  # a heading, the answer in bold on the next line
    "The answer is: Paris\nDocument 3 says the answer is supported by Document 3.",  # a later colon-less phrase
    "The answer is: Paris\nThe answer is supported by Document 3",  # ... even when it starts a line
    "THE ANSWER IS: paris",  # any case
])
def test_reasoning_em_finds_the_explicit_answer(text):
    """Pos2Distill App. C scores the part after "The answer is:"; a newline or markdown after the marker is
    layout, and only the explicit marker with its colon counts (a later "the answer is supported by ..." does not
    replace an earlier "The answer is: Paris")."""
    assert reasoning_em(text, ["Paris"]), final_answer(text)


@pytest.mark.parametrize("text", ["the answer is Paris", "The answer is Paris.", "Paris", "The answer is:", ""])
def test_reasoning_em_needs_the_marker_and_an_answer(text):
    assert not reasoning_em(text, ["Paris"])


# -- pair sweeps ----------------------------------------------------------------------------------------


def _cfg(model_dir, **kw) -> SweepConfig:
    return SweepConfig(**{"model": str(model_dir), "task": "kv-2hop", "task_options": {"facts": 6, "digits": 3}, "n": 4,
                          "dtype": "fp32", "max_batch": 8, **kw})


def test_pair_sweep_reports_modes_draws_a_heatmap_and_resumes(model_dir, loaded, tmp_path, monkeypatch):
    res = run_sweep(_cfg(model_dir), tmp_path / "a", loaded=loaded, progress=False)
    assert [tuple(p["position"]) for p in res.per_position] == resolve_pairs("connected,disconnected,reversed", 6)
    assert {p["mode"] for p in res.per_position} == {"connected", "disconnected", "reversed"}
    s = res.summary
    assert set(s["modes"]) == {"connected", "disconnected", "reversed"}
    assert s["mode_gap"] == pytest.approx(max(s["modes"].values()) - min(s["modes"].values()))
    assert (tmp_path / "a" / "heatmap.png").stat().st_size > 1000 and isinstance(s["best_position"], str)
    restore = dies_after(monkeypatch, engines, "score_teacher_forced", 3)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_cfg(model_dir), tmp_path / "b", loaded=loaded, progress=False)
    restore()
    run_sweep(_cfg(model_dir), tmp_path / "b", loaded=loaded, resume=True, progress=False)
    assert (tmp_path / "b" / "sweep.json").read_text() == (tmp_path / "a" / "sweep.json").read_text()


def test_compare_on_pair_sweeps_prints_the_modes(model_dir, loaded, tmp_path):
    res = run_compare(_cfg(model_dir, positions="0:1,5:0,2:4"), ["none", "pi:1.5"], tmp_path / "c", loaded=loaded,
                      progress=False)
    table = res.format()
    assert "0:1" in table and "mode gap" in table and (tmp_path / "c" / "compare.png").exists()


# -- Pos2Distill-R2 ------------------------------------------------------------------------------------------


def _r2(model_dir, **kw) -> DistillConfig:
    return DistillConfig.from_preset("cpu", stage="r2", **{"model": str(model_dir), "task": "kv-2hop",
                                     "task_options": {"facts": 5, "digits": 3}, "n": 3, "k": 2, "correct_only": False,
                                     "dtype": "fp32", "lr": 1e-3, "batch_size": 4, "max_steps": 2, "save_steps": 1,
                                     "warmup": 0, **kw})


def test_r2_trains_on_the_anchor_response_at_k_other_pairs(model_dir, tmp_path):
    res = run_distill(_r2(model_dir), tmp_path / "p", loaded=load_model(str(model_dir), "fp32"), progress=False)
    recs = [json.loads(x) for x in (tmp_path / "p" / "data.jsonl").read_text().splitlines()]
    assert res.record["config"]["anchor"] == [3, 4] and res.train["rows_per_question"] == 2  # K rows, no anchor copy
    for r in recs:
        assert r["anchor"] == [3, 4] and len(r["trivial"]) == 2 and [3, 4] not in r["trivial"]
        assert all(i != j for i, j in r["trivial"]) and [q["position"] for q in r["prompts"]] == [r["anchor"], *r["trivial"]]
    sft = run_distill(_r2(model_dir, method="sft"), tmp_path / "s", loaded=load_model(str(model_dir), "fp32"),
                      progress=False)
    assert sft.data["questions"] == res.data["questions"]
    assert [json.loads(x)["trivial"] for x in (tmp_path / "s" / "data.jsonl").read_text().splitlines()] == \
        [r["trivial"] for r in recs]  # identical data: the same questions and placements
    sweep = SweepConfig(model=str(model_dir), task="kv-2hop", task_options={"facts": 5, "digits": 3}, n=2, dtype="fp32")
    cmp = run_compare(sweep, ["none"], tmp_path / "cmp", models=[str(model_dir), res.model_dir], progress=False)
    assert [e["label"] for e in cmp.entries] == [str(model_dir), "p"]


def test_r2_distils_a_two_hop_file(model_dir, tmp_path):
    """The two-hop JSONL class (musique's too): R2 builds its data and trains (it crashed on the prompt lookup)."""
    p = tmp_path / "hops.jsonl"
    p.write_text("".join(json.dumps({"id": f"h{i}", "question": f"Where is the key of box {i}?", "answers": [f"drawer {i}"],
                                     "documents": [f"Box {i} opens with key {i}.", f"Key {i} is in drawer {i}.",
                                                   f"Box {i + 9} is empty.", f"Drawer {i + 9} is shut."],
                                     "gold": [0, 1]}) + "\n" for i in range(6)))
    cfg = _r2(model_dir, task=f"jsonl:{p}", task_options={}, max_steps=1)
    res = run_distill(cfg, tmp_path / "r2", loaded=load_model(str(model_dir), "fp32"), progress=False)
    assert res.data["questions"] == 3 and (tmp_path / "r2" / "model").is_dir()


def test_selftrain_keeps_own_correct_responses_at_the_same_placements(model_dir, tmp_path, monkeypatch):
    """A random model is never right; so a stand-in engine says which own answers are correct (every pair
    whose first hop is even), and the self-training records must be exactly those rows."""
    real = engines.Generate._judge

    def marks_even_first_hops(scorer, pred, row, cut):  # both paths judge each generation here
        return {**real(scorer, pred, row, cut), "correct": row.prompt.position[0] % 2 == 0}

    monkeypatch.setattr(engines.Generate, "_judge", staticmethod(marks_even_first_hops))
    res = run_distill(_r2(model_dir, method="selftrain", anchor="4:3"), tmp_path, loaded=load_model(str(model_dir), "fp32"),
                      progress=False)
    recs = [json.loads(x) for x in (tmp_path / "data.jsonl").read_text().splitlines()]
    assert recs and all(r["anchor"][0] % 2 == 0 and r["trivial"] == [] and len(r["prompts"]) == 1 for r in recs)
    assert res.data["selftrain"]["kept"] == len(recs) < res.data["selftrain"]["rows"] == 2 * res.data["questions"]
    assert res.train["rows_per_question"] == 1


def test_r2_bad_input(model_dir, tmp_path):
    with pytest.raises(PosbiasError, match="distilled by r1"):
        run_distill(_r2(model_dir, task="kv-lookup", task_options={"facts": 4, "digits": 3}), tmp_path / "x")
    with pytest.raises(PosbiasError, match="distilled by r2"):
        run_distill(DistillConfig(model=str(model_dir), task="kv-2hop", dtype="fp32"), tmp_path / "x")
    with pytest.raises(PosbiasError, match="unknown `method` 'seqkd' for r2"):
        _r2(model_dir, method="seqkd").validate()
    for anchor, msg in [("3", "bad `anchor`"), ("2:2", "both hops in slot 2"), ("0:9", "out of range")]:
        with pytest.raises(PosbiasError, match=msg):
            run_distill(_r2(model_dir, anchor=anchor), tmp_path / "x")
    assert not (tmp_path / "x").exists()


# -- token / thought shifting --------------------------------------------------------------------------------


def test_shifting_measures_both_targets_at_every_other_placement(model_dir, loaded, tmp_path):
    from posbias.explain import ShiftingConfig, run_shifting

    cfg = ShiftingConfig(model=str(model_dir), task="kv-2hop", task_options={"facts": 5, "digits": 3}, n=3,
                         positions="0:1,3:4,2:0", dtype="fp32")
    res = run_shifting(cfg, tmp_path / "s", loaded=loaded, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "s" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2  # 3 examples x the 2 placements other than the anchor 3:4
    assert {tuple(r["position"]) for r in rows} == {(0, 1), (2, 0)} and all(r["ppl_gold"] >= 1 for r in rows)
    assert res.record["anchor_placement"] == [3, 4] and res.summary["ppl_gold"]["n"] == 6
    assert (tmp_path / "s" / "shifting.png").exists() and (tmp_path / "s" / "divergence.png").exists()


def test_a_generated_response_is_scored_as_a_continuation(loaded):
    from dataclasses import replace

    from posbias.scoring.encode import encode

    task = get_task("kv-lookup", facts=4, digits=3)
    p = task.build(task.examples(1)[0], 0)
    plain = encode(loaded.tokenizer, replace(p, answers=(" 123",)), True)
    cont = encode(loaded.tokenizer, replace(p, answers=(" 123",)), True, continuation=True)
    tok = loaded.tokenizer
    assert tok.decode(cont.answer_ids[0]) == " 123" and tok.decode(plain.answer_ids[0]) == "  123"


def test_r2_resumes_after_a_kill_to_the_same_weights(model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    class KilledAfterCheckpoint1(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            if state.global_step == 1:
                raise KeyboardInterrupt

    cfg = _r2(model_dir, max_steps=3)
    run_distill(cfg, tmp_path / "a", loaded=load_model(str(model_dir), "fp32"), progress=False)
    with pytest.raises(KeyboardInterrupt):
        run_distill(cfg, tmp_path / "b", loaded=load_model(str(model_dir), "fp32"), progress=False,
                    callbacks=[KilledAfterCheckpoint1()])
    res = run_distill(cfg, tmp_path / "b", loaded=load_model(str(model_dir), "fp32"), resume=True, progress=False)
    assert res.train["resumed_from"].endswith("checkpoint-1") and res.train["steps"] == 3
    wa, wb = (load_file(str(tmp_path / d / "model" / "model.safetensors")) for d in ("a", "b"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
