"""Option groups declared once and shared by the commands, plus the small parsers the commands need.

A command names the config it sets and the groups it uses, as parameters annotated with `Group` instances:

    @app.command()
    @uses(SweepConfig, TASK, RUN.defaults(out=Path("runs/sweep")))
    def sweep(task: Args, run: Args, positions: Optional[str] = field_option(SweepConfig, "positions")): ...

`uses` puts every option of those groups into the command's signature (typer reads it), and
calls the command with one `Args` namespace per group. Help pages list each group under its
own heading.

Help is written once. An option that sets a config field takes its help from the field's doc (`field_docs`:
the `name: text` entries of the config's docstring) and its default from the field: a group's `Opt()` reads
the command's config, `field_option` names the config and field for an option of one command. The task options
come from the task registry (`task_options`: each task's builder declares its options, their types, defaults
and docs). Only the options with no config field (CLI_HELP, a command's own) write their help here or beside
their command. tests/test_cli_help.py checks all three.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import typer

from .. import METHODS, TASKS, PosbiasError
from ..measure import ENGINES, dtype_note, field_docs, parse_spec

Args = SimpleNamespace  # what a command receives for each group
FIELD: Any = "<the config field's>"  # an Opt's default or a field_option's: the config field's own (compared by `is`)


@dataclass(frozen=True)
class Opt:
    """One option of a group. Left at FIELD and None, `default` and `help` are those of the command's config field
    named like the option (`field_default`, `field_help`); an option with no config field gives both."""

    default: Any = FIELD
    help: Optional[str] = None
    type: Any = str
    flags: tuple[str, ...] = ()  # explicit declarations, e.g. ("--resume",); default: --name-with-dashes
    values: Optional[Callable[[], str]] = None  # the registry's values, appended to the field's doc
    panel: Optional[str] = None  # a help heading of its own (default: the group's)
    only: Optional[Callable[[type], bool]] = None  # the option exists only on commands whose config passes this test


class Group:
    """A named set of options; `defaults(...)` gives a copy with other defaults for one command, `of(config)` the
    copy whose field options read that config."""

    def __init__(self, name: str, panel: str, **opts: Opt):
        self.name, self.panel, self.opts = name, panel, opts
        self.config: Optional[type] = None

    def defaults(self, **values: Any) -> "Group":
        """A copy with other defaults (a default of None makes the option optional)."""
        unknown = set(values) - set(self.opts)
        assert not unknown, f"{self.name} has no options {unknown}"
        opts = {}
        for k, o in self.opts.items():
            if k in values:
                o = replace(o, default=values[k], type=Optional[o.type] if values[k] is None else o.type)
            opts[k] = o
        return Group(self.name, self.panel, **opts).of(self.config)

    def of(self, config: Optional[type]) -> "Group":
        g = Group(self.name, self.panel, **self.opts)
        g.config = config
        return g

    def active(self) -> dict[str, Opt]:
        """The options this group's command has (an `only` option where its config passes the test)."""
        return {k: o for k, o in self.opts.items() if o.only is None or (self.config is not None and o.only(self.config))}

    def parameters(self) -> list[inspect.Parameter]:
        out = []
        for k, o in self.active().items():
            default = field_default(self.config, k) if o.default is FIELD else o.default
            help = o.help if o.help is not None else field_help(self.config, k, o.values)
            panel = o.panel or self.panel
            out.append(inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=o.type,
                                         default=typer.Option(default, *o.flags, help=help, rich_help_panel=panel)))
        return out


def uses(config: type, *groups: Group) -> Callable:
    """Decorator: the command sets a `config` from the groups' options (their field options read it); its parameter
    named like a group receives an Args."""
    groups = tuple(g.of(config) for g in groups)

    def deco(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn)
        names = {g.name for g in groups}
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()
               if p.name not in names]
        params = own + [p for g in groups for p in g.parameters()]
        declared = [p.name for p in params]
        twice = sorted({n for n in declared if declared.count(n) > 1})
        if twice:  # a task option (generated from the registry) named like another option of the command
            raise PosbiasError(f"posbias {fn.__name__.replace('_', ' ')}: options {', '.join(twice)} are declared twice",
                               "rename the task option (a parameter of the task's builder)")

        @functools.wraps(fn)
        def command(**kw: Any) -> Any:
            for g in groups:
                kw[g.name] = Args(**{k: kw.pop(k) for k in g.active()})
            return fn(**kw)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return deco


