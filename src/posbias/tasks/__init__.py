"""Task registry: `get_task("kv-lookup", facts=10)`, `get_task("jsonl:my.jsonl")`."""

from __future__ import annotations

from ..errors import PosbiasError
from .base import Prompt, Task, move, resolve_positions
from .docqa import JSONL_SCHEMA, DocQA, jsonl_task, nq_task
from .kv_lookup import KVLookup
from .kv_uuid import KVUUID

TASKS = {
    "kv-lookup": "N facts 'The code for 482913 is 771204.' and a question about one (options: facts, digits)",
    "kv-uuid": "Lost in the Middle JSON UUID key-value retrieval (option: pairs; 75/140 read the shared files)",
    "nq": "Lost in the Middle NQ-open multi-document QA (options: docs = 10 or 20; answers = all | first)",
    "jsonl:PATH": "your own multi-document QA data (see the schema with `posbias tasks`; option: answers)",
}

# which option each task accepts (CLI name -> constructor keyword)
_OPTIONS = {"kv-lookup": {"facts", "digits"}, "kv-uuid": {"pairs"}, "nq": {"docs", "answers"}, "jsonl": {"answers"}}


def get_task(spec: str, data_dir: str | None = None, **options) -> Task:
    """Build a task from its name (or 'jsonl:PATH') and options; None options take defaults."""
    options = {k: v for k, v in options.items() if v is not None}
    family = "jsonl" if spec.startswith("jsonl:") else spec
    if family not in _OPTIONS:
        raise PosbiasError(f"unknown task '{spec}'", f"use one of: {', '.join(TASKS)}")
    bad = set(options) - _OPTIONS[family]
    if bad:
        raise PosbiasError(
            f"task {family} does not take --{', --'.join(sorted(bad))}",
            f"it takes: {', '.join('--' + o for o in sorted(_OPTIONS[family])) or 'no options'}",
        )
    if family == "kv-lookup":
        return KVLookup(**options)
    if family == "kv-uuid":
        return KVUUID(data_dir=data_dir, **options)
    if family == "nq":
        return nq_task(data_dir=data_dir, **options)
    path = spec[len("jsonl:") :]
    if not path:
        raise PosbiasError("jsonl: needs a path", "use --task jsonl:path/to/data.jsonl")
    return jsonl_task(path, **options)


__all__ = [
    "DocQA", "JSONL_SCHEMA", "KVLookup", "KVUUID", "Prompt", "TASKS", "Task",
    "get_task", "jsonl_task", "move", "nq_task", "resolve_positions",
]
