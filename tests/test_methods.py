"""The methods interface: spec parsing, exact restore, sweeps/compare with a method, the LPES search
(files, cache, resume after a kill equals an uninterrupted run). Tiny random models, no weights."""

import json

import pytest
import torch

from posbias import SweepConfig, run_compare, run_sweep
from posbias.core.ga import GAConfig, GeneticSearch
from posbias.errors import PosbiasError
from posbias.lpes import SearchConfig, run_gain, run_search
from posbias.methods import Baseline, LayerScaling, UniformScaling, get_method
from posbias.methods.buckets import Buckets
from posbias.methods.mspoe import MsPoE

pytestmark = pytest.mark.usefixtures("one_thread")


def test_spec_parsing(tmp_path):
    assert isinstance(get_method("none"), Baseline)
    assert get_method("pi:1.2").factor == 1.2
    assert get_method("layers:1,1.5").factors == [1.0, 1.5]
    assert isinstance(get_method("mspoe"), MsPoE) and get_method("mspoe:1.0-1.4").max_ratio == 1.4
    assert get_method("buckets:10000,20000").bases == (10000.0, 20000.0)
    f = tmp_path / "factors.json"
    f.write_text(json.dumps({"factors": [1.0, 1.2]}))
    assert get_method(f"lpes:{f}").factors == [1.0, 1.2]
    assert get_method(f"pi:{f}").factor == pytest.approx(1.1)  # Sec. 4.1: PI = mean of the searched factors
    assert get_method(f"lpes:{tmp_path}").factors == [1.0, 1.2]  # a directory means DIR/factors.json
    for bad, msg in [("nope", "unknown method"), ("pi:0", "positive"), ("layers:a,b", "bad per-layer"),
                     ("mspoe:2-1", "0 < min <= max"), ("buckets:x", "bad bucket"), (f"lpes:{tmp_path}/x.json", "no factors")]:
        with pytest.raises(PosbiasError, match=msg):
            get_method(bad)


