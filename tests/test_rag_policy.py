"""Slot policies (posbias/policy.py) and the RAG integrations that apply them, on the real installed langchain-core and
llama-index-core: a policy from a sweep record, the placement, the refusals, resampling, and `posbias policy export`.

The sweep records here are built like a finished sweep's sweep.json (config, task, model, method, versions,
per_position, summary), on a five-slot curve whose ranking is not the slots' order: [0.9, 0.3, 0.1, 0.5, 0.7] ranks
the slots 0, 4, 3, 1, 2.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode

from posbias.cli import main
from posbias.errors import PosbiasError
from posbias.integrations.langchain import PolicyReorder
from posbias.integrations.llama_index import PolicyNodePostprocessor
from posbias.measure import apply_ranking, policy_from_sweep, read_policy, resampled_ranking, write_policy

pytestmark = pytest.mark.usefixtures("one_thread")

CURVE = [0.9, 0.3, 0.1, 0.5, 0.7]
RANKING = [0, 4, 3, 1, 2]  # the slots of CURVE, best-read first
N = 20


def sweep_record(curve=CURVE, method="none", task=None, positions=None) -> dict:
    """A finished sweep's record, shaped like sweep.json."""
    task = task or {"name": "kv-lookup", "n_slots": len(curve), "metric": "substring", "facts": len(curve), "digits": 6}
    per = [{"position": p, "n": N, "correct": round(a * N), "accuracy": a, "ci_low": max(0.0, a - 0.2),
            "ci_high": min(1.0, a + 0.2)} for p, a in enumerate(curve)]
    per = [r for r in per if positions is None or r["position"] in positions]
    return {"config": {"model": "smollm2-135m", "dtype": "bf16", "device": "cpu", "task": task["name"],
                       "engine": "teacher-forced", "n": N, "seed": 0, "skip": 1000, "method": method, "chat_used": True,
                       "template": {"sha256": "ab" * 32, "system": "You are a helpful AI assistant"}},
            "task": task, "model": {"name": "smollm2-135m", "kind": "registered"}, "method": {"name": method},
            "versions": {"posbias": "0.1.0", "python": "3.11.7"}, "per_position": per,
            "summary": {"average": sum(curve) / len(curve), "best_position": 0}}


def sweep_dir(root: Path, name: str = "sweep", **kw) -> Path:
    d = root / name
    d.mkdir()
    (d / "sweep.json").write_text(json.dumps(sweep_record(**kw), indent=2))
    return d


def policy_of(curve) -> dict:
    return policy_from_sweep(sweep_record(curve), "sweep.json")


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert isinstance(e.value, PosbiasError) and "\n" not in text and " -- " in text, text
    return text


# ----------------------------------------------------------------------------- the policy


def test_a_sweep_record_gives_the_slots_ranked_by_accuracy_with_their_intervals():
    pol = policy_from_sweep(sweep_record(), "runs/x/sweep.json")
    assert pol["posbias_policy"] == 1 and pol["model"] == "smollm2-135m" and pol["n_slots"] == 5
    assert pol["ranking"] == RANKING
    assert [s["accuracy"] for s in pol["slots"]] == CURVE and pol["slots"][2]["ci"] == [0.0, pytest.approx(0.3)]
    assert pol["fitted_on"] == {"task": "kv-lookup", "seed": 0, "skip": 1000, "n": N}


def test_export_then_read_round_trips(tmp_path):
    run = sweep_dir(tmp_path)
    from_sweep = read_policy(run)
    path = write_policy(from_sweep, tmp_path / "out" / "policy.json")
    back = read_policy(path)
    assert {k: v for k, v in back.items() if k != "sha256"} == {k: v for k, v in from_sweep.items() if k != "sha256"}
    assert back["ranking"] == RANKING and "sha256" not in json.loads(path.read_text())