# ----------------------------------------------------------------------------- help and defaults from the configs


def _field(config: Optional[type], name: str) -> tuple[type, dataclasses.Field]:
    """The config class and field a (dotted: "ga.mx", a nested config's field) name denotes."""
    head, _, rest = name.partition(".")
    fields = {f.name: f for f in dataclasses.fields(config)} if config is not None else {}
    if head not in fields:
        raise PosbiasError(f"{getattr(config, '__name__', 'no config')} has no field {head!r} for an option",
                           "name a field of the command's config, or give the option a default and help of its own")
    f = fields[head]
    if not rest:
        return config, f
    inner = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return _field(type(inner), rest)


def field_default(config: Optional[type], name: str) -> Any:
    """A config field's default: the CLI declares no default of its own (tests/test_cli_defaults.py)."""
    _, f = _field(config, name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def field_help(config: Optional[type], name: str, values: Optional[Callable[[], str]] = None) -> str:
    """A config field's doc, the help of the option that sets it (tests/test_cli_help.py); `values`: the registry's
    values, appended."""
    owner, f = _field(config, name)
    doc = field_docs(owner).get(f.name)
    if doc is None:
        raise PosbiasError(f"{owner.__name__}.{f.name} has no doc", f"add `{f.name}: ...` to {owner.__name__}'s docstring")
    return f"{doc} {values()}" if values else doc


def field_option(config: type, name: str, *flags: str, default: Any = FIELD,
                 values: Optional[Callable[[], str]] = None, **kw: Any) -> Any:
    """A typer option that sets the field `name` of `config` (dotted: a nested config's field): the field's doc is
    its help, the field's default its default unless `default` is given (None: the preset's or the task's)."""
    value = field_default(config, name) if default is FIELD else default
    return typer.Option(value, *flags, help=field_help(config, name, values), **kw)


def method_values() -> str:
    """--method's values, from the method registry (each method's spec forms, short and key=value)."""
    return "Specs: " + " | ".join(cls.spec_forms() for cls in METHODS.values()) + " (docs/cli.md, docs/mitigations.md)."


def task_values() -> str:
    """--task's values, from the task registry."""
    return ("Registered: " + " | ".join(f"{name}:{e.arg}" if e.arg else name for name, e in TASKS.items())
            + "; the task options may go in the spec too: kv-lookup:facts=20, jsonl:PATH,answers=first (posbias tasks).")


def engine_values() -> str:
    """--engine's values, from the engine registry."""
    return "One of: " + " | ".join(ENGINES) + "."


# ----------------------------------------------------------------------------- the groups

# the help of the options that set no config field and that several commands share
CLI_HELP = {
    "out": "output directory",
    "resume": "continue a stopped run in OUT (same options)",
    "overwrite": "discard what OUT holds and start again",
    "quiet": "no progress bars",
}


def cli_option(name: str, default: Any, *flags: str, more: str = "", **kw: Any) -> Any:
    """A typer option of CLI_HELP (`more`: what this command adds to its help)."""
    return typer.Option(default, *flags, help=CLI_HELP[name] + more, **kw)


MODEL = Group(
    "model", "Model",
    model=Opt(), dtype=Opt(), device=Opt(), chat=Opt(), device_map=Opt(type=Optional[str]),
)

# The task options are generated from the task registry (`task_options`); the CLI adds only its own facts: the flag
# of an option whose flag is not --NAME, and the option kept text where the tasks declare an int: --pairs, which once
# also named a two-hop task's placements, so that use reaches `task_fields`' refusal naming --positions.
TASK_FLAGS = {"template": ("--judge-template",)}  # named so since it was added: a template of the judge's prompt
TEXT_OPTIONS = ("pairs",)


def task_options(tasks: dict) -> dict[str, Opt]:
    """One option per task option name across `tasks` (name -> TaskEntry), in the registry's order: its help
    "TASK, TASK: doc (default D)" joined over the tasks that take it (the tasks with the same doc together, each
    with its own default where theirs differ), its type int where every task declares an int, else str (a value is
    converted to the chosen task's type: `task_fields`), unset by default (the task's default); TEXT_OPTIONS text."""
    takers: dict[str, dict[str, list]] = {}  # option -> doc -> [(task, default, type)]
    for task, entry in tasks.items():
        for o, opt in entry.options.items():
            takers.setdefault(o, {}).setdefault(opt.doc, []).append((entry.usage(task), opt.default, opt.type))
    out = {}
    for o, docs in takers.items():
        text = "; ".join(_doc_of(doc, ts) for doc, ts in docs.items())
        int_only = all(t in (int, Optional[int]) for ts in docs.values() for _, _, t in ts) and o not in TEXT_OPTIONS
        out[o] = Opt(None, text, Optional[int if int_only else str], TASK_FLAGS.get(o, ()))
    return out


def _doc_of(doc: str, tasks: list[tuple[str, Any, Any]]) -> str:
    """"TASK, TASK: doc (default D)", or "TASK (default D), TASK (default E): doc" where the defaults differ."""
    defaults = {repr(d) for _, d, _ in tasks}
    if len(defaults) == 1:
        d = tasks[0][1]
        return f"{', '.join(t for t, _, _ in tasks)}: {doc}" + (f" (default {d})" if d is not None else "")
    return ", ".join(t + (f" (default {d})" if d is not None else "") for t, d, _ in tasks) + f": {doc}"


def task_flag(name: str) -> str:
    """The CLI flag of a task option: --NAME-WITH-DASHES, or its TASK_FLAGS entry."""
    return TASK_FLAGS.get(name, ("--" + name.replace("_", "-"),))[0]


def task_table() -> str:
    """docs/cli.md's table of the task options, generated from posbias's own tasks (plugins' left out): one row per
    option, its flag and help. tests/test_task_options.py compares it with the doc; print it to regenerate that."""
    own = {n: e for n, e in TASKS.items() if TASKS.origins.get(n) == "posbias"}
    rows = [f"| `{task_flag(k)}` | " + o.help.replace("|", "\\|") + " |" for k, o in task_options(own).items()]
    return "\n".join(["| option | tasks: meaning |", "|---|---|", *rows])


TASK = Group(
    "task", "Task",
    task=Opt(values=task_values),
    **task_options(TASKS),
    data_dir=Opt(type=Optional[Path]),
)
TASK_OPTIONS = tuple(k for k in TASK.opts if k not in ("task", "data_dir"))  # the registry's, plugins' included

SPLIT = Group("split", "Examples", n=Opt(type=int), seed=Opt(type=int), skip=Opt(type=int))

def costed(config: type) -> bool:
    """Whether a command's config takes prices and a budget (the `Cost` fields: sweep, compare)."""
    return "price_in" in {f.name for f in dataclasses.fields(config)}


COST = "Cost and budget (served models; docs/backends.md)"

SCORING = Group(
    "scoring", "Scoring",
    engine=Opt(type=Optional[str], values=engine_values),
    max_new_tokens=Opt(type=Optional[int]),
    batch_tokens=Opt(type=int),
    max_batch=Opt(type=int),
    prefix_sharing=Opt(type=bool, flags=("--prefix-sharing/--no-prefix-sharing",)),
    prefix_attention=Opt(type=Optional[str]),
    # what the run may cost, where the config counts it (`costed`): under a heading of their own
    price_in=Opt(type=Optional[float], panel=COST, only=costed),
    price_out=Opt(type=Optional[float], panel=COST, only=costed),
    budget=Opt(type=Optional[float], panel=COST, only=costed),
)

RUN = Group(
    "run", "Output folder",
    out=Opt(Path("runs/out"), CLI_HELP["out"], Path),
    resume=Opt(False, CLI_HELP["resume"], bool, ("--resume",)),
    overwrite=Opt(False, CLI_HELP["overwrite"], bool, ("--overwrite",)),
    quiet=Opt(False, CLI_HELP["quiet"], bool, ("--quiet",)),
)


def task_fields(a: Args, placements: str = "positions") -> dict:
    """TaskChoice fields of a library config from the TASK group: each task option given, converted to the type the
    chosen task declares (`--pairs 75` on kv-uuid an int; a bad value refused in one line). An option the task does
    not take is passed on, for the task's own refusal, but --pairs, which once also named a two-hop task's placements:
    refused naming the command's placements option (`placements`: --positions, show's --position)."""
    name = (a.task or "").partition(":")[0]
    entry = TASKS.get(name)
    own = entry.options if entry is not None else {}
    given = {k: getattr(a, k) for k in TASK_OPTIONS if getattr(a, k) is not None}
    if "pairs" in given and entry is not None and "pairs" not in own:
        raise PosbiasError(f"`pairs` is kv-uuid's count of key-value pairs, and task {name} takes none; placements (a "
                           f"two-hop task's too) are `{placements}`", f"use `{placements}={given['pairs']}` and drop `pairs`")
    opts = {k: entry.value(name, k, v) if k in own else v for k, v in given.items()}
    return {"task": a.task, "task_options": {k: v for k, v in opts.items() if v is not None},
            "data_dir": str(a.data_dir) if a.data_dir else None}


def model_fields(a: Args) -> dict:
    return {"model": a.model, "dtype": a.dtype, "device": a.device, "chat": a.chat, "device_map": a.device_map}


def run_kwargs(a: Args) -> dict:
    return {"resume": a.resume, "overwrite": a.overwrite, "progress": not a.quiet}


def announce(a: Args, cfg) -> str:
    """What a command prints before it opens the model (MODEL group): `loading NAME (dtype, device) ...` (dtype auto:
    its choice and the CPU it read, `auto -> fp32: AMD EPYC (x86_64, AVX2, no native bf16)`); for a model
    on a server, `connecting to openai:NAME at BASE_URL ...` (dtype and device do not apply there). The command's
    config `cfg` is validated first, so a bad option is refused before the line, not after it."""
    cfg.validate()
    try:
        spec = parse_spec(a.model)
    except PosbiasError:  # the command's own validation says what is wrong with it
        spec = None
    where = spec.cls.where(spec.args) if spec is not None else None
    if where is not None:
        return f"connecting to {spec.label} at {where} ..."
    return f"loading {a.model} ({dtype_note(a.dtype, a.device)}, {a.device}) ..."


# ----------------------------------------------------------------------------- small parsers


def floats(s: Optional[str], k: int | None = None, what: str | None = None,
           example: str | None = None) -> Optional[tuple[float, ...]]:
    """`s` as k comma-separated numbers (any count for k None); `what`: the option's parameter, `example` a valid value."""
    return _numbers(s, float, k, what, example)


def ints(s: Optional[str], what: str | None = None, example: str | None = None, k: int | None = None) -> Optional[list[int]]:
    """`s` as (k) comma-separated integers; `what`: the option's parameter, `example` a valid value."""
    v = _numbers(s, int, k, what, example)
    return None if v is None else list(v)


def _numbers(s: Optional[str], kind: type, k: int | None, what: str | None, example: str | None) -> Optional[tuple]:
    if s is None:
        return None
    name = "integers" if kind is int else "numbers"
    where = f" for `{what}`" if what and what.isidentifier() else f" for {what}" if what else ""
    fix = f"e.g. `{what}={example}`" if what and example else f"write comma-separated {name}"
    try:
        v = tuple(kind(x) for x in s.split(",") if x or kind is float)
    except ValueError:
        raise PosbiasError(f"bad list of {name} {s!r}{where}", fix) from None
    if k is not None and len(v) != k:
        raise PosbiasError(f"expected {k} {name}{where}, got {s!r}", fix)
    return v


def words(s: Optional[str]) -> Optional[list[str]]:
    return None if s is None else [x for x in s.split(",") if x]
