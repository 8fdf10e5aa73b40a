"""The public API a notebook uses (docs/python-api.md): at most 36 names at the top, the sub-namespaces with explicit
re-exports, and typed results that all have `.record`, `.rows` and `.format()`, built here on tiny random models.

Each rule is a function; a test shows on an injected bad case that it catches what it names."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import posbias
from conftest import char_tokenizer, position_sensitive, tiny_loaded, tiny_model
from posbias.models.load import Loaded

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_TOP = 36  # 35, and register_backend beside register_task and register_method (one registration shape)
NAMESPACES = ("lpes", "hidden", "moice", "distill", "explain", "synth", "measure", "data")
RESULTS = {  # every public result class, by where a notebook finds it
    "posbias.SweepResult", "posbias.CompareResult", "posbias.GridResult", "posbias.ReportResult",
    "posbias.lpes.SearchResult", "posbias.lpes.GainResult", "posbias.hidden.SearchResult", "posbias.moice.TrainResult",
    "posbias.distill.DistillResult", "posbias.explain.TheoryResult", "posbias.explain.AttentionResult",
    "posbias.explain.ShiftingResult", "posbias.explain.PriorResult", "posbias.synth.GridResult", "posbias.synth.RunResult",
}
KV = {"facts": 4, "digits": 3}


def public_modules() -> dict[str, types.ModuleType]:
    return {"posbias": posbias, **{f"posbias.{n}": getattr(posbias, n) for n in NAMESPACES}}


# ----------------------------------------------------------------------------- the rules


def top_level_problems(module: types.ModuleType, limit: int = MAX_TOP) -> list[str]:
    """At most `limit` names in __all__, each once, and no public name outside it (a module attribute that is a
    package of the library, such as posbias.eval, is not a name of the API)."""
    names = list(module.__all__)
    bad = [f"{len(names)} top-level names > {limit}: move some into a sub-namespace"] if len(names) > limit else []
    bad += [f"{n} is listed twice in __all__" for n in sorted({n for n in names if names.count(n) > 1})]
    bad += [f"{n} is public but not in __all__" for n, v in sorted(vars(module).items())
            if not n.startswith("_") and not isinstance(v, types.ModuleType) and n not in names]
    return bad


def unresolved(module: types.ModuleType) -> list[str]:
    return [n for n in module.__all__ if not hasattr(module, n)]


def reexport_problems(source: str, exported: list[str]) -> list[str]:
    """A namespace module only re-exports: every import binds its name explicitly (`from .x import y as y`, or
    `as z` to rename), binds only names of __all__, __all__ names nothing it does not import, and no `# noqa`."""
    bad, bound = [], set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.asname is None:
                    bad.append(f"line {node.lineno}: `{a.name}` is re-exported implicitly: write `{a.name} as {a.name}`")
                bound.add(a.asname or a.name)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            bad.append(f"line {node.lineno}: defines {node.name} itself: a namespace only re-exports")
        elif isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] != ["__all__"]:
            bad.append(f"line {node.lineno}: assigns a name other than __all__: a namespace only re-exports")
    bad += [f"`{n}` is imported but not in __all__" for n in sorted(bound - set(exported))]
    bad += [f"`{n}` is in __all__ but not imported" for n in sorted(set(exported) - bound)]
    bad += [f"line {i}: a `# noqa`" for i, line in enumerate(source.splitlines(), 1) if "noqa" in line]
    return bad


def result_problems(cls: type) -> list[str]:
    """`record` and `rows` (dataclass fields or properties), a callable `format`, and a docstring that says what a
    row is (it names `rows`)."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    bad = [f"no `{a}`" for a in ("record", "rows") if a not in fields and not isinstance(getattr(cls, a, None), property)]
    bad += [] if callable(getattr(cls, "format", None)) else ["no `format()`"]
    bad += [] if "`rows`" in (cls.__dict__.get("__doc__") or "") else ["its docstring does not say what a row is"]
    return bad


def row_problems(rows) -> list[str]:
    """Tidy rows: a non-empty list of flat dicts (no value is itself a dict)."""
    if not isinstance(rows, list) or not rows:
        return ["rows is not a non-empty list"]
    bad = [f"row {i} is not a dict" for i, r in enumerate(rows) if not isinstance(r, dict)]
    return bad + [f"row {i}: `{k}` holds a dict" for i, r in enumerate(rows) if isinstance(r, dict)
                  for k, v in r.items() if isinstance(v, dict)]


def public_results() -> dict[str, type]:
    return {f"{m}.{n}": getattr(mod, n) for m, mod in public_modules().items() for n in mod.__all__
            if n.endswith("Result") and isinstance(getattr(mod, n), type)}


# ----------------------------------------------------------------------------- the tree follows them


def test_the_top_level_has_at_most_36_names_all_in___all__():
    assert top_level_problems(posbias) == []


