"""The task registry: a name (or `name:ARG`, e.g. `jsonl:PATH`) and options -> a Task.

    get_task("kv-lookup", facts=20)        get_task("jsonl:my.jsonl", answers="first")
    get_task(MyTask())                      a Task object is used as it is
    register_task("my-task", lambda arg, data_dir, **o: MyTask(**o), "what it is", options=("size",))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import PosbiasError
from .base import Task
from .docqa import jsonl_task, nq_task
from .kv_lookup import KVLookup
from .kv_uuid import KVUUID
from .order import kv_order_task, nq_order_task, order_file_task
from .twohop import KV2Hop, musique_task


@dataclass(frozen=True)
class TaskEntry:
    """How to build one family of tasks: build(arg, data_dir, **options) -> Task."""

    build: Callable[..., Task]
    description: str
    options: tuple[str, ...] = ()
    arg: str | None = None  # the name of the part after ':' (jsonl: "PATH"); None: takes no argument

    def usage(self, name: str) -> str:
        return f"{name}:{self.arg}" if self.arg else name


TASKS: dict[str, TaskEntry] = {}


def register_task(name: str, build: Callable[..., Task], description: str, options: tuple[str, ...] = (),
                  arg: str | None = None) -> None:
    """Add a task family; `options` are the keyword options it accepts (the CLI's task options)."""
    TASKS[name] = TaskEntry(build, description, tuple(options), arg)


register_task("kv-lookup", lambda arg, data_dir, **o: KVLookup(**o),
              "N facts 'The code for 482913 is 771204.' and a question about one (options: facts, digits)",
              ("facts", "digits"))
register_task("kv-uuid", lambda arg, data_dir, **o: KVUUID(data_dir=data_dir, **o),
              "Lost in the Middle JSON UUID key-value retrieval (option: pairs; 75/140 read the shared files)", ("pairs",))
register_task("nq", lambda arg, data_dir, **o: nq_task(data_dir=data_dir, **o),
              "Lost in the Middle NQ-open multi-document QA (options: docs = 10 or 20; answers = all | first)",
              ("docs", "answers"))
register_task("jsonl", lambda arg, data_dir, **o: jsonl_task(arg, **o),
              "your own multi-document QA or two-hop data (schema below; options: answers, or prompt for two hops)",
              ("answers", "prompt"), arg="PATH")
register_task("musique", lambda arg, data_dir, **o: musique_task(data_dir=data_dir, **o),
              "MuSiQue 2-hop reasoning, 20 paragraphs, the two hops placed (options: prompt = reasoning | coc; docs = 20 "
              "or 10)", ("prompt", "docs"))
register_task("kv-2hop", lambda arg, data_dir, **o: KV2Hop(**o),
              "chain lookup 'The code for A is B.' ... 'The code for B is C.', two hops placed (options: facts, digits, "
              "style = direct | cot)", ("facts", "digits", "style"))

for _style, _k, _what in (("judge", 2, "pairwise judge: which of two candidate answers is correct"),
                          ("mc", 4, "multiple choice")):
    register_task(f"{_style}-nq",
                  lambda arg, data_dir, options=_k, _s=_style, **o: nq_order_task(_s, int(options), data_dir, **o),
                  f"order bias, {_what} (default {_k} options), NQ-open questions, wrong candidates answers to other "
                  "questions of the same kind (options: options, reference = yes | no, labels = letters | digits)",
                  ("options", "reference", "labels"))
    register_task(f"{_style}-kv", lambda arg, data_dir, options=_k, _s=_style, **o: kv_order_task(_s, int(options), **o),
                  f"order bias, {_what} (default {_k} options), generated facts, wrong candidates one digit off "
                  "(options: options, facts, digits, labels)", ("options", "facts", "digits", "labels"))
    register_task(_style, lambda arg, data_dir, _s=_style, **o: order_file_task(_s, arg, **o),
                  f"order bias on your own {'pairwise judge' if _style == 'judge' else 'multiple-choice'} file (schemas "
                  "below; option: labels)", ("labels",), arg="PATH")


def get_task(spec: str | Task, data_dir: str | None = None, **options) -> Task:
    """A Task from its spec (see the module docstring); options that are None take the task's defaults."""
    options = {k: v for k, v in options.items() if v is not None}
    if isinstance(spec, Task):
        if options:
            raise PosbiasError(f"task options {sorted(options)} were given with a Task object",
                               "set them on the object itself")
        return spec
    name, colon, arg = str(spec).partition(":")
    entry = TASKS.get(name)
    if entry is None or bool(colon) != bool(entry.arg):
        known = ", ".join(e.usage(n) for n, e in TASKS.items())
        raise PosbiasError(f"unknown task '{spec}'", f"use one of: {known}")
    if entry.arg and not arg:
        raise PosbiasError(f"{name}: needs a {entry.arg}", f"use `task={entry.usage(name)}`")
    bad = set(options) - set(entry.options)
    if bad:
        takes = ", ".join(f"`{o}`" for o in entry.options) or "no options"
        raise PosbiasError(f"task {name} does not take {', '.join(f'`{o}`' for o in sorted(bad))}", f"it takes: {takes}")
    return entry.build(arg, data_dir, **options)
