"""No default is declared twice: every CLI option that sets a library config field has that field's default (the
option groups read them from the config: `default` in src/posbias/cli/options.py). An option whose default is None takes
the config's (or its preset's) value, so it declares nothing."""

import dataclasses

import pytest
import typer.main

import posbias
from posbias.cli import app

COMMANDS = {"sweep": posbias.SweepConfig, "compare": posbias.SweepConfig, "show": posbias.SweepConfig, "grid": posbias.GridConfig,
            "analyze attention": posbias.explain.AttentionConfig, "analyze shifting": posbias.explain.ShiftingConfig,
            "analyze prior": posbias.explain.PriorConfig, "lpes search": posbias.lpes.SearchConfig,
            "distill r1": posbias.distill.DistillConfig, "distill r2": posbias.distill.DistillConfig,
            "moice train": posbias.moice.TrainConfig, "theory": posbias.explain.TheoryConfig}
# a command's own default on purpose: Pos2Distill-R2 trains on two hops, where DistillConfig (R1 by default) has one
OWN = {("distill r2", "task"): "kv-2hop"}


def commands(group=None, path=()):
    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, path + (name,))
        else:
            yield " ".join(path + (name,)), cmd


def as_config_value(value, field_default):
    """A CLI string for a tuple field ("0.2,0.3,0.5") as the tuple it parses to."""
    if isinstance(field_default, tuple) and isinstance(value, str):
        return tuple(type(field_default[0])(x) for x in value.split(","))
    return value


def test_every_config_command_is_checked():
    assert set(COMMANDS) <= {name for name, _ in commands()}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_cli_defaults_are_the_config_fields_defaults(name):
    cmd = dict(commands())[name]
    fields = {f.name: f.default for f in dataclasses.fields(COMMANDS[name]) if f.default is not dataclasses.MISSING}
    shared = [p for p in cmd.params if p.name in fields and p.default is not None]
    assert shared, f"{name} shares no option with its config"
    for p in shared:
        want = OWN.get((name, p.name), fields[p.name])
        assert as_config_value(p.default, fields[p.name]) == want, f"{name} --{p.name}: {p.default!r} != {want!r}"



def test_method_task_and_engine_help_come_from_the_registries():
    """Every registered method, task and engine is named in the help of `posbias sweep` (none written by hand)."""
    help_of = {p.name: p.help for p in dict(commands())["sweep"].params}
    assert all((cls.usage or name) in help_of["method"] for name, cls in posbias.METHODS.items())
    assert all(name in help_of["task"] for name in posbias.TASKS)
    assert all(name in help_of["engine"] for name in posbias.measure.ENGINES)
