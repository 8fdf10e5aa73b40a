"""Option groups declared once and shared by the commands, plus the small parsers the commands need.

A command names the groups it uses as parameters annotated with `Group` instances:

    @app.command()
    @uses(TASK, RUN.defaults(out=Path("runs/sweep")))
    def sweep(task: Args, run: Args, positions: str = typer.Option("all", ...)): ...

`uses` puts every option of those groups into the command's signature (typer reads it), and
calls the command with one `Args` namespace per group. Help pages list each group under its
own heading.
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

from .. import METHODS, TASKS, PosbiasError, SweepConfig
from ..measure import ENGINES

Args = SimpleNamespace  # what a command receives for each group


@dataclass(frozen=True)
class Opt:
    default: Any
    help: str
    type: Any = str
    flags: tuple[str, ...] = ()  # explicit declarations, e.g. ("--resume",); default: --name-with-dashes


class Group:
    """A named set of options; `defaults(...)` gives a copy with other defaults for one command."""

    def __init__(self, name: str, panel: str, **opts: Opt):
        self.name, self.panel, self.opts = name, panel, opts

    def defaults(self, **values: Any) -> "Group":
        """A copy with other defaults (a default of None makes the option optional)."""
        unknown = set(values) - set(self.opts)
        assert not unknown, f"{self.name} has no options {unknown}"
        opts = {}
        for k, o in self.opts.items():
            if k in values:
                o = replace(o, default=values[k], type=Optional[o.type] if values[k] is None else o.type)
            opts[k] = o
        return Group(self.name, self.panel, **opts)

    def parameters(self) -> list[inspect.Parameter]:
        return [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=o.type,
                                  default=typer.Option(o.default, *o.flags, help=o.help, rich_help_panel=self.panel))
                for k, o in self.opts.items()]


def uses(*groups: Group) -> Callable:
    """Decorator: the command gets each group's options; its parameter named like a group receives an Args."""

    def deco(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn)
        names = {g.name for g in groups}
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()
               if p.name not in names]
        params = own + [p for g in groups for p in g.parameters()]

        @functools.wraps(fn)
        def command(**kw: Any) -> Any:
            for g in groups:
                kw[g.name] = Args(**{k: kw.pop(k) for k in g.opts})
            return fn(**kw)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return deco


# ----------------------------------------------------------------------------- the groups


def default(name: str, config: type = SweepConfig) -> Any:
    """A config field's default: the CLI declares no default of its own (tests/test_cli_defaults.py)."""
    return {f.name: f.default for f in dataclasses.fields(config)}[name]


def method_help(lead: str = "") -> str:
    """--method's values, from the method registry (each method's spec forms)."""
    return lead + " | ".join(cls.usage or name for name, cls in METHODS.items()) + " (docs/cli.md, docs/mitigations.md)"


def task_help() -> str:
    """--task's values, from the task registry."""
    return " | ".join(f"{name}:{e.arg}" if e.arg else name for name, e in TASKS.items()) + " (posbias tasks)"


MODEL = Group(
    "model", "Model",
    model=Opt(default("model"), "registered name (posbias models), HF model dir or hub id, or a .gguf file"),
    dtype=Opt(default("dtype"), "bf16 | fp32"),
    device=Opt(default("device"), "cpu | cuda | auto (cuda if visible)"),
    chat=Opt(default("chat"), "use the chat template: auto (if the model has one) | on | off"),
    device_map=Opt(default("device_map"),
                   "auto: spread the model over every visible device (one process; --device then not used)", Optional[str]),
)

