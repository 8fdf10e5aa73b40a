"""Plugins (posbias/plugins.py) and the one registration shape (posbias/registry.py).

The example plugin (tests/plugin) is a real package that conftest installs with pip before posbias is imported; it
adds a task, a method of each kind (rearranger, model change, reading, decision rule) and a backend, each one file
registered in one line, and they join the conformance matrix and the method suite without a test of their own. Here:
they are listed with where they came from, they run, a plugin that takes a name is left out with one warning, and
every registry refuses a second entry under a taken name.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import install_plugin
from posbias import (BACKENDS, METHODS, PLUGINS, TASKS, Method, PosbiasError, SweepConfig, register_method,
                     register_task, run_compare, run_sweep)
from posbias.cli import app
from posbias.measure import register_backend

pytestmark = pytest.mark.usefixtures("one_thread")

ORIGIN = "plugin example (posbias-example-plugin 0.1.0)"
ADDED = {"task": ["kv-tiny"], "method": ["reverse", "temper", "twice", "first-order"], "backend": ["hf-plugin"]}


def test_the_plugin_s_entries_are_registered_and_listed_with_their_origin():
    assert PLUGINS == {"example": ORIGIN}
    registry = {"task": TASKS, "method": METHODS, "backend": BACKENDS}
    for kind, names in ADDED.items():
        listing = CliRunner().invoke(app, [f"{kind}s"]).output
        for name in names:
            assert registry[kind].origins[name] == ORIGIN, (kind, name)
            line = next(x for x in listing.splitlines() if x.startswith(name + " ") or x.startswith(name + ":"))
            assert f"[{ORIGIN}]" in line, line
    assert registry["method"].origins["pi"] == "posbias" and "[" not in CliRunner().invoke(app, ["methods"]).output.split("\n")[0]


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


@pytest.mark.parametrize("kind", ["task", "method", "backend"])
def test_every_registry_refuses_a_taken_name(kind):
    if kind == "task":
        with pytest.raises(PosbiasError, match="a task named 'kv-lookup' is already registered \\(from posbias\\)"):
            register_task("kv-lookup", lambda arg, data_dir, **o: None, "again")
    elif kind == "method":
        class Again(METHODS["pi"]):
            name = "pi"

        with pytest.raises(PosbiasError, match="a method named 'pi' is already registered \\(from posbias\\); module "):
            register_method(Again)
    else:
        class Twin(BACKENDS["hf"]):
            name = "hf-plugin"

        with pytest.raises(PosbiasError, match=re.escape(f"a backend named 'hf-plugin' is already registered (from {ORIGIN})")):
            register_backend(Twin)
    assert METHODS["pi"].__module__.startswith("posbias.") and TASKS["kv-lookup"].description != "again"


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
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), **env}
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
