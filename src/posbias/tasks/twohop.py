"""Two-hop reasoning tasks: a first-hop and a second-hop item at slots (i, j), everything else fixed.

Pos2Distill Sec. 3 / 4.3 and Appendix B: the bias of in-context reasoning depends on where each hop
sits, their distance and their order (placements and modes: tasks/placement.py). The prompt is the
paper's reasoning template (Table 7, verbatim); the answer is scored by exact match on the text
after the last "The answer is:" (Appendix C), with the retrieval-style substring score alongside.

  musique     MuSiQue-Ans 2-hop questions from the musique data set: 20 paragraphs, the two supporting
              ones in hop order (question_decomposition[k].paragraph_support_idx)
  kv-2hop     a generated chain lookup: "The code for A is B." ... "The code for B is C." among
              distractor facts, asked for the code for the code for A
  jsonl:PATH  the user's own data with "gold": [i, j] (hop order; see JSONL_SCHEMA)

prompt="coc" swaps the instruction for a Chain-of-Citation one (Li et al. 2024b: cite the document
behind every step), the paper's no-training baseline; the wording is ours, as the paper gives none.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from ..data import data_file
from ..errors import PosbiasError
from .base import Doc, FactsTask, Prompt, RecordsTask, Task, read_jsonl
from .placement import positions_spec, resolve_pairs

REASONING = ("Let's first identify the relevant information from the long context and list it. Then, carry out "
             "step-by-step reasoning based on that information, and finally, provide the answer. The final answer "
             "must end with \"The answer is:\".")  # Table 7
COC = ("Let's first identify the relevant information from the long context and list it, citing the number of the "
       "document each piece comes from, e.g. [3]. Then, carry out step-by-step reasoning based on that information, "
       "citing the documents for every step, and finally, provide the answer. The final answer must end with "
       "\"The answer is:\".")
PROMPTS = {"reasoning": REASONING, "coc": COC}


def move2(items: list, a: int, b: int, i: int, j: int) -> list:
    """items with items[a] moved to slot i and items[b] to slot j; the others keep their order."""
    rest = [x for k, x in enumerate(items) if k not in (a, b)]
    out, it = [], iter(rest)
    for slot in range(len(items)):
        out.append(items[a] if slot == i else items[b] if slot == j else next(it))
    return out


def _check_prompt(prompt: str) -> str:
    if prompt not in PROMPTS:
        raise PosbiasError(f"unknown `prompt` {prompt!r}", f"use one of {', '.join(PROMPTS)}")
    return prompt


class TwoHop(Task):
    """A task whose examples place two items; placements are pairs (first hop, second hop)."""

    n_gold = 2
    default_positions = "connected,disconnected,reversed"

    def placements(self, spec: str | list | None) -> list[tuple[int, int]]:
        spec = positions_spec(spec)
        default = self.default_positions if self.n_slots > 2 else "all"  # two slots: (0, 1) and (1, 0), no gap
        return resolve_pairs(default if spec is None else spec, self.n_slots)

    def advantageous(self) -> tuple[int, int]:
        """The recent placement: the last two slots in order (the paper's 1-based (n-1, n), Sec. 4.3)."""
        return (self.n_slots - 2, self.n_slots - 1)

    def all_placements(self) -> list[tuple[int, int]]:
        """Every ordered pair of distinct slots."""
        n = self.n_slots
        return [(i, j) for i in range(n) for j in range(n) if i != j]


@dataclass(frozen=True)
class HopExample:
    id: str
    question: str
    answers: tuple[str, ...]
    docs: tuple[Doc, ...]  # position-free order
    hops: tuple[int, int]  # indices of the first-hop and second-hop documents


class TwoHopQA(TwoHop, RecordsTask):
    """Multi-document two-hop QA with a chain-of-thought answer."""

    metric = "reasoning_em"
    also = ("subspan",)
    default_engine = "generate"
    multiline = True
    max_new_tokens = 256
    documents = True

    def __init__(self, name: str, records: list[HopExample], n_docs: int, prompt: str = "reasoning"):
        # the instruction's name is `style`: `prompt` is the Task method that builds a row's Prompt (a `self.prompt`
        # attribute hid it, and every sweep of this class crashed)
        self.name, self._records, self._n_slots, self.style = name, records, n_docs, _check_prompt(prompt)

    def config(self) -> dict:
        return {**super().config(), "docs": self._n_slots, "prompt": self.style}

    def gold_target(self, prompt: Prompt) -> str:
        return f"The answer is: {prompt.answers[0]}"

    def items(self, ex: HopExample, position: tuple[int, int]) -> list[str]:
        docs = move2(list(ex.docs), *ex.hops, *position)
        return [f"Document [{k + 1}](Title: {d.title}) {d.text}" for k, d in enumerate(docs)]

    def build(self, ex: HopExample, position: tuple[int, int]) -> Prompt:
        listing = "\n".join(self.items(ex, position))
        user = f"{PROMPTS[self.style]}\n\n{listing}\n\nQuestion: {ex.question}\nAnswer:"
        return Prompt(ex.id, tuple(position), user, "", ex.answers)


def musique_task(data_dir: str | Path | None = None, docs: int = 20, prompt: str = "reasoning") -> TwoHopQA:
    """The musique data set's 2-hop file: 260 questions, 20 paragraphs each.

    docs: 20 paragraphs, or 10 (the two supporting ones and the first 8 others, in file order: prompts half as long,
      for a CPU budget)
    prompt: reasoning (the paper's template) | coc (Chain-of-Citation)
    """
    if docs not in (10, 20):
        raise PosbiasError(f"musique has 20 paragraphs (or a cut to 10), not {docs}", "use `docs=20` or `docs=10`")
    path = data_file("musique", "musique/musique_2hop_answerable.jsonl.gz", data_dir)
    records = [_cut(_musique_record(f"{path}:{lineno}", r), docs) for lineno, r in read_jsonl(path)]
    task = TwoHopQA("musique", records, docs, prompt)
    task.inputs = (path,)
    return task


def _cut(ex: HopExample, docs: int) -> HopExample:
    """The two hops and the first docs-2 other paragraphs, the hops first (position-free order)."""
    if docs == len(ex.docs):
        return ex
    others = [d for k, d in enumerate(ex.docs) if k not in ex.hops][: docs - 2]
    return HopExample(ex.id, ex.question, ex.answers, (ex.docs[ex.hops[0]], ex.docs[ex.hops[1]], *others), (0, 1))


def _musique_record(where: str, r: dict) -> HopExample:
    try:
        paras = r["paragraphs"]
        docs = tuple(Doc(str(p["title"]), str(p["paragraph_text"])) for p in sorted(paras, key=lambda p: p["idx"]))
        by_idx = {p["idx"]: k for k, p in enumerate(sorted(paras, key=lambda p: p["idx"]))}
        hops = tuple(by_idx[step["paragraph_support_idx"]] for step in r["question_decomposition"])
        answers = (str(r["answer"]), *(str(a) for a in r.get("answer_aliases") or []))
        question = str(r["question"])
    except (KeyError, TypeError) as e:
        raise PosbiasError(f"{where}: not a MuSiQue 2-hop record ({e})", "use the musique data set's file") from None
    if len(hops) != 2 or hops[0] == hops[1] or len(docs) != 20:
        raise PosbiasError(f"{where}: needs 20 paragraphs and two distinct supporting ones", "use the musique data set's file")
    return HopExample(str(r.get("id", where)), question, answers, docs, hops)


@dataclass(frozen=True)
class KVChain:
    id: str
    pairs: tuple[tuple[str, str], ...]  # position-free order; pairs[0] = (A, B), pairs[1] = (B, C)
    hops: tuple[int, int] = (0, 1)


class KV2Hop(TwoHop, FactsTask):
    """Chain lookup. style "direct" (the default): the answer prefix "The code for the code for A is",
    teacher-forced like kv-lookup; style "cot": the reasoning prompt, a generated chain of thought, EM after
    "The answer is:". Direct is the default because SmolLM2-135M cannot write the chain: with cot it restates
    one fact and never "The answer is:" (EM 0.017 on 120 rows, measured; docs/pos2distill.md), while direct
    leaves it off the floor (0.34 at the best placement 8:9 with 10 facts of 4 digits, held-out examples 0-49).

    facts: the number of facts, the two hops among them
    digits: digits per key and value, 2 to 12
    style: direct (the answer teacher-forced after "The code for the code for A is") | cot (a chain of thought,
      generated; exact match after "The answer is:")
    """

    name = "kv-2hop"

    def __init__(self, facts: int = 10, digits: int = 4, style: str = "direct"):
        if facts < 2:
            raise PosbiasError(f"kv-2hop needs at least 2 facts (the two hops), got {facts}", "use `facts=2` or more")
        if not 2 <= digits <= 12 or facts + 1 > 9 * 10 ** (digits - 1) // 2:
            raise PosbiasError(f"{facts} facts cannot have distinct {digits}-digit codes", "use more `digits` (2..12)")
        if style not in ("cot", "direct"):
            raise PosbiasError(f"unknown kv-2hop `style` {style!r}", "use cot or direct")
        self.facts, self.digits, self.style = facts, digits, style
        cot = style == "cot"
        self.metric, self.default_engine = ("reasoning_em", "generate") if cot else ("substring", "teacher-forced")
        self.also, self.multiline, self.max_new_tokens = (("subspan",), True, 128) if cot else ((), False, 12)

    def config(self) -> dict:
        return {**super().config(), "facts": self.facts, "digits": self.digits, "style": self.style}

    def gold_target(self, prompt: Prompt) -> str:
        return f"The answer is: {prompt.answers[0]}" if self.style == "cot" else prompt.answers[0]

    def _example(self, index: int) -> KVChain:
        rng = random.Random(f"kv-2hop/{self.facts}/{self.digits}/{index}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        codes: list[int] = []
        while len(codes) < 2 * self.facts + 1:  # A, B, C and a key and a value per distractor, all distinct
            x = rng.randint(lo, hi)
            if x not in codes:
                codes.append(x)
        a, b, c, *rest = map(str, codes)
        distractors = [(rest[2 * k], rest[2 * k + 1]) for k in range(self.facts - 2)]
        return KVChain(f"kv2h{index}", ((a, b), (b, c), *distractors))

    def items(self, ex: KVChain, position: tuple[int, int]) -> list[str]:
        return [f"The code for {k} is {v}." for k, v in move2(list(ex.pairs), *ex.hops, *position)]

    def build(self, ex: KVChain, position: tuple[int, int]) -> Prompt:
        start, answer = ex.pairs[0][0], ex.pairs[1][1]
        facts = "\n".join(self.items(ex, position))
        question = f"Question: What is the code for the code for {start}?"
        if self.style == "direct":
            user = f"Below is a list of facts. Read them carefully and answer the question.\n\n{facts}\n\n{question} " \
                   "Reply with the code only."
            return Prompt(ex.id, tuple(position), user, f"The code for the code for {start} is", (answer,))
        user = f"{REASONING}\n\n{facts}\n\n{question}\nAnswer:"
        return Prompt(ex.id, tuple(position), user, "", (answer,))