@pytest.mark.parametrize("name", sorted(public_modules()))
def test_every_name_in___all___resolves(name):
    assert unresolved(public_modules()[name]) == []


@pytest.mark.parametrize("name", sorted(public_modules()))
def test_namespaces_re_export_explicitly(name):
    module = public_modules()[name]
    assert reexport_problems(Path(module.__file__).read_text(), module.__all__) == []


def test_every_public_result_is_found_and_typed():
    found = public_results()
    assert set(found) == RESULTS, "a new public result? add it to RESULTS and build one in `built` below"
    assert {name: result_problems(cls) for name, cls in found.items() if result_problems(cls)} == {}


# ----------------------------------------------------------------------------- and each rule catches a breach


def test_the_rules_catch_a_breach():
    crowded = types.ModuleType("crowded")
    crowded.__all__ = [f"n{i}" for i in range(MAX_TOP + 1)]
    crowded.__dict__.update({n: 1 for n in crowded.__all__}, extra=2)
    problems = top_level_problems(crowded)
    assert problems[0].startswith(f"{MAX_TOP + 1} top-level names > {MAX_TOP}") and "extra is public but not in __all__" in problems
    missing = types.ModuleType("missing")
    missing.__all__ = ["gone"]
    assert unresolved(missing) == ["gone"]
    implicit = "from .eval.sweep import run_sweep\nfrom .x import y as y  # noqa: F401\nz = 1\n__all__ = ['run_sweep', 'w']\n"
    found = reexport_problems(implicit, ["run_sweep", "w"])
    assert any("`run_sweep` is re-exported implicitly" in p for p in found)
    assert {"`y` is imported but not in __all__", "`w` is in __all__ but not imported", "line 2: a `# noqa`"} <= set(found)
    assert any("assigns a name other than __all__" in p for p in found)

    @dataclasses.dataclass
    class HalfResult:
        record: dict

    assert result_problems(HalfResult) == ["no `rows`", "no `format()`", "its docstring does not say what a row is"]
    assert row_problems([{"a": 1, "b": {"c": 2}}]) == ["row 0: `b` holds a dict"] and row_problems([])


# ----------------------------------------------------------------------------- real results on tiny models


def _hidden_model() -> Loaded:
    """Six layers with sharpened q.k, so the hidden channel search finds monotone channels (as tests/test_hidden.py)."""
    tok = char_tokenizer()
    model = tiny_model("llama", len(tok), layers=6)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    return Loaded(model=model, tokenizer=tok, info={"name": "tiny-6", "context_window": 2048, "dtype": "fp32",
                                                     "device": "cpu"})


def _measure(root: Path, model: str, loaded: Loaded) -> dict:
    cfg = posbias.SweepConfig(model=model, task_options=KV, positions=[0, 3], n=2, dtype="fp32")
    run = dict(loaded=loaded, progress=False)
    out = {"posbias.SweepResult": (posbias.run_sweep(cfg, root / "sweep", **run), root / "sweep" / "sweep.json"),
           "posbias.CompareResult": (posbias.run_compare(cfg, ["none", "pi:1.5"], root / "cmp", **run),
                                     root / "cmp" / "compare.json")}
    grid = posbias.GridConfig(model=model, task_options={"digits": 3}, sizes="3,4", depths="0%,100%", n=2, dtype="fp32")
    out["posbias.GridResult"] = (posbias.run_grid(grid, root / "grid", **run), root / "grid" / "grid.json")
    out["posbias.lpes.GainResult"] = (posbias.lpes.run_gain([root / "cmp"], root / "gain"), root / "gain" / "gain.json")
    out["posbias.ReportResult"] = (posbias.build_report([root / "sweep", root / "cmp"], root / "report.html"), None)
    return out


def _mitigate(root: Path, model: str, loaded: Loaded) -> dict:
    ga = posbias.lpes.GAConfig(pop_size=4, n_parents=2, n_crossover=1, n_mutation=1, generations=1, n_points=2,
                               y_min=1.0, y_max=1.5, y_step=0.25, y_init=1.25, my=0.25, mx=1)
    lpes = posbias.lpes.SearchConfig(model=model, task_options=KV, n=2, skip=100, dtype="fp32", ga=ga)
    hidden = posbias.hidden.SearchConfig(model="tiny-6", task_options=KV, n=2, skip=100, dtype="fp32", samples=4,
                                         length=32, top_k=1, scales=(0.0,))
    moice = posbias.moice.TrainConfig(model="tiny", dtype="fp32", task_options={"facts": 3, "digits": 3}, steps=2,
                                      batch=2, micro_batch=2, n=2, lr=0.05, top_k=2)
    distill = posbias.distill.DistillConfig(model=model, task_options=KV, n=1, k=2, correct_only=False, dtype="fp32",
                                            max_steps=1, save_steps=1)
    sharp = tiny_loaded("llama")
    position_sensitive(sharp.model)
    return {
        "posbias.lpes.SearchResult": (posbias.lpes.run_search(lpes, root / "lpes", loaded=loaded, progress=False),
                                      root / "lpes" / "factors.json"),
        "posbias.hidden.SearchResult": (posbias.hidden.run_search(hidden, root / "hidden", loaded=_hidden_model(),
                                                                  progress=False), root / "hidden" / "hidden.json"),
        "posbias.moice.TrainResult": (posbias.moice.run_train(moice, root / "moice", loaded=sharp, progress=False),
                                      root / "moice" / "moice.json"),
        "posbias.distill.DistillResult": (posbias.distill.run_distill(distill, root / "distill", loaded=loaded,
                                                                      progress=False), root / "distill" / "distill.json"),
    }


