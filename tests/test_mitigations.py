"""The newer training-free mitigations: reordering (reorder, attnsort) and attention calibration (calib), with the
positional prior they read. Tiny random models and the real tasks' prompts; no real model."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import char_tokenizer, tiny_model
from posbias import Loaded, PosbiasError, SweepConfig, get_method, run_compare
from posbias.methods.reorder import bm25_scores, litm, place
from posbias.models.calibration import CalibState, _calibrate, calibration
from posbias.tasks import get_task
from posbias.tasks.arrange import arrange, gold_slot, with_dummy

pytestmark = pytest.mark.usefixtures("one_thread")


def _kv(position=3, facts=6):
    task = get_task("kv-lookup", facts=facts)
    return task, task.prompt(task.examples(1)[0], position)


def test_litm_is_langchains_long_context_reorder():
    # LangChain: reverse the best-first list, then alternately put at the front and append
    assert litm([1, 2, 3, 4, 5]) == [1, 3, 5, 4, 2]
    assert litm([1, 2, 3, 4]) == [2, 4, 3, 1]  # an even count puts the best last
    assert place([0.1, 0.9, 0.5], "first") == [1, 2, 0] and place([0.1, 0.9, 0.5], "last") == [0, 2, 1]


def test_arrange_moves_bodies_and_keeps_the_rest_of_the_prompt():
    task, p = _kv()
    order = [5, 4, 3, 2, 1, 0]
    q = arrange(p, order)
    assert q.items == tuple(reversed(p.items)) and q.example_id == p.example_id and q.position == p.position
    assert q.user.split(p.items[0])[1].strip().startswith("Question:")  # the old first fact now ends the list
    assert q.user.replace("\n".join(q.items), "") == p.user.replace("\n".join(p.items), "")
    assert gold_slot(3, order) == 2 and q.items[2] == p.items[3]


def test_a_documents_label_stays_in_its_slot():
    docs = [{"title": f"T{i}", "text": f"text {i}"} for i in range(3)]
    from posbias.tasks.base import Doc, Prompt
    from posbias.tasks.docqa import doc_lines

    items = doc_lines([Doc(d["title"], d["text"]) for d in docs])
    p = Prompt("e", 0, "Search results:\n" + "\n".join(items) + "\nQuestion: q", "", ("a",), items=tuple(items))
    q = arrange(p, [2, 1, 0], r"Document \[\d+\]")
    assert q.items[0] == "Document [1](Title: T2) text 2" and q.items[2] == "Document [3](Title: T0) text 0"
    d = with_dummy(p, 1, r"Document \[\d+\]", "(Title: Empty) nothing")
    assert d.items[1] == "Document [2](Title: Empty) nothing" and d.items[0] == p.items[0]


def test_bm25_ranks_the_fact_whose_key_the_question_names_first():
    task, p = _kv(position=4)
    scores = bm25_scores(p)
    assert max(range(6), key=scores.__getitem__) == 4


def test_reorder_specs_and_refusals():
    assert get_method("reorder").config() == {"name": "reorder", "signal": "bm25", "rule": "litm", "rounds": 1}
    assert get_method("reorder:oracle:first").label == "reorder:oracle:first"
    assert get_method("attnsort:2").config() == {"name": "attnsort", "rounds": 2}
    for bad in ("reorder:bm26", "reorder:bm25:middle", "attnsort:x", "attnsort:0"):
        with pytest.raises(PosbiasError):
            get_method(bad)
    task, p = _kv()
    with pytest.raises(PosbiasError, match="reads the model's attention"):
        get_method("attnsort").rearrange([p], task, None)


def test_oracle_first_puts_every_gold_in_slot_0():
    task = get_task("kv-lookup", facts=5)
    ex = task.examples(2)
    prompts = [task.prompt(e, s) for e in ex for s in range(5)]
    out = get_method("reorder:oracle:first").rearrange(prompts, task, None)
    assert all(q.items[0] == p.items[p.position] for p, q in zip(prompts, out))


def test_calibration_redistributes_item_attention_by_alpha_and_keeps_its_total():
    """Sec. 4.1: each item's mean per-token attention becomes proportional to alpha, the items' total unchanged, and
    the attention on other tokens untouched (checked on p' recovered from the output with an identity value)."""
    torch.manual_seed(0)
    query, key = torch.randn(1, 2, 9, 9), torch.randn(1, 2, 9, 9)
    value = torch.eye(9).expand(1, 2, 9, 9)  # p' v = p' itself
    st = CalibState.__new__(CalibState)  # the state alone, no model
    st.clear()
    spans = [2, 0, 0, 0, 1, 1, 2, 2, 2]  # items 0 and 1, the rest (2 = n) not an item
    alpha = torch.tensor([[0.8, 0.2]])
    st.set([spans], alpha)
    module = type("M", (), {"head_dim": 9})()
    mask = torch.zeros(1, 1, 9, 9).masked_fill(torch.ones(9, 9).triu(1).bool(), float("-inf"))
    out = _calibrate(st, module, query, key, value, mask, {"scaling": 1 / 3}, torch.zeros(1, 9, 2, 9))
    p_new = out[0, -1]  # [H, S]: the last query row, the only one selected (prompt end = last column)
    p_old = torch.softmax((query[0, :, -1:] @ key[0].transpose(-1, -2)) / 3, -1)[:, 0]
    ids = torch.tensor(spans)
    for head in range(2):
        m_old = [p_old[head][ids == k] for k in range(3)]
        m_new = [p_new[head][ids == k] for k in range(3)]
        torch.testing.assert_close(m_new[2], m_old[2])  # other tokens keep their attention
        torch.testing.assert_close(m_new[0].sum() + m_new[1].sum(), m_old[0].sum() + m_old[1].sum())
        torch.testing.assert_close(m_new[0].mean() / m_new[1].mean(), torch.tensor(0.8 / 0.2))
        torch.testing.assert_close(m_new[0] / m_new[0].sum(), m_old[0] / m_old[0].sum())  # shape within an item kept
    assert torch.equal(out[0, :-1], torch.zeros(8, 2, 9))  # rows before the prompt end: the backend's output


def test_only_the_chosen_layers_are_calibrated():
    tok = char_tokenizer()
    model = tiny_model("llama", len(tok), layers=4)
    outs = {}
    hooks = [layer.self_attn.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o[0].clone()))
             for i, layer in enumerate(model.model.layers)]
    ids = torch.randint(3, 60, (1, 30))
    with torch.no_grad():
        model(input_ids=ids)
        base = dict(outs)
        with calibration(model, [2, 3]) as st:
            st.set([[0] * 10 + [1] * 10 + [2] * 10], torch.tensor([[0.1, 0.9]]))
            model(input_ids=ids)
    for hk in hooks:
        hk.remove()
    assert torch.equal(outs[0], base[0]) and torch.equal(outs[1], base[1])
    assert not torch.allclose(outs[2], base[2], atol=1e-4)
    with pytest.raises(PosbiasError, match="not layers of this 4-layer model"):
        with calibration(model, [4]):
            pass


