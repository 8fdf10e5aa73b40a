"""kv-lookup: N synthetic facts "The code for 482913 is 771204." and a question about one."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import PosbiasError
from .base import FactsTask, Prompt, move


@dataclass(frozen=True)
class KVFacts:
    id: str
    pairs: tuple[tuple[str, str], ...]  # position-free order; pairs[gold] is asked about
    gold: int


class KVLookup(FactsTask):
    """Built-in key-value lookup, generated from the seed; no files needed.

    Each example draws n_facts distinct keys and values with `digits` digits (no
    leading zero) and asks for one of them. Moving the gold fact keeps the other facts
    in their order, so every position sees exactly the same facts and question.

    facts: the number of facts, one per slot
    digits: digits per key and value, 2 to 12
    """

    name = "kv-lookup"
    metric = "substring"
    default_engine = "teacher-forced"
    max_new_tokens = 12

    def __init__(self, facts: int = 10, digits: int = 6):
        if facts < 2:
            raise PosbiasError(f"kv-lookup needs at least 2 facts, got {facts}", "use `facts=2` or more")
        if not 2 <= digits <= 12:
            raise PosbiasError(f"kv-lookup digits must be 2..12, got {digits}", "use `digits` between 2 and 12")
        if facts > 9 * 10 ** (digits - 1) // 2:
            raise PosbiasError(f"{facts} facts cannot have distinct {digits}-digit codes", "use more `digits`")
        self.facts, self.digits = facts, digits

    def config(self) -> dict:
        return {**super().config(), "facts": self.facts, "digits": self.digits}

    def _example(self, index: int) -> KVFacts:
        rng = random.Random(f"kv-lookup/{self.facts}/{self.digits}/{index}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        numbers: list[int] = []
        seen: set[int] = set()
        while len(numbers) < 2 * self.facts:  # keys and values all distinct
            x = rng.randint(lo, hi)
            if x not in seen:
                seen.add(x)
                numbers.append(x)
        pairs = tuple((str(numbers[2 * i]), str(numbers[2 * i + 1])) for i in range(self.facts))
        return KVFacts(id=f"kv{index}", pairs=pairs, gold=rng.randrange(self.facts))

    def items(self, ex: KVFacts, position: int) -> list[str]:
        return [f"The code for {k} is {v}." for k, v in move(list(ex.pairs), ex.gold, position)]

    def build(self, ex: KVFacts, position: int) -> Prompt:
        key, value = ex.pairs[ex.gold]
        facts = "\n".join(self.items(ex, position))
        user = (
            "Below is a list of facts. Read them carefully and answer the question.\n\n"
            f"{facts}\n\nQuestion: What is the code for {key}? Reply with the code only."
        )
        return Prompt(ex.id, position, user, f"The code for {key} is", (value,))
