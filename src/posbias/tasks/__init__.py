"""Position-controlled tasks and their registry: `get_task("kv-lookup", facts=10)` (or `get_task("kv-lookup:facts=10")`),
`get_task("jsonl:my.jsonl")`, `get_task("musique")` (two-hop: placements are pairs, tasks/placement.py)."""

from .base import Doc, Prompt, Task, move
from .depths import sigmoid_depths
from .docqa import JSONL_SCHEMA, DocQA, jsonl_task, nq_task
from .haystack import Haystack
from .kv_lookup import KVLookup
from .kv_uuid import KVUUID
from .order import ORDER_SCHEMAS, OrderItem, OrderTask
from .placement import MODES, Placement, as_json, label, mode_of, mode_summary, positions_spec, resolve_pairs, resolve_positions
from .placement import key as placement_key
from .registry import FILE_SCHEMAS, TASKS, TaskEntry, check_data, get_task, register_task, split_task
from .text import content_words
from .twohop import PROMPTS, KV2Hop, TwoHop, TwoHopQA, move2, musique_task

__all__ = [
    "FILE_SCHEMAS", "Haystack", "MODES", "content_words", "sigmoid_depths", "PROMPTS", "Doc", "as_json", "DocQA", "JSONL_SCHEMA", "KV2Hop", "KVLookup", "KVUUID", "Placement", "Prompt", "TASKS",
    "Task", "TaskEntry", "ORDER_SCHEMAS", "OrderItem", "OrderTask", "TwoHop", "TwoHopQA", "get_task", "jsonl_task", "label", "mode_of", "mode_summary", "move",
    "move2", "musique_task", "nq_task", "placement_key", "positions_spec", "register_task", "resolve_pairs", "resolve_positions",
    "split_task", "check_data",
]
