"""The task registry: a spec (`name`, `name:PATH`, or with key=value options) and options -> a Task.

    get_task("kv-lookup", facts=20)        get_task("jsonl:my.jsonl", answers="first")
    get_task("kv-lookup:facts=20")         get_task("jsonl:my.jsonl,answers=first")   the same, options in the spec
    get_task(MyTask())                      a Task object is used as it is
    register_task("my-task", MyTask, "what it is")

A task is registered with its builder, a Task class or a function that returns a Task, and the builder is the one
place its options are declared: each parameter is an option, its annotation the option's type, its default the
task's default and its docstring's `name: text` entry the option's doc (a class's or its bases', the nearest
first; "see `NAME`" takes the entry of NAME, a builder of its module). The registry supplies two parameters: the
data folder to one named `data_dir`, and to a task registered with `arg="PATH"` the part after ':' to the one named
`path`. The CLI's task options, `posbias tasks` and docs/cli.md's task table are generated from these.

A spec's options are key=value pairs (posbias/specs.py) after the name, or after a task's PATH (`path=PATH` works
too); they join the options given as arguments, and a key given both ways with different values is refused.
`split_task` turns a spec into what a run records: the task as `name` or `name:PATH`, its options apart.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..data import require
from ..errors import PosbiasError
from ..registry import Registry
from ..specs import Param, bind, convert, doc_entries, is_pairs, parameters, split_pairs
from .base import Task
from .docqa import jsonl_task, nq_task
from .haystack import Haystack
from .kv_lookup import KVLookup
from .kv_uuid import KVUUID
from .order_builders import judge_file, judge_kv, judge_nq, mc_file, mc_kv, mc_nq
from .twohop import KV2Hop, musique_task


@dataclass(frozen=True)
class TaskOption:
    """One option of a task, read off its builder: the parameter's annotation (None: untyped), default and doc."""

    type: Any
    default: Any
    doc: str


@dataclass(frozen=True)
class TaskEntry:
    """How to build one family of tasks: `build` (a Task class or a function) called with the options, and with
    the PATH and the data folder where it takes them (`make`)."""

    build: Callable[..., Task]
    description: str
    options: dict[str, TaskOption] = field(default_factory=dict)  # in the builder's order
    arg: str | None = None  # the name of the part after ':' (jsonl: "PATH"); None: takes no argument
    # the option that sets the context's size, which a depth x length grid grows (eval/grid.py), and the values it
    # allows (None: any); None: the task has none (a file's, a two-hop task's)
    size: tuple[str, tuple[int, ...] | None] | None = None
    data_dir: bool = False  # whether the builder takes the data folder
    # the registered data sets (posbias.data) the task reads, given its options (the builder's defaults filled in):
    # checked before a model loads (`check_data`), so missing data is refused first, naming the fetch command
    data: Callable[[dict], tuple[str, ...]] = lambda options: ()

    def usage(self, name: str) -> str:
        return f"{name}:{self.arg}" if self.arg else name

    def pairs_form(self, name: str) -> str:
        """The spec with its options as key=value pairs: `kv-lookup:facts=..,digits=..`, `jsonl:PATH,answers=..`."""
        pairs = ",".join(f"{o}=.." for o in self.options)
        return f"{self.usage(name)}{',' if self.arg else ':'}{pairs}" if pairs else self.usage(name)

    def params(self) -> dict[str, Param]:
        """The keys of a spec: `path` for a task that takes a PATH, then its options."""
        path = {self.arg.lower(): Param(str, required=True)} if self.arg else {}
        return {**path, **{o: Param(opt.type) for o, opt in self.options.items()}}

    def value(self, name: str, option: str, raw: Any) -> Any:
        """A value given as text (a CLI flag: `--pairs 75`) as the option's type; a bad one refused in one line."""
        return convert([str(raw)], self.options[option].type, option, f"task {name}")

    def make(self, arg: str, data_dir: str | None, **options: Any) -> Task:
        given = {**({self.arg.lower(): arg} if self.arg else {}), **({"data_dir": data_dir} if self.data_dir else {})}
        task = self.build(**given, **options)
        if self.arg == "PATH" and not task.inputs:  # a user's file: the run records it with its hash
            task.inputs = (Path(arg),)
        return task

    def data_sets(self, options: dict) -> tuple[str, ...]:
        """The data sets the task reads with these options (the others at their defaults)."""
        return self.data({**{o: opt.default for o, opt in self.options.items()}, **options})


TASKS = Registry("task")  # name -> TaskEntry


