"""niah: a needle in a natural haystack, the context's length counted in the model's own tokens.

The long-context tests users compare with (needle in a haystack; RULER, Hsieh et al. 2024; NoLiMa, Modarressi et
al. 2025) put a needle at a depth percent of a context of T tokens of natural text. Here:

  tokens     the prompt's length in the model's own tokens after its template (the Scorer binds the counter:
             Task.bind_tokens); the haystack is filled sentence by sentence up to it, never over at depth 0% or
             100%, and every row records its true count (prompt_tokens) and its needles' true depths
  depth      slot k = depth k/10 % (1001 slots, so `positions=50%` is slot 500): the needle goes to the boundary
             after a sentence's end whose token offset in the haystack is nearest to that percent of its tokens
             (tasks/depths.py: never after a title, a colon or a dash; asked depths that land on one boundary are
             refused when the prompts are built, before any row is scored)
  haystack   `nq`: the Wikipedia passages of the nq data set (both files, ~9,000 passages, ~1.3M tokens) in a
             seeded order per example; or PATH: a text file or a folder of .txt / .md files, read from a seeded
             sentence offset (wrapping round): where a file starts, and where a one-file haystack wraps round to its
             title page, a paragraph break (a blank line) marks the seam. Sentences holding the needle's key or an
             answer are dropped.
  needle     `kv`: RULER's "One of the special magic numbers for {key} is: {value}."; `nq`: an NQ-open gold
             passage with its question; `nq-sentence`: the sentences of that passage that hold an answer; or PATH:
             your own JSONL, one {"needle": str, "question": str, "answers": [str, ...]} per line (optional "id",
             and "answer_prefix": the text the reply starts with, which teacher forcing needs); a repeated line is
             another example with its own haystack window (a repeated id gets its line number: `sf-line2`); each
             built or read in tasks/needles.py
  answer_prefix   the reply's start for needles without their own (nq, nq-sentence, a file's lines without one); a
             needle with none is scored on the generated answer: its default engine is `generate`, and teacher
             forcing is refused (its first token would be scored against the first token of a free reply)
  keys, values, queries   RULER's multi-key (keys - 1 distractor needles of the same form), multi-value (one key,
             `values` numbers, all asked) and multi-query (`queries` keys asked, all to be answered): the first
             needle moves with the depth, the others sit at depths drawn from the seed, the same at every depth
  scoring    kv needles as RULER reads them (scripts/eval/synthetic/constants.py): a value counts when it occurs in
             the answer, case-insensitive, no punctuation stripped ("1,234,567" does not hold 1234567). Several asked
             values: `correct` is all-or-nothing (`ruler_all`); RULER's own score, the share found
             (`string_match_all`), is eval/longctx.py's partial credit. The generated answer may run to RULER's 128
             new tokens (12 per value when that is more); one asked value stops at its first newline as before,
             several are read past newlines (a list, one value a line), stopped by the end of the turn or the limit
  overlap    `any`, or `none`: keep only needles sharing no content word with the question (NoLiMa's idea; how it
             is checked: `content_words`)
  context    `full`; `needle` (the needles alone: the short-context reference) or `none` (closed book)
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Callable

from ..data import data_file
from ..errors import PosbiasError
from .base import Prompt, Task, file_stamp
from .depths import allowed, apart, ends_sentence, joined, nearest, shared, shared_problem
from .needles import NEEDLES, NiahExample, kv_example, read_needles
from .text import haystack_stream, nq_passages, text_files

SLOTS = 1001  # slot k = depth k/10 percent
RULER_TOKENS = 128  # RULER's niah tasks generate up to 128 tokens (scripts/data/synthetic/constants.py)
DEPTHS = ",".join(f"{d}%" for d in range(0, 101, 10))
NQ_FILES = ("nq-open-20docs-gold_at_0.jsonl.gz", "nq-open-oracle.jsonl.gz")  # the haystack's passages; [1]: needles
OVERLAPS = ("any", "none")
# RULER's niah template (Hsieh et al. 2024, App. B), the answer prefix as its own prompt ends
KV_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.")
QA_INTRO = "Write a high-quality answer for the given question using only the provided text."

class Haystack(Task):
    """A needle (or several) at a depth percent of a natural haystack of `tokens` tokens (module docstring).

    tokens: the prompt's length in the model's tokens (a depth x length grid sets it)
    needle: kv (RULER's magic number) | nq (an NQ gold passage) | nq-sentence (its answer-bearing sentences) | PATH
      (a JSONL file of needle, question, answers: one example per line, repeat a line for more)
    haystack: nq (Wikipedia passages of the nq data set) | PATH (a text file or a folder of .txt/.md files)
    keys: needles of the same form, the gold one and keys-1 distractors (multi-key), 1 to 16
    values: values of the one key, all asked (multi-value; engine generate), 1 to 16
    queries: keys asked at once, all to be answered (multi-query; engine generate), 1 to 16
    overlap: any | none (only needles sharing no content word with the question, NoLiMa)
    context: full | needle (the needles alone) | none (closed book)
    answer_prefix: the text the reply starts with, for needles without their own "answer_prefix" (nq, nq-sentence,
      a file's lines); teacher forcing needs one (without: the answer is generated)
    """

    lists_items = False  # the needle's depth is a place in one text, not one of several items
    # `context`: the needles in the haystack, the needles alone, nothing (closed book); and the references a grid of
    # haystacks runs without one (eval/grid.py, eval/longctx.py): its folder OUT/ref-<name> -> the `context` it runs
    contexts = ("full", "needle", "none")
    references = {"closed": "none", "needle": "needle"}

    name = "niah"
    default_positions = DEPTHS
    documents = True
    shrink = "fewer `tokens` (grid: shorter `sizes` or a lower `fill`)"

    def __init__(self, tokens: int = 2048, needle: str = "kv", haystack: str = "nq", keys: int = 1, values: int = 1,
                 queries: int = 1, overlap: str = "any", context: str = "full", answer_prefix: str | None = None,
                 data_dir: str | None = None):
        for k, v in (("keys", keys), ("values", values), ("queries", queries)):
            if not 1 <= v <= 16:
                raise PosbiasError(f"niah `{k}` must be 1..16, got {v}", f"use `{k}=1` (one needle) up to 16")
        if sum(v > 1 for v in (keys, values, queries)) > 1:
            raise PosbiasError("niah takes one of multi-key, multi-value and multi-query at a time",
                               "set only one of `keys`, `values`, `queries` above 1")
        if (values > 1 or queries > 1) and needle not in ("kv",):
            raise PosbiasError(f"multi-value and multi-query needles are kv needles, not {needle}", "use `needle=kv`")
        if overlap not in OVERLAPS or context not in self.contexts:
            raise PosbiasError(f"niah overlap={overlap} / context={context} is not known",
                               f"use overlap = {' | '.join(OVERLAPS)} and context = {' | '.join(self.contexts)}")
        if overlap == "none" and needle == "kv":
            raise PosbiasError("a kv needle names its key, which the question asks for: it always overlaps",
                               "use `needle=nq-sentence` (or your own JSONL) with `overlap=none`")
        if tokens < 64:
            raise PosbiasError(f"niah `tokens` must be at least 64, got {tokens}", "use e.g. `tokens=2048`")
        if answer_prefix and needle == "kv":
            raise PosbiasError("a kv needle has RULER's answer prefix already", "drop `answer_prefix`")
        self.tokens, self.needle, self.haystack = tokens, needle, haystack
        self._seed_of: tuple = (None, "")  # (the haystack's parsed text, its window seed): _window_seed
        self.answer_prefix = (answer_prefix or "").rstrip(" ") or None
        self.keys, self.values, self.queries, self.overlap, self.context = keys, values, queries, overlap, context
        nq = needle in ("nq", "nq-sentence") or (haystack == "nq" and self.has_haystack)
        self._nq = tuple(data_file("nq", f"nq/{f}", data_dir) for f in NQ_FILES) if nq else ()
        files = (needle if needle not in NEEDLES else None, haystack if haystack != "nq" and self.has_haystack else None)
        self.inputs = (*self._nq, *(Path(p) for p in files if p))
        self.multi = values > 1 or queries > 1
        self.metric = "ruler_all" if self.multi else "substring" if needle == "kv" else "best_subspan_em"
        self.max_new_tokens = max(RULER_TOKENS, 12 * values * queries) if needle == "kv" else 24
        self.multiline = self.multi  # several values: RULER reads the whole answer, a list over lines included
        self._records = None if needle == "kv" else read_needles(needle, self._nq[1] if self._nq else None, overlap,
                                                                 self.answer_prefix)
        # a needle without an answer prefix: the free reply is scored (check_engine)
        self._bare = next((ex for ex in self._records or () if not ex.answer_prefix), None)
        self.default_engine = "generate" if self.multi or self._bare else "teacher-forced"
        self._count: Callable | None = None  # (prompt_tokens(Prompt), text_tokens(list[str])) once bound
        self._fits: dict = {}
        self._asked: list[int] = []  # the slots `placements` resolved last: checked to land on distinct boundaries
        self._checked: set = set()  # (example index, tokens) whose asked slots were checked

    @property
    def has_haystack(self) -> bool:
        """The needles sit at depths of a haystack (`context=full`), not alone or absent."""
        return self.context == "full"

    # -- the Task interface --------------------------------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        return SLOTS if self.has_haystack else 1

    @property
    def pool_size(self) -> int | None:
        return None if self._records is None else len(self._records)

    def placements(self, spec):
        if not self.has_haystack:
            return [0]  # no haystack: the needles (or nothing) have one place
        self._asked = super().placements(spec)
        return self._asked

    def depth_clash(self, ex: NiahExample, slots: list[int], tokens: int | None = None) -> dict | None:
        """Two of `slots` that land on one boundary of the example's haystack (at `tokens`, default the task's), or
        None (tasks/depths.py `shared`)."""
        _, offsets, _, bounds = self._fit(ex, tokens or self.tokens)
        return shared(offsets, bounds, slots)

    def check_engine(self, engine: str) -> None:
        if self.multi and engine == "teacher-forced":
            raise PosbiasError("multi-value and multi-query needles are scored on the generated answer (every value "
                               "in it)", "use `engine=generate`")
        if self._bare is not None and engine == "teacher-forced":
            line = "" if self.needle in NEEDLES else " (or an \"answer_prefix\" on each line of the file)"
            raise PosbiasError(f"{self._bare.source}: the needle has no answer prefix, so teacher forcing would score "
                               "the answer's first token against the first token of a free reply",
                               f"give an answer prefix with `answer_prefix=TEXT`{line}, or use `engine=generate`")

    def generation_limit(self, count_tokens) -> tuple[int, str | None]:
        """kv and NQ needles: the fixed limit. A needle file: that much room beyond its longest answer, since a reply
        restates the question first ("The best thing to do in San Francisco is ...")."""
        if self.needle in NEEDLES:
            return self.max_new_tokens, None
        longest = max(count_tokens(a) for ex in self._records for a in ex.answers)
        return self.max_new_tokens + longest, f"{self.max_new_tokens} + the file's longest answer ({longest} tokens)"

    def examples(self, n: int, seed: int = 0, skip: int = 0) -> list:
        try:
            return super().examples(n, seed, skip)
        except PosbiasError as e:
            if self.needle in NEEDLES:
                raise
            raise PosbiasError(e.problem, f"{e.fix}, or repeat lines in {self.needle} until it holds {skip + n} (each "
                               "line gets its own seeded haystack window)") from None

    def bind_tokens(self, prompt_tokens: Callable[[Prompt], int] | None, text_tokens: Callable | None) -> None:
        self._count = None if prompt_tokens is None else (prompt_tokens, text_tokens)
        self._fits, self._checked = {}, set()

    def config(self) -> dict:
        return {**super().config(), "tokens": self.tokens, "needle": self.needle, "haystack": self.haystack,
                "keys": self.keys, "values": self.values, "queries": self.queries, "overlap": self.overlap,
                "context": self.context, **({"answer_prefix": self.answer_prefix} if self.answer_prefix else {})}

    def _example(self, index: int) -> NiahExample:
        if self._records is None:
            return kv_example(index, self.keys, self.values, self.queries)
        return self._records[index]

    def build(self, ex: NiahExample, position: int) -> Prompt:
        if self.context == "none":
            return self._prompt(ex, position, "", {})
        if self.context == "needle":
            return self._prompt(ex, position, " ".join(n.text for n in ex.needles), {})
        units, offsets, seams, bounds = self._fit(ex)
        if position in self._asked and (ex.index, self.tokens) not in self._checked:  # each depth on its own boundary
            if info := self.depth_clash(ex, self._asked):
                t = apart(self.tokens, info, lambda t: self.depth_clash(ex, self._asked, t))
                raise PosbiasError(shared_problem(ex.id, self.tokens, info), f"use a longer length (`tokens={t}` or "
                                   "more), depths further apart, or a haystack of shorter sentences")
            self._checked.add((ex.index, self.tokens))
        total = offsets[-1]
        at = [nearest(offsets, bounds, position / 10)] + self._others(ex, offsets, bounds)
        slots: dict[int, list[str]] = {}
        for i, b in enumerate(at):
            slots.setdefault(b, []).append(ex.needles[i].text)
        meta = {"needle_depths": [round(100 * offsets[b] / total, 2) for b in at],
                "needle_roles": [n.role for n in ex.needles], "haystack_tokens": total, "target_tokens": self.tokens}
        if self.multi or self.keys > 1:
            meta["needle_answers"] = [n.answer for n in ex.needles]
        return self._prompt(ex, position, joined(units, seams, slots), meta)

    # -- prompts --------------------------------------------------------------------------------------------------
    def _prompt(self, ex: NiahExample, position: int, context: str, meta: dict) -> Prompt:
        intro = KV_INTRO if self.needle == "kv" else QA_INTRO
        body = f"{intro}\n\n{context}\n\n" if context else f"{intro}\n\n"
        return Prompt(ex.id, position, body + ex.question, ex.answer_prefix, ex.answers, meta=meta)

    # -- the haystack ---------------------------------------------------------------------------------------------
    def _units(self) -> tuple[tuple, bool]:
        """(nq passages, True) to shuffle, or (a file's or folder's sentences file by file, False) to read in order."""
        if self.haystack == "nq":
            return nq_passages(tuple(map(str, self._nq)), tuple(file_stamp(p) for p in self._nq)), True
        p = Path(self.haystack)
        if not p.exists():
            raise PosbiasError(f"haystack '{p}' does not exist", "use `haystack=nq` or a text file / folder of .txt files")
        stamps = tuple(file_stamp(f) for f in sorted(p.rglob("*"))) if p.is_dir() else (file_stamp(p),)
        return text_files(str(p), stamps), False

    def _stream(self, ex: NiahExample):
        """The example's haystack sentences in order, each with whether a document starts there (tasks/text.py)."""
        units, passages = self._units()
        return haystack_stream(units, passages, random.Random(f"niah-haystack/{self._window_seed(units)}/{ex.index}"),
                               ex.avoid)

    def _window_seed(self, units: tuple) -> str:
        """What seeds the haystack windows: `nq` by its name; a file or folder by its sentences (SHA-256), so the same
        text gives the same windows wherever it lies and however its path is written (it was the path as given)."""
        if self.haystack == "nq":
            return "nq"
        if self._seed_of[0] is not units:  # the parsed text is cached: hash it once
            self._seed_of = (units, hashlib.sha256(json.dumps(units).encode()).hexdigest()[:16])
        return self._seed_of[1]

    def _fit(self, ex: NiahExample, tokens: int | None = None) -> tuple[list[str], list[int], set[int], list[int]]:
        """The haystack sentences that fill the prompt up to `tokens` (default the task's), their cumulative token
        offsets, the indices of those a paragraph break goes before (a file's start) and the boundaries a needle may
        take (tasks/depths.py)."""
        tokens = tokens or self.tokens
        if (ex.index, tokens) in self._fits:
            return self._fits[ex.index, tokens]
        if self._count is None:
            raise PosbiasError("niah measures its context in the model's tokens, and this model has no tokenizer",
                               "give the served model its tokenizer (`tokenizer=DIR` in the model spec)")
        prompt_len, text_len = self._count
        bare = self._prompt(ex, 0, " ".join(n.text for n in ex.needles), {})
        budget = tokens - prompt_len(bare)
        if budget <= 0:
            raise PosbiasError(f"`tokens={tokens}` is shorter than the needles and question alone "
                               f"({prompt_len(bare)} tokens)", f"use `tokens={2 * prompt_len(bare)}` or more")
        units, offsets, starts, stream = [], [0], set(), self._stream(ex)
        seam = "\n\n" if self.haystack != "nq" else " "  # a file's start: a paragraph break (nq passages: a space)
        while offsets[-1] < budget:
            chunk = [s for _, s in zip(range(64), stream)]
            if not chunk:
                raise PosbiasError(f"haystack '{self.haystack}' holds only {offsets[-1]} tokens, {budget} were needed",
                                   "use a larger haystack or fewer `tokens`")
            for (s, first), t in zip(chunk, text_len([(seam if first else " ") + s for s, first in chunk])):
                if offsets[-1] + t > budget:
                    break
                starts |= {len(units)} if first else set()
                units.append(s)
                offsets.append(offsets[-1] + t)
            else:
                continue
            break
        seams = starts if self.haystack != "nq" else set()  # nq passages join with a space, as they always have
        while units and (len(units) > 1 and not ends_sentence(units[-1])  # the haystack ends on a sentence's end
                         or max(prompt_len(self._at(ex, units, seams, b)) for b in (0, len(units))) > tokens):
            units.pop()  # token merges across joins: the edges' exact counts decide
            offsets.pop()
            starts.discard(len(units))
        if not units:
            need = prompt_len(bare)
            raise PosbiasError(f"`tokens={tokens}` leaves no room for a haystack sentence beside the needles and "
                               f"question of {ex.id} ({need} tokens)", f"use `tokens={2 * need}` or more")
        self._fits[ex.index, tokens] = (units, offsets, seams, allowed(units, starts))
        return self._fits[ex.index, tokens]

    def _at(self, ex: NiahExample, units: list[str], seams: set[int], b: int) -> Prompt:
        return self._prompt(ex, 0, joined(units, seams, {b: [n.text for n in ex.needles]}), {})

    def _others(self, ex: NiahExample, offsets: list[int], bounds: list[int]) -> list[int]:
        """The boundaries of needles 1.. (distractors, further values or keys): drawn from the seed, fixed."""
        rng = random.Random(f"niah-depths/{ex.index}")
        return [nearest(offsets, bounds, rng.uniform(0, 100)) for _ in ex.needles[1:]]
