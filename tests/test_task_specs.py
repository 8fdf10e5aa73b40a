"""Task specs with key=value options (`kv-lookup:facts=30`, `jsonl:PATH,answers=first`): every registered task is
built the same from its options as arguments and as a spec, and a config records either the same way."""

from __future__ import annotations

import json
import sys

import pytest

from posbias import TASKS, PosbiasError, SweepConfig, get_task
from posbias.tasks import split_task


def _options(tmp_path) -> dict[str, tuple[str, dict]]:
    """Per registered task: (its name, or name:PATH; options other than the defaults)."""
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "q", "answers": ["a", "b"], "documents": ["x", "y", "z"], "gold": 1}) + "\n")
    judge = tmp_path / "judge.jsonl"
    judge.write_text(json.dumps({"question": "q", "answers": ["a", "b"]}) + "\n")
    mc = tmp_path / "mc.jsonl"
    mc.write_text(json.dumps({"question": "q", "options": ["a", "b", "c"], "gold": 2}) + "\n")
    hops = tmp_path / "hops.jsonl"
    hops.write_text(json.dumps({"question": "q", "answers": ["a"], "documents": ["x", "y", "z"], "gold": [0, 2]}) + "\n")
    order = {"options": 3, "labels": "digits", "bind": "candidate"}
    plain, kv_tpl = tmp_path / "judge.txt", tmp_path / "judge-kv.txt"  # judge templates (tasks/judge_template.py)
    plain.write_text("{question} {answer_a} {answer_b}")
    kv_tpl.write_text("{context} {question} {answer_a} {answer_b}")
    hay = tmp_path / "hay.txt"
    hay.write_text("The river bends west. A mill stood there. Grain came by boat.\nWinters were long.\n")
    return {"niah": ("niah", {"tokens": 512, "needle": "nq-sentence", "haystack": str(hay), "overlap": "none",
                              "context": "needle", "answer_prefix": "The answer is"}),
            "niah+keys": ("niah", {"keys": 3}), "niah+values": ("niah", {"values": 2}),
            "niah+queries": ("niah", {"queries": 2}),
            "kv-lookup": ("kv-lookup", {"facts": 7, "digits": 4}), "kv-uuid": ("kv-uuid", {"pairs": 12, "source": "generate"}),
            "nq": ("nq", {"docs": 20, "answers": "first", "question": "both", "numbered": "no"}),
            "jsonl": (f"jsonl:{qa}", {"answers": "first", "question": "both"}),
            "jsonl+hops": (f"jsonl:{hops}", {"prompt": "coc"}),
            "musique": ("musique", {"docs": 10, "prompt": "coc"}),
            "kv-2hop": ("kv-2hop", {"facts": 6, "digits": 3, "style": "cot"}),
            "judge-nq": ("judge-nq", {**order, "reference": "no", "ask": "preference"}), "mc-nq": ("mc-nq", {**order, "reference": "no"}),
            "judge-kv": ("judge-kv", {**order, "facts": 4, "digits": 5, "ask": "preference"}), "mc-kv": ("mc-kv", {**order, "facts": 4, "digits": 4}),
            "judge": (f"judge:{judge}", {"labels": "digits", "ask": "correct", "ties": "drop", "bind": "candidate"}),
            "mc": (f"mc:{mc}", {"labels": "digits", "bind": "candidate"}),
            "judge-nq+template": ("judge-nq", {"reference": "no", "template": str(plain)}),
            "judge-kv+template": ("judge-kv", {"template": str(kv_tpl)}),
            "judge+template": (f"judge:{judge}", {"template": str(plain)})}


# a further example of a registered task (a two-hop file takes `prompt`; a judge template excludes `ask`)
EXTRA = ("jsonl+hops", "niah+keys", "niah+values", "niah+queries", "judge-nq+template", "judge-kv+template", "judge+template")


OWN = sorted(n for n in TASKS if TASKS.origins[n] == "posbias")  # a plugin's tasks: the conformance matrix runs them


def test_every_registered_task_has_an_example_with_every_option(tmp_path):
    examples = _options(tmp_path)
    assert set(examples) == set(OWN) | set(EXTRA)
    for name in OWN:
        given = {k for n, (_, options) in examples.items() if n.partition("+")[0] == name for k in options}
        assert given == set(TASKS[name].options), name


