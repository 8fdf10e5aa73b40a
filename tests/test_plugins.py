"""Plugins (posbias/plugins.py) and the one registration shape (posbias/registry.py).

The example plugin (tests/plugin) is a real package that conftest installs with pip before posbias is imported; it
adds a task, a method of each kind (rearranger, model change, reading, decision rule), a backend, a model name, a
scoring engine and a server dialect, each one file registered in one line; the task and the methods join the
conformance matrix and the method suite without a test of their own. Here: they are listed with where they came
from, they run (the model name on the real SmolLM2, the engine on a tiny model, the dialect against the real vLLM
server), a plugin that takes a name is left out with one warning, and every registry refuses a
second entry under a taken name.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import posbias
from conftest import install_plugin
from posbias import (
    BACKENDS,
    METHODS,
    MODELS,
    PLUGINS,
    TASKS,
    Method,
    PosbiasError,
    SweepConfig,
    register_method,
    register_task,
    run_compare,
    run_sweep,
)
from posbias.cli import app
from posbias.cli.options import engine_values
from posbias.measure import DIALECTS, ENGINES, register_backend, register_dialect, register_engine, register_model
from posbias.scoring.engines import Generate

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = Path(__file__).resolve().parent / "data"  # the tests' own files (no data set)
ORIGIN = "plugin example (posbias-example-plugin 0.1.0)"
ADDED = {"task": ["kv-tiny"], "method": ["reverse", "temper", "twice", "first-order"], "backend": ["hf-plugin"],
         "model": ["smollm2-plugin"], "engine": ["generate-plugin"], "dialect": ["vllm-plugin"]}
REGISTRIES = {"task": TASKS, "method": METHODS, "backend": BACKENDS, "model": MODELS, "engine": ENGINES, "dialect": DIALECTS}
LISTING = {"task": "tasks", "method": "methods", "backend": "backends", "model": "models", "dialect": "backends"}


def test_the_plugin_s_entries_are_registered_and_listed_with_their_origin():
    """Each listing command prints the plugin's entries with their origin (the dialects under `posbias backends`);
    --engine's help lists the engines."""
    assert PLUGINS == {"example": ORIGIN}
    for kind, names in ADDED.items():
        listing = CliRunner().invoke(app, [LISTING[kind]]).output if kind in LISTING else ""
        for name in names:
            assert REGISTRIES[kind].origins[name] == ORIGIN, (kind, name)
            if kind == "engine":
                assert f" {name} " in engine_values() or f" {name}." in engine_values(), engine_values()
                continue
            line = next(x for x in listing.splitlines() if x.strip().startswith((name + " ", name + ":")))
            assert f"[{ORIGIN}]" in line, line
    assert METHODS.origins["pi"] == "posbias" and "[" not in CliRunner().invoke(app, ["methods"]).output.split("\n")[0]
    assert all(o == "posbias" for r in (MODELS, ENGINES, DIALECTS) for n, o in r.origins.items() if "plugin" not in n)


def test_the_plugin_s_task_method_and_backend_run_together(model_dir, loaded, tmp_path):
    """`hf-plugin:DIR` (the plugin's backend) reads the rows the built-in in-process backend reads, on the plugin's
    task under its methods; the reading method's second pass agrees with its first (the model is untouched)."""
    cfg = dict(task="kv-tiny", positions="0,3", n=3)
    for spec in ("reverse", "twice", "temper:2"):
        plugin = run_sweep(SweepConfig(model=f"hf-plugin:{model_dir}", method=spec, dtype="fp32", **cfg), progress=False)
        local = run_sweep(SweepConfig(model=str(model_dir), method=spec, **cfg), loaded=loaded, progress=False)
        assert [r["correct"] for r in plugin.rows] == [r["correct"] for r in local.rows], spec
        assert plugin.record["config"]["model"].startswith("hf-plugin:") and plugin.record["task"]["n_slots"] == 4
    twice = run_sweep(SweepConfig(model=str(model_dir), method="twice", **cfg), loaded=loaded, progress=False)
    assert len(twice.rows) == 6 and all(r["agrees"] is True for r in twice.rows)
    reversed_ = run_sweep(SweepConfig(model=str(model_dir), method="reverse", **cfg), loaded=loaded, progress=False)
    assert {r["position"]: r["arranged_slot"] for r in reversed_.rows} == {0: 3, 3: 0}


def test_the_plugin_s_decision_rule_answers_every_order_as_the_first(loaded, tmp_path):
    cmp = run_compare(SweepConfig(task="mc-kv", task_options={"facts": 3, "digits": 3}, n=3), ["none", "first-order"],
                      tmp_path / "c", loaded=loaded, progress=False)
    rows = [r for r in cmp.rows if r["method"] == "first-order"]
    assert len(rows) == 12 and all("raw_choice" in r for r in rows)
    by_item: dict = {}
    for r in rows:  # candidate c sits at slot (c + order) % 4: every order names the candidate the first order named
        by_item.setdefault(r["example_id"], set()).add((r["choice"] - r["position"]) % 4 if r["choice"] >= 0 else -1)
    assert all(len(c) == 1 for c in by_item.values()), by_item


