"""reorder:curve (methods/curve.py) and order ensembles (methods/ensemble.py, eval/ensemble.py) on a tiny model."""

from __future__ import annotations

import json

import pytest

from posbias import PosbiasError, SweepConfig, get_method, get_task, run_compare, run_sweep
from posbias.tasks.arrange import split_label

KV = {"facts": 6}


def _sweep(model_dir, tmp_path, **kw):
    cfg = SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=4, skip=100, dtype="fp32", **kw)
    return run_sweep(cfg, tmp_path / "curve", progress=False)


def _policy_with(tmp_path, ranking, model="tiny", task=None):
    """A policy file that ranks the slots as given (the exported format, posbias/policy.py)."""
    task = task or get_task("kv-lookup", **KV).config()
    n = len(ranking)
    rec = {"posbias_policy": 1, "model": model, "task": task, "n_slots": n, "ranking": ranking,
           "slots": [{"slot": s, "accuracy": 1 - ranking.index(s) / n, "ci": [0, 1], "n": 10} for s in range(n)],
           "measured": {"run": "hand"}, "fitted_on": {"task": "kv-lookup", "seed": 0, "skip": 500, "n": 10}}
    f = tmp_path / "policy.json"
    f.write_text(json.dumps(rec))
    return f


def _body(prompt, slot, task):
    return split_label(prompt.items[slot], task.slot_label)[1]


def test_curve_puts_the_rth_best_item_in_the_rth_best_slot(tmp_path):
    task = get_task("kv-lookup", **KV)
    ranking = [3, 0, 5, 1, 4, 2]
    m = get_method(f"curve:{_policy_with(tmp_path, ranking)}:oracle").for_task(task)
    p = task.prompt(task.examples(1)[0], 4)  # gold at slot 4
    out = m.rearrange([p], task, None)[0]
    assert _body(out, 3, task) == _body(p, 4, task)  # the gold (the oracle's best) in the best slot
    # the rest in prompt order (the oracle's ties): slot 0 (2nd best) gets item 0, slot 5 gets item 1, ...
    assert [_body(out, s, task) for s in (0, 5, 1, 4, 2)] == [_body(p, s, task) for s in (0, 1, 2, 3, 5)]


def test_curve_from_a_sweep_folder_follows_its_measured_ranking(model_dir, tmp_path):
    res = _sweep(model_dir, tmp_path)
    m = get_method(f"curve:{tmp_path / 'curve'}:oracle")
    acc = [p["accuracy"] for p in res.per_position]
    best = max(range(len(acc)), key=lambda s: (acc[s], -s))
    assert m.policy["ranking"][0] == best and m.fitted_on == {"task": "kv-lookup", "seed": 0, "skip": 100, "n": 4}
    cmp = run_compare(SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=3, dtype="fp32",
                                  positions=[0, 5]), ["none", f"curve:{tmp_path / 'curve'}:oracle"], tmp_path / "c",
                      progress=False)
    rows = cmp.entries[1]["rows"] if "rows" in cmp.entries[1] else None
    logged = [json.loads(x) for x in (tmp_path / "c" / cmp.entries[1]["dir"] / "examples.jsonl").read_text().splitlines()]
    assert {r["arranged_slot"] for r in logged} == {best}, rows  # the gold always went to the measured best slot


@pytest.mark.parametrize("change, message", [
    ({"model": "another"}, "belongs to model another, not"),
    ({"task": {**get_task("kv-lookup", facts=6).config(), "digits": 9}}, r"another task shape \(differs in digits"),
])
def test_curve_from_another_model_or_task_shape_is_refused_in_one_line(model_dir, tmp_path, change, message):
    f = _policy_with(tmp_path, [0, 1, 2, 3, 4, 5], model=change.get("model", "tiny-llama"), task=change.get("task"))
    cfg = SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=2, dtype="fp32", method=f"curve:{f}")
    with pytest.raises(PosbiasError, match=message) as e:
        run_sweep(cfg, None, progress=False)
    assert "\n" not in str(e.value)


