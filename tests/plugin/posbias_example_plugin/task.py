"""A task: kv-lookup with few short facts (a subclass: its options, their types, defaults and docs come from its
constructor and KVLookup's docstring; registered in one line)."""

from posbias import register_task
from posbias.tasks.kv_lookup import KVLookup


class KVTiny(KVLookup):
    """Four 3-digit facts by default: a kv-lookup small enough for any test."""

    name = "kv-tiny"

    def __init__(self, facts: int = 4, digits: int = 3):
        super().__init__(facts=facts, digits=digits)


register_task("kv-tiny", KVTiny, "four 3-digit facts (the example plugin's task)")