def test_the_plugin_s_engine_scores_as_the_generation_it_wraps(model_dir, loaded, tmp_path):
    """`engine=generate-plugin` (the plugin's engine: greedy generation under another name) gives generate's rows and
    is recorded under its own name; the command line takes it as --engine."""
    cfg = dict(task="kv-tiny", positions="0,3", n=3, max_new_tokens=4)
    plugin = run_sweep(SweepConfig(engine="generate-plugin", **cfg), loaded=loaded, progress=False)
    builtin = run_sweep(SweepConfig(engine="generate", **cfg), loaded=loaded, progress=False)
    assert [(r["correct"], r["prediction"]) for r in plugin.rows] == [(r["correct"], r["prediction"]) for r in builtin.rows]
    assert plugin.record["config"]["engine"] == "generate-plugin" and len(plugin.rows) == 6
    run = CliRunner().invoke(app, ["sweep", "--model", str(model_dir), "--dtype", "fp32", "--task", "kv-tiny", "--positions",
                                   "0,3", "--n", "1", "--engine", "generate-plugin", "--max-new-tokens", "4", "--quiet",
                                   "--out", str(tmp_path / "cli")])
    assert run.exit_code == 0, run.output
    assert json.loads((tmp_path / "cli" / "sweep.json").read_text())["config"]["engine"] == "generate-plugin"


def test_the_plugin_s_dialect_speaks_to_a_real_vllm_server_as_the_built_in_one_does(vllm_server):
    """A model spec naming the plugin's dialect (`dialect=vllm-plugin`, a copy of vLLM's under its own name) runs
    against the real vLLM server on 127.0.0.1: recorded as the plugin's, on both teacher-forcing routes, with the
    rows the built-in vllm dialect gets from the same server (detection by owner reads the same registry)."""
    from served import NAME

    cfg = dict(task="kv-lookup", task_options={"facts": 4}, positions="0,3", n=2)
    for route in ("generate", "prompt_logprobs"):
        rows = {}
        for dialect in ("vllm-plugin", "vllm"):
            spec = (f"openai:model={NAME},base_url={vllm_server['url']},tokenizer={vllm_server['dir']},"
                    f"teacher_forcing={route},dialect={dialect}")
            served = run_sweep(SweepConfig(model=spec, **cfg), progress=False)
            assert served.record["model"]["dialect"] == dialect and served.record["model"]["prompts"] == "tokens"
            rows[dialect] = [(r["example_id"], r["position"], r["correct"], r["prediction"]) for r in served.rows]
        assert rows["vllm-plugin"] == rows["vllm"], route


def test_the_plugin_s_model_name_runs_smollm2(smollm2):
    """`model=smollm2-plugin` (the plugin's model name) loads SmolLM2's files: the rows of the built-in name."""
    cfg = dict(task="kv-tiny", positions="0,3", n=2)
    named = run_sweep(SweepConfig(model="smollm2-plugin", **cfg), progress=False)
    builtin = run_sweep(SweepConfig(**cfg), loaded=smollm2, progress=False)
    assert named.record["model"]["name"] == "smollm2-plugin"
    assert named.record["model"]["source"] == builtin.record["model"]["source"]
    assert [(r["correct"], r["prediction"]) for r in named.rows] == [(r["correct"], r["prediction"]) for r in builtin.rows]


@pytest.mark.parametrize("kind", list(REGISTRIES))
def test_every_registry_refuses_a_taken_name(kind):
    if kind == "task":
        with pytest.raises(PosbiasError, match="a task named 'kv-lookup' is already registered \\(from posbias\\)"):
            register_task("kv-lookup", lambda arg, data_dir, **o: None, "again")
    elif kind == "method":
        class Again(METHODS["pi"]):
            name = "pi"

        with pytest.raises(PosbiasError, match="a method named 'pi' is already registered \\(from posbias\\); module "):
            register_method(Again)
    elif kind == "backend":
        class Twin(BACKENDS["hf"]):
            name = "hf-plugin"

        with pytest.raises(PosbiasError, match=re.escape(f"a backend named 'hf-plugin' is already registered (from {ORIGIN})")):
            register_backend(Twin)
    elif kind == "model":
        with pytest.raises(PosbiasError, match="a model named 'smollm2-135m' is already registered \\(from posbias\\)"):
            register_model("smollm2-135m", lambda: ("elsewhere", None), "again")
    elif kind == "engine":
        class Again(Generate):
            name = "generate-plugin"

        taken = f"an engine named 'generate-plugin' is already registered (from {ORIGIN})"
        with pytest.raises(PosbiasError, match=re.escape(taken)):
            register_engine(Again)
        register_engine(ENGINES["generate-plugin"].__class__)  # the same class again: a no-op
    else:
        taken = f"a dialect named 'vllm' is already registered (from posbias); module {__name__} registers another"
        with pytest.raises(PosbiasError, match=re.escape(taken)):
            register_dialect(replace(DIALECTS["vllm"], owner="elsewhere"))
        assert DIALECTS["vllm"].owner == "vllm"
    assert METHODS["pi"].__module__.startswith("posbias.") and TASKS["kv-lookup"].description != "again"
    assert MODELS["smollm2-135m"].description != "again" and type(ENGINES["generate-plugin"]).__module__.startswith(
        "posbias_example_plugin")


