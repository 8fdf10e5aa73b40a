"""Position-controlled tasks: the same example content at every position, only the gold moved."""

from __future__ import annotations

import gzip
import json
import random
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import PosbiasError


@dataclass(frozen=True)
class Prompt:
    """What a task gives the scorer for one (example, gold position).

    user: the user-turn text (the whole prompt for models without a chat template);
    answer_prefix: text the assistant turn starts with (may be empty), after which
    both scoring engines continue; answers: accepted gold answers (first = canonical).
    """

    example_id: str
    position: int
    user: str
    answer_prefix: str
    answers: tuple[str, ...]


class Task(ABC):
    """A family of examples with `n_slots` item slots, the gold item movable to any slot.

    Subclasses set `name`, `metric` (a key of core.metrics.METRICS), `default_engine`,
    `max_new_tokens`, and implement `n_slots`, `pool_size`, `_example` and `build`.
    """

    name: str
    metric: str = "substring"
    default_engine: str = "teacher-forced"
    max_new_tokens: int = 16

    @property
    @abstractmethod
    def n_slots(self) -> int: ...

    @property
    @abstractmethod
    def pool_size(self) -> int | None:
        """How many distinct examples exist (None: unlimited, generated)."""

    @abstractmethod
    def _example(self, index: int) -> Any:
        """The example content with pool index `index` (position-free)."""

    @abstractmethod
    def build(self, example: Any, position: int) -> Prompt:
        """The prompt with the gold item at slot `position`; everything else unchanged."""

    def config(self) -> dict:
        return {"name": self.name, "n_slots": self.n_slots, "metric": self.metric}

    def examples(self, n: int, seed: int = 0, skip: int = 0) -> list[Any]:
        """n examples: a seeded permutation of the pool, from offset `skip` (disjoint splits)."""
        pool = self.pool_size
        if pool is None:
            return [self._example(i) for i in range(skip, skip + n)]
        if skip + n > pool:
            fix = f"use `n={pool - skip}` or fewer" if skip < pool else f"use `skip` below {pool}, e.g. `skip={max(pool - n, 0)}`"
            raise PosbiasError(f"task {self.name} has {pool} examples but {skip + n} were asked for (`skip={skip}`, `n={n}`)",
                               fix)
        order = list(range(pool))
        random.Random(seed).shuffle(order)
        return [self._example(i) for i in order[skip : skip + n]]


def move(items: list, gold_index: int, position: int) -> list:
    """Return items with items[gold_index] moved to `position`; the others keep their order."""
    rest = items[:gold_index] + items[gold_index + 1 :]
    return rest[:position] + [items[gold_index]] + rest[position:]


def resolve_positions(spec: str, n_slots: int) -> list[int]:
    """'all' | '0,4,9' | '0%,50%,100%' (percent of the last slot, rounded) -> sorted slot list."""
    spec = spec.strip()
    if spec == "all":
        return list(range(n_slots))
    out = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if part.endswith("%"):
                pct = float(part[:-1])
                if not 0 <= pct <= 100:
                    raise ValueError
                out.append(int(round(pct / 100 * (n_slots - 1))))
            else:
                out.append(int(part))
        except ValueError:
            raise PosbiasError(
                f"bad position '{part}' in `positions` {spec}", "use all, a list like 0,4,9, or percents like 0%,50%,100%"
            ) from None
        if not 0 <= out[-1] < n_slots:
            raise PosbiasError(
                f"position {out[-1]} is out of range: this task has {n_slots} slots (0..{n_slots - 1})",
                f"use positions between 0 and {n_slots - 1}",
            )
    return sorted(set(out))


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for a .jsonl or .jsonl.gz file (UTF-8); a clear error on bad lines, text that is
    not UTF-8, and a .gz file that is not gzip or is cut short."""
    p = Path(path)
    if not p.is_file():
        raise PosbiasError(f"data file '{p}' does not exist", "check the path (shared data lives in ../shared/data)")
    opener = gzip.open if p.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(p, "rt", encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield lineno, _record(p, lineno, line)
    except UnicodeDecodeError as e:
        raise PosbiasError(f"{p}:{lineno + 1}: not UTF-8 text ({e.reason})", "save the file as UTF-8") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise PosbiasError(f"{p}: not a complete gzip file ({e})", "re-create it with gzip, or drop the .gz suffix") from None


def _record(p: Path, lineno: int, line: str) -> dict:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise PosbiasError(f"{p}:{lineno}: not valid JSON ({e.msg})", "fix or remove that line") from None
    if not isinstance(rec, dict):
        raise PosbiasError(f"{p}:{lineno}: expected a JSON object", "each line must be one object")
    return rec


def shared_data_dir() -> Path:
    """../shared/data relative to the checkout, or $POSBIAS_DATA."""
    import os

    env = os.environ.get("POSBIAS_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent.parent / "shared" / "data"
        if cand.is_dir():
            return cand
    return Path.cwd().parent / "shared" / "data"
