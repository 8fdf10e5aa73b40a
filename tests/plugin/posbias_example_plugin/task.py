"""A task: kv-lookup with few short facts (a subclass; options from the constructor, registered in one line)."""

from posbias import register_task
from posbias.tasks.kv_lookup import KVLookup


class KVTiny(KVLookup):
    """Four 3-digit facts by default: a kv-lookup small enough for any test."""

    name = "kv-tiny"

    def __init__(self, facts: int = 4, digits: int = 3):
        super().__init__(facts=facts, digits=digits)


register_task("kv-tiny", lambda arg, data_dir, **o: KVTiny(**o), "four 3-digit facts (the example plugin's task)",
              {"facts": int, "digits": int})