def test_a_registration_of_your_own_is_tagged_with_its_module_and_removable():
    class Mine(Method):
        name = "mine-for-a-test"

        def config(self):
            return {"name": self.name}

        def apply(self, loaded):
            raise AssertionError("not run")

    register_method(Mine)
    try:
        assert METHODS.origins["mine-for-a-test"] == f"module {__name__}"
        register_method(Mine)  # the same class again: a no-op
    finally:
        METHODS.remove("mine-for-a-test")
    assert "mine-for-a-test" not in METHODS and "mine-for-a-test" not in METHODS.origins


def _python(code: str, *paths: Path, **env) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with `paths` and the posbias under test (its folder: a checkout's src/) importable."""
    here = Path(posbias.__file__).parents[1]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (*paths, here))), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)


def test_a_plugin_that_takes_a_name_is_named_in_one_warning_and_left_out():
    broken = install_plugin(Path(__file__).parent / "plugin_broken")
    example = install_plugin(Path(__file__).parent / "plugin")
    code = ("import posbias, posbias.plugins as p; print(posbias.METHODS['pi'].__module__, sorted(p.LOADED), "
            "sorted(p.FAILED), 'reverse' in posbias.METHODS)")
    run = _python(code, broken, example)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["posbias.methods.scaling", "['example']", "['broken']", "True"], run.stdout
    warning = [x for x in run.stderr.splitlines() if "posbias plugin 'broken'" in x]
    assert len(warning) == 1 and "a method named 'pi' is already registered (from posbias)" in warning[0] \
        and "POSBIAS_DISABLE_PLUGINS=1" in warning[0], run.stderr
    off = _python(code, broken, example, POSBIAS_DISABLE_PLUGINS="1")
    assert off.stdout.split() == ["posbias.methods.scaling", "[]", "[]", "False"] and "plugin" not in off.stderr


def test_in_process_pipelines_open_a_model_by_the_backend_s_capabilities(model_dir):
    """open_model (every pipeline that changes or reads the weights) asks the backend's declared capabilities, not its
    name: the plugin's in-process backend opens, a served one is refused naming the pipeline."""
    from posbias import Loaded
    from posbias.backends import open_model

    assert isinstance(open_model(f"hf-plugin:{model_dir}", "fp32", needs="the LPES search", progress=False), Loaded)
    with pytest.raises(PosbiasError, match="the LPES search changes or reads the model's weights in process, and "
                                           "backend 'openai' serves the model as it is"):
        open_model(f"openai:model=m,tokenizer={model_dir}", needs="the LPES search")


def test_an_engine_of_its_own_name_is_checked_as_the_protocol_it_is(tmp_path):
    """Configs, tasks and methods check an engine's kind, not its name: a teacher-forcing engine registered under its
    own name is refused with max_new_tokens, on a needle without an answer prefix and by nothing that takes teacher
    forcing (PriDe); an engine of no kind is refused at registration."""
    from posbias.measure import ENGINES, register_engine
    from posbias.scoring.engines import Engine, TeacherForced

    class Mine(TeacherForced):
        name = "tf-mine"

    register_engine(Mine)
    try:
        with pytest.raises(PosbiasError, match="`max_new_tokens` limits generation"):
            SweepConfig(engine="tf-mine", max_new_tokens=4).validate()
        with pytest.raises(PosbiasError, match="the needle has no answer prefix"):
            opts = {"needle": str(DATA / "sf-needle.jsonl"), "haystack": str(DATA / "essays")}  # no data set needed
            run_sweep(SweepConfig(task="niah", task_options=opts, engine="tf-mine", n=1), tmp_path / "niah", progress=False)
        from posbias.methods import get_method
        from posbias.tasks import get_task

        task = get_task("mc-kv")
        get_method("pride").check_task(task, task.placements(None), ENGINES["tf-mine"].kind)  # accepted: it forces
    finally:
        ENGINES.remove("tf-mine")
    kindless = type("Kindless", (Engine,), {"name": "kindless", **{m: lambda *a, **k: None for m in (
        "need", "requests", "verdict", "_predict", "branch")}})
    with pytest.raises(PosbiasError, match="engine 'kindless' declares no kind among teacher-forced, generate"):
        register_engine(kindless)