def test_apply_ranking_puts_the_best_item_in_the_best_slot():
    placed = apply_ranking(["r0", "r1", "r2", "r3", "r4"], RANKING)
    assert placed[RANKING[0]] == "r0" and placed[RANKING[-1]] == "r4"
    assert placed == ["r0", "r3", "r4", "r2", "r1"]  # slot 0 <- r0, slot 4 <- r1, slot 3 <- r2, slot 1 <- r3, slot 2 <- r4


# ----------------------------------------------------------------------------- the integrations place as apply_ranking


def docs(n: int) -> list[Document]:
    return [Document(page_content=f"doc {i}", metadata={"rank": i}) for i in range(n)]


@pytest.mark.parametrize("given", ["file", "folder", "dict"])
def test_the_langchain_transformer_places_as_apply_ranking(tmp_path, given):
    run = sweep_dir(tmp_path)
    policy = {"file": write_policy(read_policy(run), tmp_path / "policy.json"), "folder": run, "dict": read_policy(run)}[given]
    reorder = PolicyReorder(policy)
    got = reorder.transform_documents(docs(5))
    assert [d.metadata["rank"] for d in got] == apply_ranking(list(range(5)), RANKING) == [0, 3, 4, 2, 1]
    assert [d.metadata["rank"] for d in asyncio.run(reorder.atransform_documents(docs(5)))] == [0, 3, 4, 2, 1]


def nodes(scores) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(text=f"node {i}", id_=f"n{i}"), score=s) for i, s in enumerate(scores)]


def test_the_llama_index_postprocessor_sorts_by_score_then_places_as_apply_ranking(tmp_path):
    post = PolicyNodePostprocessor(write_policy(read_policy(sweep_dir(tmp_path)), tmp_path / "policy.json"))
    got = post.postprocess_nodes(nodes([0.2, 0.9, 0.4, 0.8, 0.1]))  # by score: n1, n3, n2, n0, n4
    assert [n.node.node_id for n in got] == apply_ranking(["n1", "n3", "n2", "n0", "n4"], RANKING)
    assert [n.node.node_id for n in got] == ["n1", "n0", "n4", "n2", "n3"]
    assert [n.node.node_id for n in asyncio.run(post.apostprocess_nodes(nodes([0.2, 0.9, 0.4, 0.8, 0.1])))] == \
        ["n1", "n0", "n4", "n2", "n3"]


def test_the_llama_index_postprocessor_keeps_the_retrievers_order_where_scores_are_missing(tmp_path):
    post = PolicyNodePostprocessor(policy=read_policy(sweep_dir(tmp_path)))
    unscored = post.postprocess_nodes(nodes([None] * 5))
    assert [n.node.node_id for n in unscored] == apply_ranking(["n0", "n1", "n2", "n3", "n4"], RANKING)
    mixed = post.postprocess_nodes(nodes([None, 0.5, None, -0.2, 0.7]))  # scored first (n4, n1, n3), then n0, n2
    assert [n.node.node_id for n in mixed] == apply_ranking(["n4", "n1", "n3", "n0", "n2"], RANKING)


def test_the_llama_index_postprocessor_is_a_pydantic_component(tmp_path):
    post = PolicyNodePostprocessor(sweep_dir(tmp_path), resample=True)
    assert post.resample is True and post.policy["ranking"] == RANKING
    back = PolicyNodePostprocessor.from_dict(post.to_dict())
    assert back.policy == post.policy and back.resample and post.class_name() == "PolicyNodePostprocessor"


# ----------------------------------------------------------------------------- refusals, one line each