def option_docs(build: Callable) -> dict[str, str]:
    """{option: doc} from the `name: text` entries of a builder's docstring (a class's and its bases', the nearest
    first); an entry "see `NAME`" takes NAME's entries, NAME a name in the builder's module."""
    docs: dict[str, str] = {}
    for owner in build.__mro__ if isinstance(build, type) else (build,):
        for names, text in doc_entries(owner):
            ref = re.fullmatch(r"see `(\w+)`\.?", text)
            other = vars(sys.modules.get(owner.__module__, sys)).get(ref[1]) if ref else None
            theirs = option_docs(other) if callable(other) else {}
            for n in names:
                if not ref:
                    docs.setdefault(n, text)
                elif n in theirs:
                    docs.setdefault(n, theirs[n])
    return docs


def _options(name: str, build: Callable, arg: str | None) -> tuple[dict[str, TaskOption], bool]:
    """(the options a builder declares, whether it takes `data_dir`); an undocumented option, or one without a
    default, is refused."""
    fn = build.__init__ if isinstance(build, type) else build
    what = getattr(build, "__qualname__", repr(build))
    params, signature = parameters(fn), inspect.signature(fn).parameters
    supplied = ("data_dir", arg.lower()) if arg else ("data_dir",)
    if arg and arg.lower() not in params:
        raise PosbiasError(f"task {name} takes a {arg}, and its builder {what} has no parameter `{arg.lower()}`",
                           f"name the builder's parameter that receives the {arg} `{arg.lower()}`")
    docs, options = option_docs(build), {}
    for o, p in params.items():
        if o in supplied:
            continue
        if o not in docs:
            raise PosbiasError(f"task {name}'s option `{o}` has no doc",
                               f"add a line `{o}: what it sets` to the docstring of {what}")
        if p.required:
            raise PosbiasError(f"task {name}'s option `{o}` has no default", f"give `{o}` a default in {what}")
        options[o] = TaskOption(p.annotation, signature[o].default, docs[o])
    return options, "data_dir" in params


def register_task(name: str, build: Callable[..., Task], description: str, *, arg: str | None = None,
                  size: str | tuple[str, tuple[int, ...] | None] | None = None,
                  data: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = ()) -> None:
    """Add a task family built by `build` (a Task class or a function returning a Task): its parameters are the
    task's options (module docstring), each documented in its docstring; `arg` names the part after ':' (`PATH`:
    the builder's `path`); `size` the option a depth x length grid grows (with the values it allows, if not any);
    `data` the registered data sets it reads (posbias.data), or a function of its options giving them. A taken name
    is refused."""
    if name in TASKS:  # refused first (Registry.add names both origins), before the builder is read
        TASKS.add(name, build, owner=build)
    options, data_dir = _options(name, build, arg)
    grows = (size, None) if isinstance(size, str) else size
    if grows is not None and grows[0] not in options:
        raise PosbiasError(f"task {name}'s size option {grows[0]!r} is not one of its options",
                           "name a parameter of its builder")
    needs = data if callable(data) else (lambda options, sets=tuple(data): sets)
    TASKS.add(name, TaskEntry(build, description, options, arg, grows, data_dir, needs), owner=build)


register_task("kv-lookup", KVLookup, "N facts 'The code for 482913 is 771204.' and a question about one", size="facts")
register_task("kv-uuid", KVUUID, "Lost in the Middle JSON UUID key-value retrieval", size="pairs",
              data=lambda o: ("kv-uuid",) if o["source"] == "file" or (o["source"] == "auto" and o["pairs"] in (75, 140))
              else ())
# the data set holds 20 passages per question; 10 = gold + the first 9
register_task("nq", nq_task, "Lost in the Middle NQ-open multi-document QA", size=("docs", (10, 20)), data=("nq",))
register_task("jsonl", jsonl_task, "your own multi-document QA or two-hop data (schema below)", arg="PATH")
register_task("musique", musique_task, "MuSiQue 2-hop reasoning, 20 paragraphs, the two hops placed", data=("musique",))
register_task("niah", Haystack, "a needle at a depth of a natural haystack of `tokens` model tokens (RULER / NIAH)",
              size="tokens",  # lengths in the model's own tokens (tasks/haystack.py): 1k = 1024
              data=lambda o: ("nq",) if o["needle"] in ("nq", "nq-sentence") or (o["haystack"] == "nq"
                                                                                  and o["context"] == "full") else ())
register_task("kv-2hop", KV2Hop, "chain lookup 'The code for A is B.' ... 'The code for B is C.', two hops placed")
# order bias (tasks/order.py): the correct candidate moved through the slots
register_task("judge-nq", judge_nq, "order bias, pairwise judge: which of two candidate answers is correct, NQ-open "
              "questions, wrong candidates answers to other questions of the same kind", data=("nq",))
register_task("judge-kv", judge_kv, "order bias, pairwise judge: which of two candidate answers is correct, "
              "generated facts, wrong candidates one digit off")
