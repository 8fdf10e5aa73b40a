"""The task registry: a spec (`name`, `name:PATH`, or with key=value options) and options -> a Task.

    get_task("kv-lookup", facts=20)        get_task("jsonl:my.jsonl", answers="first")
    get_task("kv-lookup:facts=20")         get_task("jsonl:my.jsonl,answers=first")   the same, options in the spec
    get_task(MyTask())                      a Task object is used as it is
    register_task("my-task", lambda arg, data_dir, **o: MyTask(**o), "what it is", options={"size": int})

A spec's options are key=value pairs (posbias/specs.py) after the name, or after a task's PATH (`path=PATH` works
too); they join the options given as arguments, and a key given both ways with different values is refused.
`split_task` turns a spec into what a run records: the task as `name` or `name:PATH`, its options apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import PosbiasError
from ..registry import Registry
from ..specs import Param, bind, is_pairs, split_pairs
from .base import Task
from .docqa import jsonl_task, nq_task
from .haystack import Haystack
from .kv_lookup import KVLookup
from .kv_uuid import KVUUID
from .order import kv_order_task, nq_order_task
from .order_files import order_file_task
from .twohop import KV2Hop, musique_task


@dataclass(frozen=True)
class TaskEntry:
    """How to build one family of tasks: build(arg, data_dir, **options) -> Task."""

    build: Callable[..., Task]
    description: str
    options: tuple[str, ...] = ()
    arg: str | None = None  # the name of the part after ':' (jsonl: "PATH"); None: takes no argument
    types: dict[str, Any] = field(default_factory=dict)  # option -> type, for a spec's values (untyped: guessed)
    # the option that sets the context's size, which a depth x length grid grows (eval/grid.py), and the values it
    # allows (None: any); None: the task has none (a file's, a two-hop task's)
    size: tuple[str, tuple[int, ...] | None] | None = None

    def usage(self, name: str) -> str:
        return f"{name}:{self.arg}" if self.arg else name

    def pairs_form(self, name: str) -> str:
        """The spec with its options as key=value pairs: `kv-lookup:facts=..,digits=..`, `jsonl:PATH,answers=..`."""
        pairs = ",".join(f"{o}=.." for o in self.options)
        return f"{self.usage(name)}{',' if self.arg else ':'}{pairs}" if pairs else self.usage(name)

    def params(self) -> dict[str, Param]:
        """The keys of a spec: `path` for a task that takes a PATH, then its options."""
        path = {self.arg.lower(): Param(str, required=True)} if self.arg else {}
        return {**path, **{o: Param(self.types.get(o)) for o in self.options}}


TASKS = Registry("task")  # name -> TaskEntry


def register_task(name: str, build: Callable[..., Task], description: str,
                  options: tuple[str, ...] | dict[str, Any] = (), arg: str | None = None,
                  size: str | tuple[str, tuple[int, ...] | None] | None = None) -> None:
    """Add a task family; `options` are the keyword options it accepts (the CLI's task options): names, or a dict
    {name: type} so a spec's values are converted (`facts=30` an int); `size` the option a depth x length grid grows
    (with the values it allows, if not any). A taken name is refused."""
    types = dict(options) if isinstance(options, dict) else {}
    grows = (size, None) if isinstance(size, str) else size
    if grows is not None and grows[0] not in tuple(options):
        raise PosbiasError(f"task {name}'s size option {grows[0]!r} is not one of its options", "list it in `options`")
    TASKS.add(name, TaskEntry(build, description, tuple(options), arg, types, grows), owner=build)


register_task("kv-lookup", lambda arg, data_dir, **o: KVLookup(**o),
              "N facts 'The code for 482913 is 771204.' and a question about one (options: facts, digits)",
              {"facts": int, "digits": int}, size="facts")
register_task("kv-uuid", lambda arg, data_dir, **o: KVUUID(data_dir=data_dir, **o),
              "Lost in the Middle JSON UUID key-value retrieval (option: pairs; 75/140 read the shared files)", {"pairs": int},
              size="pairs")
register_task("nq", lambda arg, data_dir, **o: nq_task(data_dir=data_dir, **o),
              "Lost in the Middle NQ-open multi-document QA (options: docs = 10 or 20; answers = all | first; question = "
              "after | both, the question's place around the documents)", {"docs": int, "answers": str, "question": str},
              size=("docs", (10, 20)))  # the shared data holds 20 passages per question; 10 = gold + the first 9
register_task("jsonl", lambda arg, data_dir, **o: jsonl_task(arg, **o),
              "your own multi-document QA or two-hop data (schema below; options: answers, question, or prompt for two "
              "hops)", {"answers": str, "prompt": str | None, "question": str | None}, arg="PATH")
register_task("musique", lambda arg, data_dir, **o: musique_task(data_dir=data_dir, **o),
              "MuSiQue 2-hop reasoning, 20 paragraphs, the two hops placed (options: prompt = reasoning | coc; docs = 20 "
              "or 10)", {"docs": int, "prompt": str})
register_task("niah", lambda arg, data_dir, **o: Haystack(data_dir=data_dir, **o),
              "a needle at a depth of a natural haystack of `tokens` model tokens (RULER / NIAH; options: tokens, "
              "needle = kv | nq | nq-sentence | PATH.jsonl, haystack = nq | PATH (text file or folder), keys, values, "
              "queries (multi-needle), overlap = any | none (NoLiMa), context = full | needle | none, answer_prefix = "
              "the reply's start for needles without their own)",
              {"tokens": int, "needle": str, "haystack": str, "keys": int, "values": int, "queries": int,
               "overlap": str, "context": str, "answer_prefix": str},
              size="tokens")  # lengths in the model's own tokens (tasks/haystack.py): 1k = 1024
register_task("kv-2hop", lambda arg, data_dir, **o: KV2Hop(**o),
              "chain lookup 'The code for A is B.' ... 'The code for B is C.', two hops placed (options: facts, digits, "
              "style = direct | cot)", {"facts": int, "digits": int, "style": str})

for _style, _k, _what in (("judge", 2, "pairwise judge: which of two candidate answers is correct"),
                          ("mc", 4, "multiple choice")):
    # the judge's question: correct | preference, or a template file of your own (tasks/judge_template.py)
    _ask = {"ask": str, "template": str} if _style == "judge" else {}
    register_task(f"{_style}-nq",
                  lambda arg, data_dir, options=_k, _s=_style, **o: nq_order_task(_s, int(options), data_dir, **o),
                  f"order bias, {_what} (default {_k} options), NQ-open questions, wrong candidates answers to other "
                  "questions of the same kind (options: options, reference = yes | no, labels = letters | digits"
                  f"{', ask = correct | preference, template = FILE' if _ask else ''})",
                  {"options": int, "labels": str, "reference": str, **_ask})
    register_task(f"{_style}-kv", lambda arg, data_dir, options=_k, _s=_style, **o: kv_order_task(_s, int(options), **o),
                  f"order bias, {_what} (default {_k} options), generated facts, wrong candidates one digit off "
                  f"(options: options, facts, digits, labels{', ask, template' if _ask else ''})",
                  {"facts": int, "digits": int, "options": int, "labels": str, **_ask})
    register_task(_style, lambda arg, data_dir, _s=_style, **o: order_file_task(_s, arg, **o),
                  f"order bias on your own {'pairwise judge' if _style == 'judge' else 'multiple-choice'} file (schemas "
                  "below; options: labels"
                  f"{', ask = preference | correct, template = FILE, ties = refuse | drop' if _ask else ''})",
                  {"labels": str, **({"ask": str, "template": str, "ties": str} if _ask else {})}, arg="PATH")


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
    return entry.build(arg, data_dir, **options)