TASK = Group(
    "task", "Task",
    task=Opt(default("task"), task_help()),
    facts=Opt(None, "kv-lookup: number of facts (default 10)", Optional[int]),
    digits=Opt(None, "kv-lookup: digits per key/value (default 6)", Optional[int]),
    docs=Opt(None, "nq: 10 or 20 documents (default 10)", Optional[int]),
    pairs=Opt(None, "kv-uuid: key-value pairs (75/140 read the shared files; default 75); two-hop tasks: where the hops "
                    "go, connected,disconnected,reversed | 0:1,5:13 | grid | all (like --positions)", Optional[str]),
    answers=Opt(None, "nq/jsonl: all | first (only the 1st gold answer counts)", Optional[str]),
    style=Opt(None, "kv-2hop: direct (teacher-forced answer; default) | cot (chain of thought, EM after 'The answer is:')",
              Optional[str]),
    prompt=Opt(None, "musique/two-hop jsonl: reasoning (the paper's template; default) | coc (Chain-of-Citation)",
               Optional[str]),
    options=Opt(None, "order tasks: candidates per item (judge default 2, mc default 4; 2..10)", Optional[int]),
    labels=Opt(None, "order tasks: option labels, letters (A, B, ...; default) | digits (1, 2, ...)", Optional[str]),
    reference=Opt(None, "judge-nq/mc-nq: show the gold passage, yes (default) | no (closed book)", Optional[str]),
    data_dir=Opt(None, "benchmark data dir (default ../shared/data or $POSBIAS_DATA)", Optional[Path]),
)

SPLIT = Group(
    "split", "Examples",
    n=Opt(default("n"), "examples per position", int),
    seed=Opt(default("seed"), "example selection / generation seed", int),
    skip=Opt(default("skip"), "skip the first SKIP examples of the order (disjoint splits)", int),
)

SCORING = Group(
    "scoring", "Scoring",
    engine=Opt(default("engine"), " | ".join(ENGINES) + " (default: the task's)", Optional[str]),
    max_new_tokens=Opt(default("max_new_tokens"), "generate: token limit (default: the task's)", Optional[int]),
    batch_tokens=Opt(default("batch_tokens"), "padded tokens per batch", int),
    max_batch=Opt(default("max_batch"), "rows per batch at most", int),
    prefix_sharing=Opt(default("prefix_sharing"), "score each example's shared prompt prefix once, from cached keys/values "
                             "(--no-prefix-sharing: the plain path)", bool, ("--prefix-sharing/--no-prefix-sharing",)),
)

RUN = Group(
    "run", "Output folder",
    out=Opt(Path("runs/out"), "output directory", Path),
    resume=Opt(False, "continue a stopped run in OUT (same options)", bool, ("--resume",)),
    overwrite=Opt(False, "discard what OUT holds and start again", bool, ("--overwrite",)),
    quiet=Opt(False, "no progress bars", bool, ("--quiet",)),
)


def task_fields(a: Args) -> dict:
    """TaskChoice fields of a library config from the TASK group (--pairs only where it is the kv-uuid count)."""
    opts = {k: getattr(a, k) for k in ("facts", "digits", "docs", "answers", "style", "prompt", "options", "labels",
                                       "reference")}
    if a.pairs is not None and "pairs" in getattr(TASKS.get(a.task.partition(":")[0]), "options", ()):
        try:
            opts["pairs"] = int(a.pairs)
        except ValueError:
            raise PosbiasError(f"kv-uuid takes a number of pairs, got `pairs={a.pairs}`", "e.g. `pairs=75`") from None
    return {"task": a.task, "task_options": {k: v for k, v in opts.items() if v is not None},
            "data_dir": str(a.data_dir) if a.data_dir else None}


def placements(a: Args, positions: str | None) -> str | None:
    """--positions, or --pairs for a two-hop task (where it names the placements of the two hops)."""
    if a.pairs is None or "pairs" in getattr(TASKS.get(a.task.partition(":")[0]), "options", ()):
        return positions
    if positions is not None:
        raise PosbiasError("both `positions` and `pairs` name the placements", "pass one of them")
    return a.pairs


def model_fields(a: Args) -> dict:
    return {"model": a.model, "dtype": a.dtype, "device": a.device, "chat": a.chat, "device_map": a.device_map}


def run_kwargs(a: Args) -> dict:
    return {"resume": a.resume, "overwrite": a.overwrite, "progress": not a.quiet}


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
