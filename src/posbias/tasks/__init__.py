"""Position-controlled tasks and their registry: `get_task("kv-lookup", facts=10)`, `get_task("jsonl:my.jsonl")`."""

from .base import Prompt, Task, move, resolve_positions
from .docqa import JSONL_SCHEMA, DocQA, jsonl_task, nq_task
from .kv_lookup import KVLookup
from .kv_uuid import KVUUID
from .registry import TASKS, TaskEntry, get_task, register_task

__all__ = [
    "DocQA", "JSONL_SCHEMA", "KVLookup", "KVUUID", "Prompt", "TASKS", "Task", "TaskEntry",
    "get_task", "jsonl_task", "move", "nq_task", "register_task", "resolve_positions",
]