METHODS = [Baseline(), UniformScaling(1.5), LayerScaling([1.0, 2.0]), MsPoE(1.2, 1.8, layers=[0, 1]),
           Buckets((10000.0, 30000.0))]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_every_method_changes_inside_and_restores_exactly(loaded, method):
    ids = torch.randint(4, len(loaded.tokenizer), (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = loaded.model(input_ids=ids).logits
        with method.apply(loaded):
            inside = loaded.model(input_ids=ids).logits
        after = loaded.model(input_ids=ids).logits
    assert torch.equal(before, after)
    assert inside.shape == before.shape
    assert torch.equal(inside, before) == (method.name == "none")
    json.dumps(method.config())


def _cfg(model_dir, **kw):
    base = dict(model=str(model_dir), task="kv-lookup", task_options={"facts": 4, "digits": 3},
                positions="0,2,3", n=6, dtype="fp32", max_batch=8)
    return SweepConfig(**{**base, **kw})


@pytest.mark.parametrize("engine", ["teacher-forced", "generate"])
def test_sweep_records_the_method(model_dir, loaded, tmp_path, engine):
    tokens = 6 if engine == "generate" else None  # a token limit with teacher forcing is refused
    res = run_sweep(_cfg(model_dir, method="pi:1.5", engine=engine, max_new_tokens=tokens), tmp_path / "o",
                    loaded=loaded, progress=False)
    assert res.record["method"] == {"name": "pi", "factor": 1.5, "source": None}
    with pytest.raises(PosbiasError, match="different configuration"):
        run_sweep(_cfg(model_dir, method="pi:1.4", engine=engine, max_new_tokens=tokens), tmp_path / "o", resume=True,
                  loaded=loaded, progress=False)


def test_compare_runs_every_method_on_the_same_examples(model_dir, tmp_path):
    res = run_compare(_cfg(model_dir), ["none", "pi:1.5", "buckets:10000,30000"], tmp_path / "c", progress=False)
    rec = res.record
    assert [m["method"] for m in rec["methods"]] == ["none", "pi:1.5", "buckets:10000,30000"]
    assert (tmp_path / "c" / "compare.json").exists() and (tmp_path / "c" / "compare.png").stat().st_size > 1000
    ids = {}
    for m in rec["methods"]:
        lines = (tmp_path / "c" / m["dir"] / "examples.jsonl").read_text().splitlines()
        ids[m["dir"]] = [json.loads(x)["example_id"] for x in lines]
    assert len({tuple(sorted(v)) for v in ids.values()}) == 1
    assert "buckets" in res.format()
    assert rec["methods"][0]["vs_first"] == {"difference": 0.0, "ci": [0.0, 0.0], "se": 0.0, "mde80": 0.0}
    assert all(-1 <= m["vs_first"]["ci"][0] <= m["vs_first"]["difference"] <= m["vs_first"]["ci"][1] <= 1
               for m in rec["methods"])
    again = run_compare(_cfg(model_dir), ["none", "pi:1.5", "buckets:10000,30000"], tmp_path / "c", resume=True,
                        progress=False)
    assert again.entries == rec["methods"]


def _search_cfg(model_dir, **kw):
    ga = GAConfig(pop_size=6, n_parents=2, n_crossover=1, n_mutation=3, generations=3, n_points=2, y_min=1.0, y_max=2.0,
                  y_step=0.25, y_init=1.25, my=0.5, mx=1)
    base = dict(model=str(model_dir), task="kv-lookup", task_options={"facts": 4, "digits": 3}, n=4, skip=100,
                dtype="fp32", ga=ga)
    return SearchConfig(**{**base, **kw})


def test_lpes_search_files_and_held_out_check(model_dir, loaded, tmp_path):
    res = run_search(_search_cfg(model_dir), tmp_path / "s", progress=False, loaded=loaded).record
    out = tmp_path / "s"
    saved = json.loads((out / "factors.json").read_text())
    assert saved["factors"] == res["factors"] and len(res["factors"]) == 2
    assert all(1.0 <= f <= 2.0 for f in res["factors"])
    assert len(saved["history"]) == 4 and len(list((out / "log").glob("generation_*.json"))) == 4
    bests = [h["best_fitness"] for h in saved["history"]]
    assert saved["converged_at"] == bests.index(max(bests)) and bests[saved["converged_at"]] == saved["fitness"]
    assert saved["beats_unmodified"] == (saved["fitness"] > saved["baseline"]["fitness"])
    keys = [json.loads(x)["key"] for x in (out / "evals.jsonl").read_text().splitlines()]
    assert len(keys) == len(set(keys)) == res["evaluations"]  # never the same individual twice
    assert (out / "factors.png").stat().st_size > 1000
    with pytest.raises(PosbiasError, match="already holds an LPES search"):
        run_search(_search_cfg(model_dir), out, progress=False, loaded=loaded)
    with pytest.raises(PosbiasError, match="overlap"):  # searched on examples 100..103
        run_compare(_cfg(model_dir, skip=98), ["none", f"lpes:{out}/factors.json"], tmp_path / "c", progress=False)
    sweep = run_sweep(_cfg(model_dir, method=f"lpes:{out}"), tmp_path / "w", loaded=loaded, progress=False)
    assert sweep.record["method"]["factors"] == res["factors"]


def test_lpes_search_resumes_to_the_same_result(model_dir, loaded, tmp_path, monkeypatch):
    full = run_search(_search_cfg(model_dir), tmp_path / "full", progress=False, loaded=loaded).record
    real = GeneticSearch.step
    calls = {"n": 0}

    def killed_in_generation_two(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(GeneticSearch, "step", killed_in_generation_two)
    with pytest.raises(KeyboardInterrupt):
        run_search(_search_cfg(model_dir), tmp_path / "cut", progress=False, loaded=loaded)
    assert not (tmp_path / "cut" / "factors.json").exists()
    monkeypatch.setattr(GeneticSearch, "step", real)
    resumed = run_search(_search_cfg(model_dir), tmp_path / "cut", resume=True, progress=False, loaded=loaded).record
    drop = ("seconds_this_call", "history")
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    strip = [{k: v for k, v in h.items() if k != "wall_s"} for h in full["history"]]
    assert [{k: v for k, v in h.items() if k != "wall_s"} for h in resumed["history"]] == strip


def test_search_refuses_bad_config(model_dir, loaded, tmp_path):
    with pytest.raises(PosbiasError, match="weights"):
        run_search(_search_cfg(model_dir, weights=(0.5, 0.5, 0.5)), tmp_path / "b", progress=False, loaded=loaded)
    with pytest.raises(PosbiasError, match="search `space`"):
        run_search(_search_cfg(model_dir, space="grid"), tmp_path / "b", progress=False, loaded=loaded)


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "posbias.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_bad_input_names_the_fix(model_dir, tmp_path):
    r = _cli("sweep", "--model", str(model_dir), "--method", "warp:2", "--out", str(tmp_path / "s"))
    assert r.returncode == 2 and "unknown method 'warp:2'" in r.stderr and "use one of" in r.stderr
    assert not (tmp_path / "s").exists()
    r = _cli("compare", "--model", str(model_dir), "--methods", "none,none", "--out", str(tmp_path / "c"))
    assert r.returncode == 2 and "listed twice" in r.stderr
    r = _cli("lpes", "search", "--model", str(model_dir), "--weights", "0.5,0.5", "--out", str(tmp_path / "l"))
    assert r.returncode == 2 and "expected 3 numbers" in r.stderr
    r = _cli("lpes", "search", "--model", str(model_dir), "--y-init", "3", "--out", str(tmp_path / "l"))
    assert r.returncode == 2 and "posbias: error:" in r.stderr and not (tmp_path / "l" / "factors.json").exists()


def test_evals_are_reused_only_under_the_same_fitness(model_dir, loaded, tmp_path):
    from dataclasses import replace

    from posbias import get_task
    from posbias.mitigate.lpes import build_fitness, make_space

    cfg = _search_cfg(model_dir)
    run_search(cfg, tmp_path / "a", progress=False, loaded=loaded)
    space = make_space(cfg, 2)
    task = get_task("kv-lookup", facts=4, digits=3)

    def seen(c):
        return len(build_fitness(c, loaded, task, space).attach(tmp_path / "a" / "evals.jsonl").seen)

    assert seen(replace(cfg, ga=replace(cfg.ga, generations=7))) > 0  # the GA budget does not change fitness
    assert seen(replace(cfg, n=3)) == 0  # another search split does
    assert seen(replace(cfg, weights=(0.5, 0.25, 0.25))) == 0


class _ToyScorer:
    """Accuracies by position that depend on the factors, so the fitness formula can be checked by hand."""

    def __init__(self):
        self.calls = []

    def accuracy(self, rows, method, on_batch=None):
        self.calls.append(method.factors)
        s = sum(method.factors)
        return {0: 0.9, 5: 0.2 + 0.01 * s, 9: 0.6}


def test_lpes_fitness_is_the_weighted_accuracy_of_begin_middle_end():
    from posbias.core.ga import CurveSpace
    from posbias.mitigate.lpes import Fitness

    ga = GAConfig(pop_size=4, n_parents=2, n_crossover=1, n_mutation=1, n_points=2, y_min=1.0, y_max=2.0, y_step=0.5,
                  y_init=1.5)
    space = CurveSpace(3, ga)
    toy = _ToyScorer()
    fit = Fitness(toy, rows=[], positions=[0, 5, 9], weights=(0.2, 0.3, 0.5), space=space, fit_key="k")
    ind = space.initial()
    (value,) = fit([ind])
    s = sum(space.factors(ind))
    assert value == pytest.approx(0.2 * 0.9 + 0.3 * (0.2 + 0.01 * s) + 0.5 * 0.6)  # Sec. 3.2 / 4.1
    assert fit([ind]) == [value] and len(toy.calls) == 1  # cached: never scored twice
    other = Fitness(toy, rows=[], positions=[0, 5, 9], weights=(1.0, 0.0, 0.0), space=space, fit_key="k")
    assert other([ind]) == [pytest.approx(0.9)]


def test_gain_against_length_reads_the_paired_differences_of_each_comparison(model_dir, loaded, tmp_path):
    """Two comparisons at different fact counts: one point per (comparison, entry), tokens from the rows,
    differences copied from compare.json (the first entry is the reference), and longer prompts for more facts."""
    recs = {}
    for facts in (3, 6):
        cfg = _cfg(model_dir, task_options={"facts": facts, "digits": 3}, positions="0,2")
        recs[facts] = run_compare(cfg, ["none", "pi:1.5"], tmp_path / f"c{facts}", loaded=loaded, progress=False).record
    gain = run_gain([tmp_path / "c3", tmp_path / "c6"], tmp_path / "g")
    pts = gain.record["points"]
    assert gain.record == json.loads((tmp_path / "g" / "gain.json").read_text()) and len(gain.rows) == len(pts) == 4
    assert gain.rows[2]["task_options.facts"] == 6 and gain.rows[2]["difference"] == pts[2]["difference"]
    assert [(p["method"], p["reference"]) for p in pts] == [("none", True), ("pi:1.5", False)] * 2
    assert pts[1]["difference"] == recs[3]["methods"][1]["vs_first"]["difference"]
    assert pts[3]["ci"] == recs[6]["methods"][1]["vs_first"]["ci"]
    rows = [json.loads(x) for x in (tmp_path / "c6" / "none" / "examples.jsonl").read_text().splitlines()]
    assert pts[2]["tokens"] == round(sum(r["prompt_tokens"] for r in rows) / len(rows), 1)
    assert pts[2]["tokens"] > pts[0]["tokens"]  # 6 facts make longer prompts than 3
    assert (tmp_path / "g" / "gain.png").stat().st_size > 1000 and "pi:1.5" in gain.format()
    with pytest.raises(PosbiasError, match="is not a folder"):
        run_gain([tmp_path / "missing"], tmp_path / "g2")
    assert not (tmp_path / "g2").exists()


def test_the_package_docstring_names_every_built_in_method():
    """posbias.methods' docstring lists the methods by hand: a built-in registered without a line there fails here."""
    import re

    import posbias.methods as pm

    listed = set(re.findall(r"^\s{2}([a-z]+)\b", pm.__doc__, re.M)) | set(re.findall(r"\| ([a-z]+)[\[:]", pm.__doc__))
    built_in = {n for n in pm.METHODS if pm.METHODS.origins.get(n) == "posbias"}
    assert built_in - listed == set()
