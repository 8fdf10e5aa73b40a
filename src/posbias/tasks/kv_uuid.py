"""kv-uuid: the *Lost in the Middle* JSON key-value retrieval task (Liu et al., 2023)."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..data import data_file
from ..errors import PosbiasError
from .base import Prompt, Task, move, read_jsonl

SHARED_PAIRS = (75, 140)

# The study's kv_retrieval.prompt, verbatim.
TEMPLATE = (
    "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    "JSON data:\n{records}\n\nKey: \"{key}\"\nCorresponding value:"
)


def format_records(pairs: list[tuple[str, str]]) -> str:
    """The study's JSON layout: '{"k": "v",\\n "k": "v",\\n ... "k": "v"}'."""
    out = []
    for i, (k, v) in enumerate(pairs):
        start = "{" if i == 0 else " "
        end = ",\n" if i != len(pairs) - 1 else "}"
        out.append(f'{start}"{k}": "{v}"{end}')
    return "".join(out)


@dataclass(frozen=True)
class KVRecords:
    id: str
    pairs: tuple[tuple[str, str], ...]
    gold: int


class KVUUID(Task):
    """UUID key-value retrieval. pairs=75 or 140 reads the study's files (data set kv-uuid: 500 examples each);
    any other number (or source='generate') draws seeded random UUIDs.

    pairs: key-value pairs per example (75 and 140 read the study's files, data set kv-uuid; other counts are drawn from the seed)
    source: auto (the study's files for 75 or 140 pairs, else drawn) | file | generate (seeded random UUIDs)
    """

    name = "kv-uuid"
    metric = "substring"
    default_engine = "teacher-forced"
    max_new_tokens = 24

    def __init__(self, pairs: int = 75, source: str = "auto", data_dir: str | Path | None = None):
        if pairs < 2:
            raise PosbiasError(f"kv-uuid needs at least 2 pairs, got {pairs}", "use `pairs=2` or more")
        if source == "auto":
            source = "file" if pairs in SHARED_PAIRS else "generate"
        if source == "file" and pairs not in SHARED_PAIRS:
            raise PosbiasError(f"the study's kv files have 75 or 140 pairs, not {pairs}", "use `pairs=75` or `pairs=140`")
        self.pairs, self.source = pairs, source
        self._records: list[KVRecords] | None = None
        if source == "file":
            path = data_file("kv-uuid", f"kv/kv-retrieval-{pairs}_keys.jsonl.gz", data_dir)
            self._records = [self._parse(path, n, r) for n, r in read_jsonl(path)]
            self.inputs = (path,)

    @staticmethod
    def _parse(path: Path, lineno: int, r: dict) -> KVRecords:
        recs = r.get("ordered_kv_records")
        ok = isinstance(recs, list) and all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x)
                                            for x in recs)
        pairs = tuple((k, v) for k, v in recs) if ok else ()
        if not ok or r.get("key") not in [k for k, _ in pairs]:
            raise PosbiasError(f"{path}:{lineno}: not a kv-retrieval record (needs 'ordered_kv_records' as [key, value]"
                               " string pairs and a 'key' among them)", "use the study's files")
        gold = [k for k, _ in pairs].index(r["key"])
        return KVRecords(id=f"kvu{lineno - 1}", pairs=pairs, gold=gold)

    @property
    def n_slots(self) -> int:
        return self.pairs

    @property
    def pool_size(self) -> int | None:
        return None if self._records is None else len(self._records)

    def config(self) -> dict:
        return {**super().config(), "pairs": self.pairs, "source": self.source}

    def _example(self, index: int) -> KVRecords:
        if self._records is not None:
            return self._records[index]
        rng = random.Random(f"kv-uuid/{self.pairs}/{index}")
        ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(2 * self.pairs)]
        pairs = tuple((ids[2 * i], ids[2 * i + 1]) for i in range(self.pairs))
        return KVRecords(id=f"kvg{index}", pairs=pairs, gold=rng.randrange(self.pairs))

    def items(self, ex: KVRecords, position: int) -> list[str]:
        """Each record as the JSON layout writes it, '"key": "value"' (format_records)."""
        return [f'"{k}": "{v}"' for k, v in move(list(ex.pairs), ex.gold, position)]

    def build(self, ex: KVRecords, position: int) -> Prompt:
        key, value = ex.pairs[ex.gold]
        user = TEMPLATE.format(records=format_records(move(list(ex.pairs), ex.gold, position)), key=key)
        return Prompt(ex.id, position, user, "", (value,))