def test_a_count_mismatch_is_refused_naming_the_count_to_retrieve(tmp_path):
    pol = read_policy(sweep_dir(tmp_path))
    with pytest.raises(PosbiasError) as e:
        PolicyReorder(pol).transform_documents(docs(3))
    assert "ranks 5 slots, and 3 documents came" in one_line(e) and "retrieve 5 documents" in str(e.value)
    with pytest.raises(PosbiasError) as e:
        PolicyNodePostprocessor(pol).postprocess_nodes(nodes([0.1] * 7))
    assert "ranks 5 slots, and 7 nodes came" in one_line(e) and "retrieve 5 nodes" in str(e.value)


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "absent.json", "no policy or finished sweep at"),
    (lambda d: (d / "bad.json").write_text("{not json") and d / "bad.json", "is not JSON"),
    (lambda d: (d / "v2.json").write_text(json.dumps({**policy_of(CURVE), "posbias_policy": 2})) and d / "v2.json",
     "is policy version 2, this posbias reads 1"),
])
@pytest.mark.parametrize("build", [PolicyReorder, PolicyNodePostprocessor], ids=["langchain", "llama_index"])
def test_a_bad_policy_file_is_refused_in_one_line(tmp_path, make, message, build):
    with pytest.raises(PosbiasError) as e:
        build(make(tmp_path))
    assert message in one_line(e)


@pytest.mark.parametrize("build", [PolicyReorder, PolicyNodePostprocessor], ids=["langchain", "llama_index"])
def test_a_policy_dict_of_another_version_or_a_broken_ranking_is_refused(build):
    with pytest.raises(PosbiasError) as e:
        build({**policy_of(CURVE), "posbias_policy": 2})
    assert "version 2, this posbias reads 1" in one_line(e)
    with pytest.raises(PosbiasError) as e:
        build({**policy_of(CURVE), "ranking": [0, 0, 1, 2, 3]})
    assert "not each of its 5 slots once" in one_line(e)


@pytest.mark.parametrize("module, package", [("langchain", "langchain_core.documents"),
                                             ("llama_index", "llama_index.core.postprocessor.types")])
def test_a_missing_framework_is_one_line_naming_the_rag_extra(monkeypatch, module, package):
    monkeypatch.setitem(sys.modules, package, None)  # an import of it fails, as when it is not installed
    monkeypatch.delitem(sys.modules, f"posbias.integrations.{module}")
    with pytest.raises(PosbiasError) as e:
        importlib.import_module(f"posbias.integrations.{module}")
    assert "install posbias[rag]" in one_line(e)


# ----------------------------------------------------------------------------- resampling by relative depth


def test_resampling_maps_slot_j_of_m_to_measured_slot_round_j_n1_over_m1():
    pol = policy_of(CURVE)  # n = 5
    assert resampled_ranking(pol, 5) == RANKING  # the identity mapping
    assert resampled_ranking(pol, 3) == [0, 2, 1]  # slots 0, 2, 4: 0.9, 0.1, 0.7
    # slots 0,1,1,2,3,3,4 (depths 0, .67, 1.33, 2, 2.67, 3.33, 4): of the two on measured slot 3, slot 5 leans to
    # slot 4 (0.7), slot 4 to slot 2 (0.1), so 5 goes first; of the two on slot 1, slot 1 leans to slot 0 (0.9)
    assert resampled_ranking(pol, 7) == [0, 6, 5, 4, 1, 2, 3]
    assert resampled_ranking(pol, 1) == [0]
    assert resampled_ranking(policy_of([0.9, 0.2, 0.6, 0.5]), 3) == [0, 1, 2]  # 1.5 rounds to slot 2 (0.6), not 1 (0.2)
    six = policy_of([0.9, 0.2, 0.6, 0.1, 0.5, 0.4])
    assert resampled_ranking(six, 3) == [0, 1, 2]  # Python's round: 2.5 goes to the even slot 2 (0.6), not 3 (0.1)


def test_the_integrations_resample_only_when_asked(tmp_path):
    pol = read_policy(sweep_dir(tmp_path))
    got = PolicyReorder(pol, resample=True).transform_documents(docs(3))
    assert [d.metadata["rank"] for d in got] == apply_ranking([0, 1, 2], [0, 2, 1]) == [0, 2, 1]
    placed = PolicyNodePostprocessor(pol, resample=True).postprocess_nodes(nodes([0.3, 0.2, 0.1, 0.05, 0.01, 0.0, 0.4]))
    assert [n.node.node_id for n in placed] == apply_ranking(["n6", "n0", "n1", "n2", "n3", "n4", "n5"],
                                                             [0, 6, 5, 4, 1, 2, 3])