def _explain(root: Path, model: str, loaded: Loaded) -> dict:
    ex, run = posbias.explain, dict(loaded=loaded, progress=False)
    split = dict(model=model, task_options=KV, n=1, dtype="fp32")
    data = {"n_classes": 64, "n_labels": 8, "burstiness": 2, "n_items": 4, "dim": 16}
    grid = posbias.synth.grid_runs("sinks", "quick", iters=4, seeds=1, eval_seqs=20, sink_seqs=10, position_seqs=8,
                                   curve_seqs=8, log_points=2, masks=["causal"], **data)
    one = posbias.synth.one_run_config(iters=4, eval_seqs=20, data=data)
    return {
        "posbias.explain.TheoryResult": (ex.run_theory(ex.TheoryConfig(n_tokens=32, depth=8, check_tokens=32,
                                                                       check_depth=8), root / "theory"),
                                         root / "theory" / "theory.json"),
        "posbias.explain.AttentionResult": (ex.run_attention(ex.AttentionConfig(**split, positions=[0, 3]),
                                                             root / "attention", **run), root / "attention" / "attention.json"),
        "posbias.explain.ShiftingResult": (ex.run_shifting(ex.ShiftingConfig(**split, positions="0,3"), root / "shift", **run),
                                           root / "shift" / "shifting.json"),
        "posbias.explain.PriorResult": (ex.run_prior(ex.PriorConfig(**split), root / "prior", **run),
                                        root / "prior" / "prior.json"),
        "posbias.synth.GridResult": (posbias.synth.run_grid("sinks", grid, root / "synth", progress=False),
                                     root / "synth" / "sinks.json"),
        "posbias.synth.RunResult": (posbias.synth.run_single(one, root / "one", progress=False), root / "one"),
    }


@pytest.fixture(scope="module")
def built(model_dir, loaded, tmp_path_factory) -> dict:
    """name -> (a result of each public kind, its result file or None), each from a tiny run."""
    root = tmp_path_factory.mktemp("public-api")
    return {**_measure(root, str(model_dir), loaded), **_mitigate(root, str(model_dir), loaded),
            **_explain(root, str(model_dir), loaded)}


def test_every_result_kind_is_built(built):
    assert set(built) == RESULTS


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_a_real_result_has_its_record_rows_and_text(built, name):
    res, path = built[name]
    assert type(res).__name__ == public_results()[name].__name__
    if path is not None and path.is_dir():  # a synthetic run's JSON is named by its configuration
        (path,) = path.glob("*.json")
    if path is not None:  # record: the content of the run's result file
        assert json.loads(json.dumps(res.record)) == json.loads(path.read_text())
    else:  # the report's file is the page: its record says what the page holds
        assert res.record["sections"] == res.rows and Path(res.record["out"]).is_file()
    assert row_problems(res.rows) == []
    text = res.format()
    assert isinstance(text, str) and text.strip() and "Result(" not in text


def test_the_cli_prints_what_format_returns(model_dir, built, tmp_path, monkeypatch, capsys):
    """`posbias theory` prints the result's format(): the same text a notebook gets."""
    from posbias.cli import main

    monkeypatch.setattr(sys, "argv", ["posbias", "theory", "--out", str(tmp_path / "t"), "--tokens", "32", "--depth", "8",
                                      "--no-real"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0
    assert built["posbias.explain.TheoryResult"][0].format() in capsys.readouterr().out


def test_drawing_a_figure_leaves_the_sessions_matplotlib_backend_alone(tmp_path):
    """A run draws its PNGs outside pyplot: a notebook's backend (inline plots) is as it was afterwards."""
    code = ("import sys, matplotlib; matplotlib.use('svg')\n"
            "from posbias.report.plots import plot_curve\n"
            "plot_curve([{'position': 0, 'accuracy': 0.5, 'ci_low': 0.2, 'ci_high': 0.8}], 't', sys.argv[1])\n"
            "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(posbias.__file__).parents[1])}
    env.pop("MPLBACKEND", None)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.png")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["svg", "False"] and (tmp_path / "c.png").stat().st_size > 1000
