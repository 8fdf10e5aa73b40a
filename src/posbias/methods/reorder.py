"""Reordering, what RAG engineers do today: move the items a relevance signal ranks highest to where the model reads
best. The model is not changed; the prompt is (tasks/arrange.py: the bodies move, a slot's "Document [i]" label
stays). Each row is still reported at the slot the task gave its gold; the relevance signal decides where it goes.

  reorder[:SIGNAL][:RULE]   SIGNAL (what ranks the items):
                              bm25       a lexical retriever: BM25 (rank_bm25's Okapi) of each item against the
                                         prompt with the items cut out (the instruction and the question)
                              oracle     the gold item first in the ranking, the rest in prompt order: the upper bound
                              attention  the attention each item receives from the last prompt token (per token,
                                         averaged over every layer and head, as Found-in-the-Middle's Sec. 2.1 defines it)
                            RULE (where the ranking goes; default litm):
                              litm       LangChain's LongContextReorder: the ranking written from both ends inward
                                         (the best at one end, the second at the other; which end gets the best
                                         depends on the parity of the item count, as in LangChain)
                              first      the most relevant first (the "primacy" order)
                              last       the most relevant last, next to the question (attention sorting's rule)
  attnsort[:ROUNDS]         attention sorting (Peysakhovich & Lerer 2023): one decoding step, sort the items by the
                            attention they receive, most attended last, repeat ROUNDS times (default 1, i.e. 2
                            prefills per row: ROUNDS measurements, then the answer)
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Callable, Iterator

from ..errors import PosbiasError
from ..models.load import Loaded
from ..tasks import Prompt, Task
from ..tasks.arrange import arrange
from .base import Active, Method, refuse_without_items
from .registry import register_method

SIGNALS = ("bm25", "oracle", "attention")
RULES = ("litm", "first", "last")


def ranking(scores: list[float]) -> list[int]:
    """Slots from the most to the least relevant (ties: prompt order)."""
    return sorted(range(len(scores)), key=lambda s: (-scores[s], s))


def litm(ranked: list[int]) -> list[int]:
    """LangChain's LongContextReorder on a best-first list: reversed, then every other one to the front or back."""
    out: list[int] = []
    for i, s in enumerate(reversed(ranked)):
        if i % 2 == 1:
            out.append(s)
        else:
            out.insert(0, s)
    return out


def place(scores: list[float], rule: str) -> list[int]:
    """order[s] = the slot whose item goes to slot s."""
    ranked = ranking(scores)
    return litm(ranked) if rule == "litm" else ranked if rule == "first" else ranked[::-1]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_scores(prompt: Prompt) -> list[float]:
    """BM25 (Okapi, rank_bm25's defaults) of each item, the query being the prompt text outside the items."""
    from rank_bm25 import BM25Okapi

    query = prompt.user
    for item in prompt.items:
        query = query.replace(item, " ", 1)
    return [float(x) for x in BM25Okapi([_words(t) for t in prompt.items]).get_scores(_words(query))]


def oracle_scores(prompt: Prompt) -> list[float]:
    if not isinstance(prompt.position, int):
        raise PosbiasError("the oracle signal ranks one gold item; a two-hop placement has two",
                           "use reorder:bm25 or reorder:attention on a two-hop task")
    return [1.0 if s == prompt.position else 0.0 for s in range(len(prompt.items))]


@register_method
class Reorder(Method):
    """Rearranges each prompt's items by a relevance signal; the model runs as it is."""

    name = "reorder"
    usage = "reorder[:bm25|oracle|attention][:litm|first|last]"
    changes_model = False
    prefix_safe = True  # the unmodified model on rewritten prompts
    rearranges = True

    def __init__(self, signal: str = "bm25", rule: str = "litm", rounds: int = 1):
        if signal not in SIGNALS:
            raise PosbiasError(f"unknown relevance signal {signal!r}", f"write reorder:{'|'.join(SIGNALS)}")
        if rule not in RULES:
            raise PosbiasError(f"unknown reordering rule {rule!r}", f"write reorder:{signal}:{'|'.join(RULES)}")
        if rounds < 1:
            raise PosbiasError(f"reordering needs at least one round, got {rounds}", "write attnsort or attnsort:2")
        self.signal, self.rule, self.rounds = signal, rule, rounds
        self.reads_attention = signal == "attention"

    @classmethod
    def from_spec(cls, arg: str) -> "Reorder":
        parts = [p for p in arg.split(":") if p] if arg else []
        signal = parts.pop(0) if parts and parts[0] in SIGNALS else "bm25"
        rule = parts.pop(0) if parts and parts[0] in RULES else "litm"
        if parts:
            raise PosbiasError(f"bad reorder spec {arg!r}", f"write it as {cls.spec_forms()}, e.g. reorder:bm25:first")
        return cls(signal, rule)

    @property
    def label(self) -> str:
        return f"reorder:{self.signal}:{self.rule}"

    def config(self) -> dict:
        return {"name": self.name, "signal": self.signal, "rule": self.rule, "rounds": self.rounds}

    def check(self, loaded: Loaded) -> None:
        return  # any model; the items are checked when the prompts are rearranged

    def check_task(self, task: Task, positions: list, engine: str) -> None:
        refuse_without_items(self, task)
        if task.order:  # the candidates' order is what an order task measures, slot by slot
            raise PosbiasError(f"{self.label} moves items between slots, and {task.name} already shows every order of "
                               "its candidates", "use swap or pride on an order task")
        if self.signal == "oracle" and task.n_gold != 1:
            raise PosbiasError("the oracle signal ranks one gold item; a two-hop placement has two",
                               "use reorder:bm25 or reorder:attention on a two-hop task")

    def rearrange(self, prompts: list[Prompt], task: Task, attention: Callable | None) -> list[Prompt]:
        if self.signal == "attention" and attention is None:
            raise PosbiasError(f"{self.label} reads the model's attention, which this backend does not give",
                               "load the model in process, or use reorder:bm25")
        out = list(prompts)
        for _ in range(self.rounds if self.signal == "attention" else 1):
            scores = (attention(out) if self.signal == "attention"
                      else [bm25_scores(p) if self.signal == "bm25" else oracle_scores(p) for p in out])
            out = [arrange(p, self.place(s), task.slot_label) for p, s in zip(out, scores)]
        return out

    def place(self, scores: list[float]) -> list[int]:
        """order[s] = the slot whose item goes to slot s, by this method's rule."""
        return place(scores, self.rule)

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        yield Active()


@register_method
class AttentionSort(Reorder):
    """Attention sorting (Peysakhovich & Lerer 2023): sort by the attention received, most attended last, repeat."""

    name = "attnsort"
    usage = "attnsort[:ROUNDS]"

    def __init__(self, rounds: int = 1):
        super().__init__("attention", "last", rounds)

    @classmethod
    def from_spec(cls, arg: str) -> "AttentionSort":
        try:
            return cls(int(arg) if arg else 1)
        except ValueError:
            raise PosbiasError(f"bad attnsort spec {arg!r}", "write attnsort or attnsort:ROUNDS, e.g. attnsort:2") from None

    @property
    def label(self) -> str:
        return f"attnsort:{self.rounds}"

    def config(self) -> dict:
        return {"name": self.name, "rounds": self.rounds}