@pytest.mark.parametrize("m", [11, 20, 30])
def test_resampled_ties_are_placed_as_the_curve_ranks_them(m):
    """On a recency curve the best document goes to the last slot of m, not the one before it: slots that take the
    same measured slot are ordered by the curve at their exact depth (the old rule gave ties to the lower slot, and the
    best document landed at slot 18 of 20)."""
    rising = policy_of([0.1 * (s + 1) for s in range(10)])
    got = resampled_ranking(rising, m)
    assert got[0] == m - 1 and got == list(range(m - 1, -1, -1))  # deepest first, all the way down
    falling = policy_of([1 - 0.1 * s for s in range(10)])
    assert resampled_ranking(falling, m) == list(range(m))  # primacy: the first slot first


# ----------------------------------------------------------------------------- posbias policy export


def cli(monkeypatch, capsys, *args) -> tuple[int, str, list[str]]:
    monkeypatch.setattr(sys, "argv", ["posbias", "policy", "export", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code, out.out, [line for line in out.err.splitlines() if line.strip()]


def test_policy_export_writes_the_policy_and_prints_the_ranking(tmp_path, monkeypatch, capsys):
    run = sweep_dir(tmp_path)
    code, out, err = cli(monkeypatch, capsys, run)
    assert code == 0, err
    assert read_policy(run / "policy.json")["ranking"] == RANKING
    assert "ranking, best first: 0 4 3 1 2" in out and f"wrote {run / 'policy.json'}" in out
    assert "   4     0.700  [0.500, 0.900]     2" in out  # slot 4: accuracy, 95% CI, rank 2
    code, out, err = cli(monkeypatch, capsys, run / "sweep.json", "--out", tmp_path / "elsewhere" / "p.json")
    assert code == 0 and read_policy(tmp_path / "elsewhere" / "p.json")["ranking"] == RANKING


BAD = [
    ("missing", lambda d: d / "absent", "no policy or finished sweep at"),
    ("unfinished", lambda d: (d / "unfinished").mkdir() or d / "unfinished", "holds no sweep.json"),
    ("method", lambda d: sweep_dir(d, method="pi"), "under method pi"),
    ("order task", lambda d: sweep_dir(d, task={"name": "judge-nq", "n_slots": 2, "style": "judge", "labels": ["A", "B"]},
                                       curve=[0.9, 0.1]), "is an order task"),
    ("some slots", lambda d: sweep_dir(d, positions={0, 2, 4}), "measured slots 0,2,4 of 5; a policy needs every slot "
     "-- sweep all 5 slots"),
    ("not json", lambda d: (d / "broken").mkdir() or (d / "broken" / "sweep.json").write_text("{") and d / "broken",
     "is not JSON"),
]


@pytest.mark.parametrize("make, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_policy_export_refuses_bad_input_with_exit_2_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, make,
                                                                                  message):
    run = make(tmp_path)
    code, out, err = cli(monkeypatch, capsys, run, "--out", tmp_path / "out" / "policy.json")
    assert code == 2 and len(err) == 1 and err[0].startswith("posbias: error: ") and " -- " in err[0], err
    assert message in err[0], err[0]
    assert not list(tmp_path.rglob("policy.json*")) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("task, message", [
    ("kv-2hop", "places two items (a two-hop task)"),  # it has a "style" too: it used to be called an order task
    ("mc-kv", "is an order task (mc-kv)"),
])
def test_a_real_sweep_of_another_task_kind_is_refused_for_what_it_is(loaded, task, message):
    """sweep.json records the task's kind (Task.kind) and the export reads it, with or without the record's field."""
    from posbias import SweepConfig, run_sweep

    options = {"facts": 4, "digits": 3}
    res = run_sweep(SweepConfig(task=task, task_options=options, n=1, positions="0:1" if task == "kv-2hop" else None),
                    loaded=loaded, progress=False)
    assert res.record["task_kind"] == ("two-hop" if task == "kv-2hop" else "order")
    older = {k: v for k, v in res.record.items() if k != "task_kind"}  # a record written before the field
    for record in (res.record, older):
        with pytest.raises(PosbiasError, match=re.escape(message)):
            policy_from_sweep(record)


TINY_KV = {"facts": 4, "digits": 3}


def test_policy_export_reads_a_run_json_as_its_folder_and_refuses_another_file_naming_the_folder(loaded, tmp_path,
                                                                                                   monkeypatch, capsys):
    """A sweep folder's run.json (its marker, not a record) is read as the folder; it used to be read as a sweep record
    with no slots ("measured slots  of 0", and a fix that did not apply). Another file that is no record names the
    folder to pass."""
    from posbias import SweepConfig, run_sweep

    run = tmp_path / "s"
    run_sweep(SweepConfig(task="kv-lookup", task_options=TINY_KV, n=2), run, loaded=loaded, progress=False)
    code, out, err = cli(monkeypatch, capsys, run / "run.json")
    assert code == 0 and f"wrote {run / 'policy.json'}" in out, err
    assert read_policy(run / "policy.json")["n_slots"] == 4
    (run / "notes.json").write_text(json.dumps({"comment": "a file beside the sweep"}))
    code, out, err = cli(monkeypatch, capsys, run / "notes.json", "--out", tmp_path / "p.json")
    assert code == 2 and len(err) == 1 and err[0].endswith(f"-- pass its folder: posbias policy export {run}"), err
    assert not (tmp_path / "p.json").exists()


def test_policy_export_of_a_comparison_names_its_unmodified_entry_and_the_command_that_works(loaded, tmp_path,
                                                                                             monkeypatch, capsys):
    """A comparison holds one sweep per entry (COMPARE/none is the unmodified model's); export used to tell the user to
    resume "its posbias sweep command". The refusal names the entry and a command that, run, writes the policy; with
    the entry unfinished, the command that finishes it."""
    from posbias import SweepConfig, run_compare

    cmp = tmp_path / "cmp"
    run_compare(SweepConfig(task="kv-lookup", task_options=TINY_KV, n=2), ["none", "pi:1.1"], cmp, loaded=loaded,
                progress=False)
    for given in (cmp, cmp / "run.json", cmp / "compare.json"):
        code, out, err = cli(monkeypatch, capsys, given)
        assert code == 2 and len(err) == 1 and "posbias sweep command" not in err[0], err
        assert f"{cmp} is a comparison, not a sweep" in err[0] and err[0].endswith(f"-- posbias policy export {cmp / 'none'}")
    command = err[0].split(" -- ")[1].split()
    code, out, err = cli(monkeypatch, capsys, *command[3:])  # the command the message gives, as given
    assert code == 0 and read_policy(cmp / "none" / "policy.json")["n_slots"] == 4, err
    (cmp / "compare.json").unlink()
    (cmp / "none" / "sweep.json").unlink()
    code, out, err = cli(monkeypatch, capsys, cmp)
    assert code == 2 and f"its unmodified model's entry {cmp / 'none'} is unfinished" in err[0], err
    assert "--resume" in err[0] and err[0].endswith(f"then posbias policy export {cmp / 'none'}")


def test_a_needle_sweep_is_refused_for_what_its_slots_are_not_with_a_rerun_of_1001_slots(loaded):
    """niah's 1001 slots are depths in one text: the export used to ask for every slot (`--positions all`, 1001 rows
    per example) of a task whose prompts list no items for a policy to place. Its record says "depth" (Task.kind); a
    record written before that said "one-gold" and is read the same."""
    from posbias import SweepConfig, run_sweep

    data = Path(__file__).parent / "data" / "essays"
    res = run_sweep(SweepConfig(task="niah", task_options={"haystack": str(data), "tokens": 600}, n=1,
                                positions="0%,100%"), loaded=loaded, progress=False)
    assert res.record["task_kind"] == "depth"
    for record in (res.record, {**res.record, "task_kind": "one-gold"}):
        with pytest.raises(PosbiasError) as e:
            policy_from_sweep(record, "runs/niah/sweep.json")
        text = one_line(e)
        assert "is a needle task (niah): its 1001 slots are depths in one text" in text and "--positions" not in text
        assert "sweep a task that lists them (kv-lookup, nq, jsonl:PATH)" in text


def _test(p: float, n: int = 30) -> dict:
    return {"name": "Cochran's Q, within-example permutation", "statistic": 4.2, "p": p, "n": n, "permutations": 2000}


@pytest.mark.parametrize("p, warned", [(0.4, True), (0.05, True), (0.049, False), (0.0005, False)])
def test_the_position_test_decides_whether_the_ranking_is_noise(p, warned):
    """separable = the position test's p < ALPHA; the warning names the p-value and the examples. The gap interval is
    kept for display and decides nothing: a gap clear of 0 does not silence a warning, one reaching 0 raises none."""
    from posbias.measure import policy_from_sweep, ranking_note

    rec = sweep_record()
    rec["summary"].update(gap=0.4, gap_ci=[0.0, 0.6] if not warned else [0.2, 0.7], position_test=_test(p, n=12))
    pol = policy_from_sweep(rec, "s")
    note = ranking_note(pol)
    assert pol["curve"]["separable"] is (not warned) and pol["curve"]["position_test"]["p"] == p
    assert pol["curve"]["gap_ci"] == rec["summary"]["gap_ci"]  # kept for display
    assert (note is not None) == warned, note
    if warned:
        assert note.startswith("warning: no position effect: permutation test p = ") and f"p = {p:.3f} over" in note
        assert f"n = {N} examples (12 answer differently at some slot" in note and "this ranking is noise" in note


def test_a_sweep_without_the_position_test_gets_no_verdict_and_a_note_saying_how_to_get_it(tmp_path):
    """A sweep written by an older posbias: separable None, whatever its gap interval says, and a note naming the run
    and `--resume` (a resume of a finished sweep recomputes its summary from its rows); a policy written by hand (no
    curve) gets nothing. An old policy file's separable (the gap interval's verdict) is not trusted either."""
    from posbias.measure import policy_from_sweep, ranking_note

    rec = sweep_record()
    rec["summary"].update(gap=0.1, gap_ci=[0.0, 0.25])
    pol = policy_from_sweep(rec, "runs/x/sweep.json")
    assert pol["curve"]["separable"] is None
    note = ranking_note(pol)
    assert note.startswith("note: runs/x/sweep.json has no position-effect test") and "--resume" in note
    assert ranking_note({k: v for k, v in pol.items() if k != "curve"}) is None
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**pol, "curve": {"gap": 0.1, "gap_ci": [0.0, 0.25], "average": 0.5, "separable": False}}))
    assert read_policy(old)["curve"]["separable"] is None and ranking_note(read_policy(old)).startswith("note: ")


@pytest.mark.parametrize("curve, field", [
    ({"position_test": "flat"}, "'curve.position_test' must be an object"),
    ({"position_test": {**_test(0.4), "p": "high"}}, "'curve.position_test.p' must be a p-value"),
    ({"position_test": {**_test(0.4), "p": 1.5}}, "'curve.position_test.p' must be a p-value"),
    ({"position_test": {**_test(0.4), "n": 3.5}}, "'curve.position_test.n' must be a whole number"),
    ({"position_test": _test(0.4), "separable": True}, r"'curve.separable' must be false \(position_test.p 0.4 >= 0.05\)"),
    ({"position_test": _test(0.001), "separable": False}, "'curve.separable' must be true"),
    ({"gap": "big"}, "'curve.gap' must be a number"),
])
def test_a_policy_whose_position_test_is_broken_or_disagrees_is_refused(tmp_path, curve, field):
    pol = policy_of(CURVE)
    f = tmp_path / "p.json"
    f.write_text(json.dumps({**pol, "curve": {**pol["curve"], **curve}}))
    with pytest.raises(PosbiasError, match=field) as e:
        read_policy(f)
    assert str(e.value).startswith(f"{f}: ") and "\n" not in str(e.value)