def test_curve_with_another_slot_count_and_on_its_own_examples_is_refused(model_dir, tmp_path):
    f = _policy_with(tmp_path, [0, 1, 2, 3])
    with pytest.raises(PosbiasError, match="ranks 4 slots, the task has 6"):
        get_method(f"curve:{f}").check_task(get_task("kv-lookup", **KV), [0], "teacher-forced")
    res_dir = tmp_path / "s"
    run_sweep(SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=2, dtype="fp32"), res_dir,
              progress=False)
    with pytest.raises(PosbiasError, match="overlap"):  # the curve's own examples are not held out
        run_compare(SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=2, dtype="fp32"),
                    ["none", f"curve:{res_dir}"], tmp_path / "c", progress=False)


def test_a_curve_measured_under_a_method_or_on_some_slots_is_not_a_policy(model_dir, tmp_path):
    run_sweep(SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=2, dtype="fp32", positions=[0, 5]),
              tmp_path / "some", progress=False)
    with pytest.raises(PosbiasError, match="needs every slot"):
        get_method(f"curve:{tmp_path / 'some'}")


def test_the_text_after_the_last_colon_is_the_signal_and_must_be_bm25_or_oracle(tmp_path):
    """curve:RUN:SIGNAL: an unknown signal is refused naming it; a path that exists as written is RUN whole (a path may
    hold colons); a tail with a `/` is part of RUN (methods/curve.py's rule)."""
    f = _policy_with(tmp_path, [3, 0, 5, 1, 4, 2])
    with pytest.raises(PosbiasError, match="unknown relevance signal 'bogus' for curve") as e:
        get_method(f"curve:{f}:bogus")
    assert "\n" not in str(e.value) and f"curve:{f}:oracle" in str(e.value)
    assert get_method(f"curve:{f}:oracle").signal == "oracle" and get_method(f"curve:{f}").signal == "bm25"
    odd = tmp_path / "runs:1" / "p:oracle"  # a folder and a file whose names hold colons
    odd.parent.mkdir()
    odd.write_bytes(f.read_bytes())
    assert (get_method(f"curve:{odd}").signal, get_method(f"curve:{odd}").policy_path) == ("bm25", str(odd))
    assert get_method(f"curve:{odd}:oracle").signal == "oracle"
    with pytest.raises(PosbiasError, match="nor at .*absent with the relevance signal 'bogus'"):
        get_method(f"curve:{tmp_path / 'absent'}:bogus")
    with pytest.raises(PosbiasError, match=r"no policy or finished sweep at .*runs:1/absent --"):
        get_method(f"curve:{tmp_path / 'runs:1' / 'absent'}")


BROKEN = {  # a field of the policy file -> a value of the wrong type, and the field the refusal names
    "ranking floats": ({"ranking": [3.0, 0.0, 5.0, 1.0, 4.0, 2.0]}, "'ranking' must be a list of slots"),
    "ranking strings": ({"ranking": ["3", "0", "5", "1", "4", "2"]}, "'ranking' must be a list of slots"),
    "task a string": ({"task": "kv-lookup"}, "'task' must be an object"),
    "measured a string": ({"measured": "hand"}, "'measured' must be an object"),
    "model missing": ({"model": None}, "'model' must be the name of the model"),
    "n_slots a string": ({"n_slots": "6"}, "'n_slots' must be a whole number"),
    "a slot's accuracy": ({"slots": [{"slot": 0, "accuracy": "high", "ci": [0, 1], "n": 10}]}, r"'slots\[0\]' must be"),
    "measured.run": ({"measured": {"run": 5}}, "'measured.run' must be"),
    "fitted_on a string": ({"fitted_on": "kv-lookup"}, "'fitted_on' must be an object"),
    "fitted_on.skip": ({"fitted_on": {"task": "kv-lookup", "seed": 0, "skip": "500", "n": 10}}, "'fitted_on.skip' must"),
    "curve a string": ({"curve": "flat"}, "'curve' must be an object"),
    "curve.gap_ci": ({"curve": {"separable": False, "gap": 0.1, "gap_ci": "wide", "average": 0.5}}, "'curve.gap_ci' must"),
}