register_task("judge", judge_file, "order bias on your own pairwise judge file (schemas below)", arg="PATH")
register_task("mc-nq", mc_nq, "order bias, multiple choice, NQ-open questions, wrong candidates answers to other "
              "questions of the same kind", data=("nq",))
register_task("mc-kv", mc_kv, "order bias, multiple choice, generated facts, wrong candidates one digit off")
register_task("mc", mc_file, "order bias on your own multiple-choice file (schemas below)", arg="PATH")


# The formats of users' own files, by name -> (the registered task that reads them, what a line holds). A new format
# joins the conformance matrix (tests/test_conformance.py), which refuses to run until it has an example file for it.
FILE_SCHEMAS: dict[str, tuple[str, str]] = {
    "jsonl-one-gold": ("jsonl", "multi-document QA, one gold document: \"gold\": i (JSONL_SCHEMA)"),
    "jsonl-two-hop": ("jsonl", "two-hop reasoning, the two hops: \"gold\": [i, j] (JSONL_SCHEMA)"),
    "judge": ("judge", "a pairwise judge's items, two answers each (ORDER_SCHEMAS)"),
    "mc": ("mc", "multiple-choice items, 2 to 10 options each (ORDER_SCHEMAS)"),
}


def split_task(spec: str, options: dict | None = None) -> tuple[str, dict]:
    """(the task as a run records it, `name` or `name:PATH`; its options) of a spec with key=value options, merged
    with `options`: a key given both ways with different values is refused, and the options come back in the order
    the task declares them. A spec without pairs (or an unknown name, left to get_task) comes back as it is."""
    options = dict(options or {})
    name, colon, arg = spec.partition(":")
    entry = TASKS.get(name)
    if entry is None or not colon or not is_pairs(arg):
        return spec, options
    what, forms = f"task spec '{spec}'", entry.pairs_form(name)
    head, pairs = split_pairs(arg, what, f"write it as {forms}", head=entry.arg is not None)
    key = entry.arg.lower() if entry.arg else ""
    if head is not None:
        if key in pairs:
            raise PosbiasError(f"{what} names its {entry.arg} twice", f"write it as {forms}")
        pairs = {key: [head], **pairs}
    values = bind(pairs, entry.params(), what, forms)
    path = values.pop(key, None)
    for k, v in values.items():
        if options.get(k) is not None and options[k] != v:
            raise PosbiasError(f"task option {k} is {v} in the task spec '{spec}' and `{k}={options[k]}`",
                               f"give it once: drop `{k}` or the spec's {k}=")
        options[k] = v
    rank = {o: i for i, o in enumerate(entry.options)}
    ordered = {k: options[k] for k in sorted(options, key=lambda k: rank.get(k, len(rank)))}
    return (f"{name}:{path}" if entry.arg else name), ordered


def check_data(spec: str | Task, options: dict | None = None, data_dir: str | None = None) -> None:
    """Refuse, in one line naming the fetch command (posbias.data.DataMissing), a task whose data sets are not in the
    lookup order: what every pipeline checks before it loads a model. A Task object or an unknown name passes (the
    build says what is wrong with it)."""
    if isinstance(spec, Task):
        return
    name = str(spec).partition(":")[0]
    entry = TASKS.get(name)
    if entry is None:
        return
    given = {k: v for k, v in (options or {}).items() if v is not None and k in entry.options}
    for data_set in entry.data_sets(given):
        require(data_set, data_dir)


def get_task(spec: str | Task, data_dir: str | None = None, **options) -> Task:
    """A Task from its spec (see the module docstring); options that are None take the task's defaults."""
    options = {k: v for k, v in options.items() if v is not None}
    if isinstance(spec, Task):
        if options:
            raise PosbiasError(f"task options {sorted(options)} were given with a Task object",
                               "set them on the object itself")
        return spec
    spec, options = split_task(str(spec), options)
    name, colon, arg = spec.partition(":")
    entry = TASKS.get(name)
    if entry is None or bool(colon) != bool(entry.arg):
        known = ", ".join(e.usage(n) for n, e in TASKS.items())
        raise PosbiasError(f"unknown task '{spec}'", f"use one of: {known} (options also as NAME:key=value,...)")
    if entry.arg and not arg:
        raise PosbiasError(f"{name}: needs a {entry.arg}", f"use `task={entry.usage(name)}`")
    bad = set(options) - set(entry.options)
    if bad:
        takes = ", ".join(f"`{o}`" for o in entry.options) or "no options"
        raise PosbiasError(f"task {name} does not take {', '.join(f'`{o}`' for o in sorted(bad))}", f"it takes: {takes}")
    return entry.make(arg, data_dir, **options)