def _prior(tmp_path, model="tiny", task=None, skip=1000):
    task = task or get_task("kv-lookup", facts=4, digits=3).config()
    d = tmp_path / "prior"
    d.mkdir(exist_ok=True)
    (d / "prior.json").write_text(json.dumps({"model": model, "task": task, "chat": False, "prior": [0.1] * 4,
                                              "fitted_on": {"task": "kv-lookup", "seed": 0, "skip": skip, "n": 10}}))
    return d


def test_a_prior_from_another_model_or_template_is_refused(tmp_path):
    loaded = Loaded(tiny_model("llama", len(char_tokenizer()), layers=4), char_tokenizer(), {"name": "tiny"})
    m = get_method(f"calib:{_prior(tmp_path, model='other')}")
    with pytest.raises(PosbiasError, match="belongs to model other"):
        m.check(loaded)
    m = get_method(f"calib:{_prior(tmp_path)}")
    m.check(loaded)
    with pytest.raises(PosbiasError, match="was measured on"):
        m.for_task(get_task("kv-lookup", facts=5, digits=3))
    with pytest.raises(PosbiasError, match="no positional prior"):
        get_method(f"calib:{tmp_path / 'missing'}")
    assert get_method(f"calib:{_prior(tmp_path)}:1e-4").t == 1e-4