@pytest.mark.parametrize("example", sorted({*OWN, *EXTRA}))
def test_every_task_builds_the_same_from_a_key_value_spec(example, tmp_path):
    task, options = _options(tmp_path)[example]
    name = example.partition("+")[0]
    plain = get_task(task, **options)
    pairs = ",".join(f"{k}={v}" for k, v in options.items())
    spec = f"{task},{pairs}" if TASKS[name].arg else f"{task}:{pairs}"
    assert get_task(spec).config() == plain.config(), spec
    assert split_task(spec) == (task, options)
    if TASKS[name].arg:  # the PATH also as path=
        assert get_task(f"{name}:path={task.partition(':')[2]},{pairs}").config() == plain.config()
    first = dict([next(iter(options.items()))])  # an option both ways, with the same value: accepted
    assert get_task(spec, **first).config() == plain.config()


def test_a_config_records_the_spec_s_options_as_task_options():
    one = SweepConfig(task="kv-lookup:digits=4,facts=30").validate().to_dict()
    other = SweepConfig(task="kv-lookup", task_options={"facts": 30, "digits": 4}).validate().to_dict()
    assert one == other and list(one["task_options"]) == ["facts", "digits"]  # the task's order, as the CLI gives them
    assert one["task"] == "kv-lookup"
    both = SweepConfig(task="kv-lookup:digits=4", task_options={"facts": 30}).validate().to_dict()
    assert json.dumps(both) == json.dumps(other)
    jl = SweepConfig(task="jsonl:my.jsonl,answers=first").validate()
    assert (jl.task, jl.task_options) == ("jsonl:my.jsonl", {"answers": "first"})
    short = SweepConfig(task="jsonl:runs/a=b.jsonl", task_options={"answers": "all"}).validate()  # no pairs: as it was
    assert (short.task, short.task_options) == ("jsonl:runs/a=b.jsonl", {"answers": "all"})


def _cli_config(monkeypatch, argv: list[str]) -> dict:
    """The recorded config `posbias sweep ARGV` would run (the sweep itself stubbed out)."""
    from posbias.cli import main, measure

    seen = []

    def fake(cfg, out, **kw):
        seen.append(cfg.validate().to_dict())
        raise SystemExit(0)

    monkeypatch.setattr(measure, "run_sweep", fake)
    monkeypatch.setattr(sys, "argv", ["posbias", "sweep", "--quiet", *argv])
    with pytest.raises(SystemExit):
        main()
    return seen[0]


def test_the_cli_records_the_same_run_whichever_way_the_options_come(monkeypatch, capsys):
    flags = _cli_config(monkeypatch, ["--task", "judge-kv", "--facts", "4", "--options", "3", "--labels", "digits"])
    spec = _cli_config(monkeypatch, ["--task", "judge-kv:labels=digits,options=3,facts=4"])
    mixed = _cli_config(monkeypatch, ["--task", "judge-kv:labels=digits", "--options", "3", "--facts", "4"])
    assert json.dumps(flags) == json.dumps(spec) == json.dumps(mixed)
    assert flags["task"] == "judge-kv" and flags["task_options"] == {"facts": 4, "options": 3, "labels": "digits"}
    uuid = _cli_config(monkeypatch, ["--task", "kv-uuid:pairs=12"])
    assert uuid["task_options"] == _cli_config(monkeypatch, ["--task", "kv-uuid", "--pairs", "12"])["task_options"]


@pytest.mark.parametrize("spec, options, message", [
    ("kv-lookup:facts=30", {"facts": 20}, "task option facts is 30 in the task spec 'kv-lookup:facts=30' and `facts=20` "
                                          "-- give it once: drop `facts`"),
    ("kv-lookup:facts=ten", {}, "'facts' in task spec 'kv-lookup:facts=ten' takes a whole number, got 'ten' -- write facts=2"),
    ("kv-lookup:colour=red", {}, "task spec 'kv-lookup:colour=red' has no key 'colour' -- use its keys: facts, digits"),
    ("jsonl:answers=first", {}, "task spec 'jsonl:answers=first' needs 'path' -- add path=VALUE"),
    ("kv-lookup:7,facts=3", {}, "'7' in task spec 'kv-lookup:7,facts=3' is not key=value -- write it as kv-lookup:facts="),
    ("nq:docs=10,docs=20", {}, "'docs' is given twice in task spec 'nq:docs=10,docs=20'"),
    ("jsonl:a.jsonl,path=b.jsonl", {}, "task spec 'jsonl:a.jsonl,path=b.jsonl' names its PATH twice"),
    ("kv-2hop:pairs=0:1", {}, "has no key 'pairs' -- use its keys: facts, digits, style"),  # placements, not an option
    ("kv-lookup:facts", {}, "unknown task 'kv-lookup:facts'"),  # no pair: the short form, which kv-lookup has not
])
def test_a_bad_task_spec_is_refused_in_one_line(spec, options, message):
    with pytest.raises(PosbiasError) as e:
        get_task(spec, **options)
    assert message in str(e.value) and e.value.fix and "\n" not in str(e.value), str(e.value)