@pytest.mark.parametrize("change, field", BROKEN.values(), ids=list(BROKEN))
def test_a_policy_field_of_the_wrong_type_is_refused_before_the_model_loads(model_dir, tmp_path, monkeypatch, capsys,
                                                                           change, field):
    """`posbias sweep --method curve:POLICY`: exit 2, one line naming the file and the field, no model load, no file
    in the new output folder; read_policy (the Python API, the integrations) refuses it the same way."""
    import sys

    from transformers import AutoModelForCausalLM

    from posbias.cli import main
    from posbias.measure import read_policy

    f = _policy_with(tmp_path, [3, 0, 5, 1, 4, 2])
    f.write_text(json.dumps({**json.loads(f.read_text()), **change}))
    with pytest.raises(PosbiasError, match=field) as e:
        read_policy(f)
    assert str(e.value).startswith(f"{f}: ") and "\n" not in str(e.value)
    loads = []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loads.append(a))
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["posbias", "sweep", "--model", str(model_dir), "--facts", "6", "--n", "2", "--dtype",
                                      "fp32", "--quiet", "--method", f"curve:{f}", "--out", str(out)])
    with pytest.raises(SystemExit) as ex:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert ex.value.code == 2 and len(err) == 1 and err[0].startswith(f"posbias: error: {f}: ") and " -- " in err[0], err
    assert not loads and not (out.exists() and any(p.is_file() for p in out.rglob("*")))


@pytest.mark.parametrize("mode", ["shift", "perm"])
def test_ensemble_orders_are_permutations_and_order_0_is_the_prompt(mode):
    task = get_task("kv-lookup", facts=10)
    m = get_method(f"ensemble:4:{mode}")
    p = task.prompt(task.examples(1)[0], 2)
    orders = [m.permutation(p, j) for j in range(4)]
    assert orders[0] == list(range(10)) and all(sorted(o) == list(range(10)) for o in orders)
    assert len({tuple(o) for o in orders}) == 4
    if mode == "shift":  # the gold visits evenly spread slots: 2, 2+3 (round 2.5), 2+5, 2+8 (round 7.5)
        assert [o.index(2) for o in orders] == [2, 4, 7, 0]
    assert orders == [m.permutation(p, j) for j in range(4)]  # seeded: the same again


def test_ensemble_vote_majority_and_mean_logprob():
    m = get_method("ensemble:3")
    rows = [{"prediction": "A b", "correct": False, "logprob": -1.0}, {"prediction": "c", "correct": True, "logprob": -2.0},
            {"prediction": "the c.", "correct": True, "logprob": -3.0}]
    v = m.vote(rows)
    assert v["chosen_order"] == 1 and v["correct"] and v["agreement"] == pytest.approx(2 / 3) and not v["tie"]
    assert v["ensemble_logprob"] == pytest.approx(-2.0) and v["passes"] == 3


def _tied(k: int, i: int) -> list[dict]:
    """K orders of example i that all answer differently (order j answers "a{j}"; order 0 alone is right)."""
    return [{"example_id": f"e{i}#order{j}", "position": 3, "prediction": f"a{j}", "correct": j == 0} for j in range(k)]


@pytest.mark.parametrize("k", [2, 3, 4])
def test_an_ensemble_tie_does_not_go_to_the_unmodified_order(k):
    """A tie (every order answers differently) goes to each tied answer about equally often, seeded: with the old rule
    (the earliest order) ensemble:2 returned the unmodified answer on every row, and so did every tie at any K."""
    m = get_method(f"ensemble:{k}")
    votes = [m.vote(_tied(k, i)) for i in range(300)]
    share = [sum(v["chosen_order"] == j for v in votes) / len(votes) for j in range(k)]
    assert all(abs(s - 1 / k) < 0.1 for s in share), share  # each order's answer wins its share of ties
    assert all(v["tie"] and v["agreement"] == 1 / k for v in votes)
    assert [m.vote(_tied(k, i))["chosen_order"] for i in range(20)] == [v["chosen_order"] for v in votes[:20]]  # seeded
    two = m.vote([{**r, "prediction": "x" if j < 2 else r["prediction"]} for j, r in enumerate(_tied(k, 0))])
    if k > 2:  # a majority is no tie: orders 0 and 1 agree
        assert two["chosen_order"] == 0 and not two["tie"]


@pytest.mark.parametrize("spec, n, most", [("ensemble:5", 4, 4), ("ensemble:5:shift:adaptive", 4, 4),
                                           ("ensemble:25:perm", 4, 24), ("ensemble:7:perm", 3, 6)])