def test_compare_refuses_a_prior_measured_on_the_evaluated_examples(tmp_path):
    cfg = SweepConfig(model="unused", task="kv-lookup", task_options={"facts": 4, "digits": 3}, n=20, skip=0)
    with pytest.raises(PosbiasError, match="overlap"):
        run_compare(cfg, ["none", f"calib:{_prior(tmp_path, skip=5)}"], tmp_path / "c", progress=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from conftest import save_tiny_llama

    return str(save_tiny_llama(tmp_path_factory.mktemp("mitigations") / "model"))


def test_compare_runs_the_new_methods_end_to_end_and_oracle_first_equals_slot_0(tiny_dir, tmp_path):
    """oracle:first moves the gold to slot 0 and keeps the others in order: exactly the prompt with the gold at slot 0,
    so every example is right at every slot iff the unmodified model is right at slot 0."""
    cfg = SweepConfig(model=tiny_dir, task="kv-lookup", task_options={"facts": 4, "digits": 3}, positions="all", n=6,
                      dtype="fp32")
    rec = run_compare(cfg, ["none", "reorder:oracle:first", "reorder:bm25", "attnsort", "calib:prompt"], tmp_path / "c",
                      progress=False).record
    rows = {m["method"]: m for m in rec["methods"]}
    assert set(rows) == {"none", "reorder:oracle:first", "reorder:bm25", "attnsort", "calib:prompt"}
    assert all("collapse" in m for m in rec["methods"])

    def correct(d):
        return {(json.loads(x)["example_id"], json.loads(x)["position"]): json.loads(x)["correct"]
                for x in (tmp_path / "c" / d / "examples.jsonl").read_text().splitlines()}

    base, oracle = correct(rows["none"]["dir"]), correct(rows["reorder:oracle:first"]["dir"])
    assert all(oracle[(e, p)] == base[(e, 0)] for e, p in oracle)
    moved = [json.loads(x) for x in (tmp_path / "c" / rows["reorder:oracle:first"]["dir"] / "examples.jsonl").read_text()
             .splitlines()]
    assert {r["arranged_slot"] for r in moved} == {0} and "arranged_slot" not in json.dumps(rows["none"])
    assert rows["calib:prompt"]["method_config"]["t"] == 5e-5


@pytest.mark.parametrize("args, message", [
    (["analyze", "prior", "--task", "kv-2hop"], "places two"),
    (["compare", "--methods", "none,calib:MISSING"], "no positional prior"),
    (["compare", "--methods", "none,reorder:bm26"], "bad reorder spec"),
    (["compare", "--methods", "none,calib:PRIOR_OVERLAP"], "overlap"),
    (["compare", "--methods", "none,calib:PRIOR_OTHER"], "belongs to model other"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_dir, tmp_path, monkeypatch, capsys, args, message):
    import sys

    from posbias.cli import main

    (tmp_path / "o").mkdir()
    other = _prior(tmp_path / "o", model="other", skip=1000)
    overlap = _prior(tmp_path, model=tiny_dir, skip=0)
    args = [a.replace("MISSING", str(tmp_path / "missing")).replace("PRIOR_OVERLAP", str(overlap))
            .replace("PRIOR_OTHER", str(other)) for a in args]
    out = tmp_path / "out"
    opts = ["--model", tiny_dir, "--n", "2", "--dtype", "fp32", "--quiet", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["posbias", *args, *(["--facts", "4", "--digits", "3"] if "--task" not in args else []),
                                      *opts])
    with pytest.raises(SystemExit) as e:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), list(out.rglob("*"))


def test_the_prior_records_how_often_attention_and_relevance_find_the_gold():
    from posbias.analysis.prior import _signal

    n = 4
    curve = torch.tensor([4.0, 1.0, 1.0, 2.0])  # a positional curve every item gets, whatever it holds
    items = curve.expand(2, n, n).clone()  # [example, gold slot, item slot]
    items[:, torch.arange(n), torch.arange(n)] += 0.5  # the gold gets a little more than its slot's share
    out = _signal(items, prior=curve)
    assert out["recall_attention"] == [1.0, 0.0, 0.0, 0.0]  # the raw argmax is slot 0 wherever the gold is
    assert out["recall_relevance"] == [1.0] * n  # subtracting the right prior recovers the gold everywhere
    assert out["items"][0] > out["items"][1] and out["gold_attention"][1] > out["items"][1]
    wrong = _signal(items, prior=torch.tensor([0.0, 3.0, 3.0, 2.0]))  # a prior of the wrong shape (recency-like)
    assert wrong["recall_relevance"] == [1.0, 0.0, 0.0, 0.0]


def test_the_prior_run_records_the_real_items_attention_and_reads_rows_without_it(tmp_path, tiny_dir):
    from posbias.analysis.prior import summarize
    from posbias.explain import PriorConfig, run_prior

    res = run_prior(PriorConfig(model=tiny_dir, task_options={"facts": 4}, n=2, dtype="fp32"), tmp_path / "p",
                    progress=False)
    rec = res.record
    assert len(rec["items"]) == len(rec["gold_attention"]) == len(rec["recall_relevance"]) == 4
    assert abs(sum(rec["items"]) / 4 - 1.0) < 1e-5  # relative to each prompt's mean
    assert "top=gold" in res.format()
    old = [{k: v for k, v in r.items() if k != "items"} for r in map(json.loads, (tmp_path / "p" / "rows.jsonl").open())]
    assert "items" not in summarize(old) and summarize(old)["prior"] == rec["prior"]  # an older posbias's rows
