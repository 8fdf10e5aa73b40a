"""A task option is declared once, on the task's builder (its parameter: type, default; its docstring entry: the doc),
and the CLI's task options, `task_fields`, `posbias tasks` and docs/cli.md's task table are generated from the
registry: adding an option is a change to the builder alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from posbias import TASKS, PosbiasError, SweepConfig, get_task, register_task
from posbias.cli.options import TASK, Group, Opt, task_fields, task_table, uses
from posbias.tasks.kv_lookup import KVLookup
from posbias.tasks.registry import TaskOption

DOCS = Path(__file__).resolve().parents[1] / "docs"

# a new task whose builder has a new documented option, registered before posbias.cli builds its option groups
NEW_TASK = '''
import sys
import posbias

def tasty(flavour: str = "plain", facts: int = 3):
    """A task that says what it was built with.

    flavour: how the answer tastes, plain or spicy
    facts: how many facts it would hold
    """
    raise posbias.PosbiasError(f"tasty was built with flavour={flavour} and facts={facts!r}", "nothing to fix: a test")

posbias.register_task("tasty", tasty, "a task of a test")
from posbias.cli import main
sys.argv = ["posbias", *sys.argv[1:]]
main()
'''


def _posbias(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"COLUMNS": "250", "POSBIAS_DISABLE_PLUGINS": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run([sys.executable, "-c", NEW_TASK, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def _flat(text: str) -> str:
    """Help text without rich's box and line wrapping."""
    return re.sub(r"\s+", " ", text.replace("│", " "))


def test_a_new_builder_option_reaches_the_help_the_listing_and_the_builder(tmp_path):
    shown = _flat(_posbias("sweep", "--help", cwd=tmp_path).stdout)
    assert "--flavour" in shown and "tasty: how the answer tastes, plain or spicy (default plain)" in shown
    assert "tasty: how many facts it would hold (default 3)" in shown  # joined to the other tasks' --facts
    listed = _posbias("tasks", cwd=tmp_path).stdout
    assert "flavour (str, default plain): how the answer tastes, plain or spicy" in listed
    for argv in (["--task", "tasty", "--flavour", "spicy", "--facts", "5"], ["--task", "tasty:flavour=spicy,facts=5"]):
        run = _posbias("sweep", *argv, "--out", str(tmp_path / "out"), cwd=tmp_path)
        assert run.returncode == 2, run.stderr
        assert run.stderr.strip().splitlines()[-1] == ("posbias: error: tasty was built with flavour=spicy and "
                                                       "facts=5 -- nothing to fix: a test"), run.stderr
    assert not (tmp_path / "out").exists()


def test_an_undocumented_or_defaultless_option_is_refused_at_registration():
    def bare(facts: int = 3, colour: str = "red"):
        """A builder that documents one of its two options.

        facts: how many facts
        """

    with pytest.raises(PosbiasError, match=r"task no-doc's option `colour` has no doc -- add a line `colour: what it "
                                           r"sets` to the docstring of .*bare"):
        register_task("no-doc", bare, "undocumented")

    def strict(facts: int):
        """facts: how many facts"""

    with pytest.raises(PosbiasError, match="task no-default's option `facts` has no default"):
        register_task("no-default", strict, "no default")
    with pytest.raises(PosbiasError, match="its builder .*strict has no parameter `path`"):
        register_task("no-path", strict, "no path", arg="PATH")
    assert not {"no-doc", "no-default", "no-path"} & set(TASKS)


def test_a_class_builder_takes_its_bases_docs_and_a_see_entry_another_builder_s():
    class Short(KVLookup):
        """A shorter kv-lookup (its options documented by KVLookup)."""

        def __init__(self, facts: int = 3, digits: int = 4):
            super().__init__(facts, digits)

    register_task("kv-short-for-a-test", Short, "short")
    try:
        assert TASKS["kv-short-for-a-test"].options["facts"] == TaskOption(int, 3, TASKS["kv-lookup"].options["facts"].doc)
        assert get_task("kv-short-for-a-test:facts=5").facts == 5
    finally:
        TASKS.remove("kv-short-for-a-test")
    # mc_kv: "see `judge_kv`", whose entry is "see `judge_nq`"
    assert TASKS["mc-kv"].options["labels"].doc == TASKS["judge-nq"].options["labels"].doc
    assert (TASKS["judge-nq"].options["options"].default, TASKS["mc-kv"].options["options"].default) == (2, 4)


def _args(**given) -> SimpleNamespace:
    return SimpleNamespace(**{**{k: None for k in TASK.opts}, "task": "kv-lookup", **given})


def test_task_fields_takes_the_registry_s_options_and_converts_to_the_task_s_type():
    assert task_fields(_args(task="kv-uuid", pairs="75"))["task_options"] == {"pairs": 75}
    for placements in ("positions", "position"):  # --pairs is kv-uuid's count: placements are --positions (show's --position)
        with pytest.raises(PosbiasError, match=f"task kv-2hop takes none; .* are `{placements}`") as e:
            task_fields(_args(task="kv-2hop", pairs="0:1"), placements)
        assert e.value.fix == f"use `{placements}=0:1` and drop `pairs`"
    assert task_fields(_args(facts=20))["task_options"] == {"facts": 20}
    assert task_fields(_args(task="judge-kv", template="my.json"))["task_options"] == {"template": "my.json"}
    with pytest.raises(PosbiasError, match="'pairs' in task kv-uuid takes a whole number, got 'abc'"):
        task_fields(_args(task="kv-uuid", pairs="abc"))
    assert set(TASK.opts) == {"task", "data_dir"} | {o for e in TASKS.values() for o in e.options}
    assert TASK.opts["template"].flags == ("--judge-template",)


def test_a_task_option_named_like_another_option_of_a_command_is_refused():
    other = Group("other", "Other", facts=Opt(None, "a second --facts", int))

    def command(task, other):
        return None

    with pytest.raises(PosbiasError, match="posbias command: options facts are declared twice -- rename the task option"):
        uses(SweepConfig, TASK, other)(command)


def test_docs_cli_md_task_table_is_the_registry_s():
    """Regenerate the table: python -c "from posbias.cli.options import task_table; print(task_table())"."""
    text = (DOCS / "cli.md").read_text()
    start, end = "<!-- task options: generated -->", "<!-- end of task options -->"
    assert start in text and end in text
    table = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert table == task_table(), ("docs/cli.md's task options differ from the registry's; regenerate them with "
                                   "python -c \"from posbias.cli.options import task_table; print(task_table())\"")