def test_more_orders_than_the_items_have_are_refused_naming_the_most(spec, n, most):
    """K above the distinct orders (n shifts of n items, n! permutations) would read an order twice: refused in one
    line before the model loads, naming the most; the spec the hint suggests is accepted."""
    task = get_task("kv-lookup", facts=n)
    with pytest.raises(PosbiasError, match=f"have only {most} distinct") as e:
        get_method(spec).check_task(task, [0], "teacher-forced")
    assert "\n" not in str(e.value)
    hint = str(e.value).split(" -- ")[1].split()[1]  # "write ensemble:4:shift or fewer orders ..."
    assert hint.startswith(f"ensemble:{most}:")
    get_method(hint).check_task(task, [0], "teacher-forced")


@pytest.mark.parametrize("spec, n", [("ensemble:4", 4), ("ensemble:24:perm", 4), ("ensemble:6:perm", 3), ("ensemble:7", 10)])
def test_every_order_of_an_ensemble_is_a_different_one(spec, n):
    """K up to the distinct orders: K different orders of every prompt (seeded shuffles may repeat: redrawn)."""
    task = get_task("kv-lookup", facts=n)
    m = get_method(spec)
    m.check_task(task, [0], "teacher-forced")
    for ex in task.examples(5):
        p = task.prompt(ex, 1)
        orders = [tuple(m.permutation(p, j)) for j in range(m.orders)]
        assert len(set(orders)) == m.orders and orders[0] == tuple(range(n))


@pytest.mark.parametrize("spec, message", [("ensemble:1", "at least 2 orders"), ("ensemble:3:bogus", "bad ensemble spec"),
                                           ("ensemble:2:adaptive", "needs more than 2")])
def test_bad_ensemble_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(PosbiasError, match=message):
        get_method(spec)


def test_ensemble_sweep_counts_passes_and_adaptive_reads_fewer(model_dir, tmp_path):
    cfg = SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=3, dtype="fp32", positions=[0, 3])
    full = run_compare(cfg, ["none", "ensemble:4", "ensemble:4:shift:adaptive"], tmp_path / "c", progress=False)
    _, ens, ada = full.entries
    assert ens["summary"]["decision"]["forward_passes_per_verdict"] == 4
    rows = [json.loads(x) for x in (tmp_path / "c" / ada["dir"] / "examples.jsonl").read_text().splitlines()]
    for r in rows:  # 2 passes exactly when the first two orders agree, else all 4
        agree = len({r["order_predictions"][0].strip().lower(), r["order_predictions"][1].strip().lower()}) == 1
        assert r["passes"] == (2 if agree else 4)
    mean = sum(r["passes"] for r in rows) / len(rows)
    assert ada["summary"]["decision"]["forward_passes_per_verdict"] == pytest.approx(mean)
    assert "ensemble:4:shift" in full.format() and "passes per verdict" in full.format()


def test_ensemble_sweep_resumes_to_the_same_rows(model_dir, tmp_path, monkeypatch):
    from posbias.methods import ensemble

    cfg = SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=3, dtype="fp32", positions=[1, 4],
                      method="ensemble:3:perm")
    monkeypatch.setattr(ensemble, "CHUNK", 1)  # one example per chunk, in both runs (the same batches)
    whole = run_sweep(cfg, tmp_path / "a", progress=False)
    calls = {"n": 0}
    real = ensemble.Ensemble._orders

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ensemble.Ensemble, "_orders", dies)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, tmp_path / "b", progress=False)
    monkeypatch.setattr(ensemble.Ensemble, "_orders", real)
    again = run_sweep(cfg, tmp_path / "b", resume=True, progress=False)
    assert (tmp_path / "a" / "examples.jsonl").read_text() == (tmp_path / "b" / "examples.jsonl").read_text()
    assert again.summary["average"] == whole.summary["average"]


def test_the_cost_estimate_counts_every_order_an_ensemble_reads(model_dir, tmp_path):
    est = {}
    for spec in ("none", "ensemble:3"):
        cfg = SweepConfig(model=str(model_dir), task="kv-lookup", task_options=KV, n=2, dtype="fp32", positions=[0, 3],
                          method=spec, price_in=1.0, price_out=1.0)
        est[spec] = run_sweep(cfg, tmp_path / spec.replace(":", "-"), progress=False).record["cost"]["estimate"]
    assert est["ensemble:3"]["requests"] == 3 * est["none"]["requests"]
    assert est["ensemble:3"]["prompt_tokens"] == pytest.approx(3 * est["none"]["prompt_tokens"], abs=3)
