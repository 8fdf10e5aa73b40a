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
             another example with its own haystack window (a repeated id gets its line number: `sf-line2`)
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

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.metrics import normalize_answer
from ..data import data_file
from ..errors import PosbiasError, shown
from .base import Prompt, Task, file_stamp, read_jsonl
from .depths import allowed, apart, ends_sentence, joined, nearest, shared, shared_problem
from .text import content_words, haystack_stream, nq_passages, sentences, text_files

SLOTS = 1001  # slot k = depth k/10 percent
RULER_TOKENS = 128  # RULER's niah tasks generate up to 128 tokens (scripts/data/synthetic/constants.py)
DEPTHS = ",".join(f"{d}%" for d in range(0, 101, 10))
NQ_FILES = ("nq-open-20docs-gold_at_0.jsonl.gz", "nq-open-oracle.jsonl.gz")  # the haystack's passages; [1]: needles
NEEDLES, CONTEXTS, OVERLAPS = ("kv", "nq", "nq-sentence"), ("full", "needle", "none"), ("any", "none")
# RULER's niah template (Hsieh et al. 2024, App. B), the answer prefix as its own prompt ends
KV_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.")
QA_INTRO = "Write a high-quality answer for the given question using only the provided text."
_ADJ = ("amber ancient bitter brave bright calm clever cold curious daring eager early fancy fierce gentle giant "
        "golden hollow humble icy jolly lively lonely loud lucky mellow misty noble odd proud quiet rapid rare "
        "rough rusty silent silver smooth steady sturdy swift tender tidy vivid wild witty young").split()
_NOUN = ("anchor badger basket beacon canyon castle cedar comet compass crystal dolphin ember falcon feather forest "
         "garden glacier harbor helmet island jacket kettle lantern meadow mirror monkey needle orchard otter "
         "painter pebble pillow quarry rabbit river saddle shadow spider temple thunder tunnel valley violin "
         "walnut window").split()


@dataclass(frozen=True)
class Needle:
    text: str  # what is placed, one unit between two haystack sentences
    role: str  # gold | distractor | value | query
    answer: str = ""  # the value it carries (kv), "" for a passage


@dataclass(frozen=True)
class NiahExample:
    id: str
    index: int  # seeds the haystack's order and the other needles' depths
    needles: tuple[Needle, ...]  # [0] moves with the depth
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    avoid: tuple[str, ...]  # normalised strings no haystack sentence may hold (the key, every answer)
    source: str = ""  # where it came from, for a refusal: "FILE:LINE (id X)", or "needle=nq"


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
        if overlap not in OVERLAPS or context not in CONTEXTS:
            raise PosbiasError(f"niah overlap={overlap} / context={context} is not known",
                               f"use overlap = {' | '.join(OVERLAPS)} and context = {' | '.join(CONTEXTS)}")
        if overlap == "none" and needle == "kv":
            raise PosbiasError("a kv needle names its key, which the question asks for: it always overlaps",
                               "use `needle=nq-sentence` (or your own JSONL) with `overlap=none`")
        if tokens < 64:
            raise PosbiasError(f"niah `tokens` must be at least 64, got {tokens}", "use e.g. `tokens=2048`")
        if answer_prefix and needle == "kv":
            raise PosbiasError("a kv needle has RULER's answer prefix already", "drop `answer_prefix`")
        self.tokens, self.needle, self.haystack = tokens, needle, haystack
        self.answer_prefix = (answer_prefix or "").rstrip(" ") or None
        self.keys, self.values, self.queries, self.overlap, self.context = keys, values, queries, overlap, context
        nq = needle in ("nq", "nq-sentence") or (haystack == "nq" and context == "full")
        self._nq = tuple(data_file("nq", f"nq/{f}", data_dir) for f in NQ_FILES) if nq else ()
        files = (needle if needle not in NEEDLES else None, haystack if haystack != "nq" and context == "full" else None)
        self.inputs = (*self._nq, *(Path(p) for p in files if p))
        self.multi = values > 1 or queries > 1
        self.metric = "ruler_all" if self.multi else "substring" if needle == "kv" else "best_subspan_em"
        self.max_new_tokens = max(RULER_TOKENS, 12 * values * queries) if needle == "kv" else 24
        self.multiline = self.multi  # several values: RULER reads the whole answer, a list over lines included
        self._records = None if needle == "kv" else self._read_needles()
        # a needle without an answer prefix: the free reply is scored (check_engine)
        self._bare = next((ex for ex in self._records or () if not ex.answer_prefix), None)
        self.default_engine = "generate" if self.multi or self._bare else "teacher-forced"
        self._count: Callable | None = None  # (prompt_tokens(Prompt), text_tokens(list[str])) once bound
        self._fits: dict = {}
        self._asked: list[int] = []  # the slots `placements` resolved last: checked to land on distinct boundaries
        self._checked: set = set()  # (example index, tokens) whose asked slots were checked

    # -- the Task interface --------------------------------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        return SLOTS if self.context == "full" else 1

    @property
    def pool_size(self) -> int | None:
        return None if self._records is None else len(self._records)

    def placements(self, spec):
        if self.context != "full":
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
        return self._kv(index) if self._records is None else self._records[index]

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

    def _kv(self, index: int) -> NiahExample:
        rng = random.Random(f"niah-kv/{self.keys}/{self.values}/{self.queries}/{index}")
        n_keys = max(self.keys, self.queries)
        names = rng.sample([f"{a}-{b}" for a in _ADJ for b in _NOUN], n_keys)
        nums = [str(x) for x in rng.sample(range(10**6, 10**7), n_keys * self.values)]
        sent = "One of the special magic numbers for {} is: {}."
        if self.values > 1:  # multi-value: one key, every value asked
            needles = tuple(Needle(sent.format(names[0], v), "gold" if i == 0 else "value", v)
                            for i, v in enumerate(nums))
            q = f"What are all the special magic numbers for {names[0]} mentioned in the provided text?"
            prefix, answers = f"The special magic numbers for {names[0]} mentioned in the provided text are", nums
        elif self.queries > 1:  # multi-query: several keys, each asked
            needles = tuple(Needle(sent.format(k, v), "gold" if i == 0 else "query", v)
                            for i, (k, v) in enumerate(zip(names, nums)))
            asked = ", ".join(names[:-1]) + f" and {names[-1]}"
            q = f"What are all the special magic numbers for {asked} mentioned in the provided text?"
            prefix, answers = f"The special magic numbers for {asked} mentioned in the provided text are", nums
        else:  # single, or multi-key: distractor needles with other keys
            needles = tuple(Needle(sent.format(k, v), "gold" if i == 0 else "distractor", v)
                            for i, (k, v) in enumerate(zip(names, nums)))
            q = f"What is the special magic number for {names[0]} mentioned in the provided text?"
            prefix, answers = f"The special magic number for {names[0]} mentioned in the provided text is", nums[:1]
        avoid = tuple(normalize_answer(s) for s in (*names, *nums))
        return NiahExample(f"niah{index}", index, needles, q, prefix, tuple(answers), avoid)

    def _read_needles(self) -> list[NiahExample]:
        if self.needle in ("nq", "nq-sentence"):
            path = self._nq[1]
            recs = [(f"nq{i}", r["question"], r["answers"], f"{r['ctxs'][0]['title']}. {r['ctxs'][0]['text']}", "",
                     f"`needle={self.needle}`") for i, (_, r) in enumerate(read_jsonl(path))]
        else:
            recs = _needle_lines(self.needle)
        out, overlapping = [], 0
        for rid, q, ans, text, prefix, source in recs:
            if self.needle == "nq-sentence":  # the passage's sentences that hold an answer (none: left out)
                norm = [normalize_answer(a) for a in ans]
                text = " ".join(s for s in sentences(text) if any(a and a in normalize_answer(s) for a in norm))
                if not text:
                    continue
            if self.overlap == "none" and content_words(text) & content_words(q):
                overlapping += 1
                continue
            avoid = tuple(a for a in (normalize_answer(x) for x in ans) if a)
            out.append(NiahExample(rid, len(out), (Needle(text, "gold", ans[0]),), q, prefix or self.answer_prefix or "",
                                   tuple(ans), avoid, source))
        if not out and overlapping:
            raise PosbiasError(f"every needle of {self.needle} shares a content word with its question (overlap=none)",
                               "use `overlap=any`, or a needle file whose needles share no word with their questions")
        if not out:  # nq-sentence: no passage has a sentence holding one of its answers
            raise PosbiasError(f"no passage of {self.needle} has a sentence holding one of its answers",
                               "use `needle=nq` (the whole passage)")
        return out

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
        return haystack_stream(units, passages, random.Random(f"niah-haystack/{self.haystack}/{ex.index}"), ex.avoid)

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


def _needle_lines(path: str) -> list[tuple]:
    """A user's needle file, every field checked (a refusal names the line and its id): (id, question, answers,
    needle, answer prefix, where) per line; an id seen on an earlier line gets its own line number appended."""
    out, seen = [], set()
    for line, r in read_jsonl(path):
        where = f"{path}:{line}" + (f" (id {r['id']})" if "id" in r else "")
        if not (isinstance(r.get("needle"), str) and isinstance(r.get("question"), str) and "answers" in r):
            raise PosbiasError(f"{where}: a needle line needs \"needle\" (text), \"question\" (text) and \"answers\" "
                               "(a list of strings)", "fix that line, or use `needle=kv` or `needle=nq`")
        ans = [r["answers"]] if isinstance(r["answers"], str) else r["answers"]
        if not (isinstance(ans, list) and ans and all(isinstance(a, str) and a.strip() for a in ans)):
            raise PosbiasError(f"{where}: \"answers\" must be a list of non-empty strings, got {shown(r['answers'])}",
                               'write answers as strings, e.g. "answers": ["5521"]')
        text, prefix = " ".join(r["needle"].split()), r.get("answer_prefix") or ""
        if not text or not r["question"].strip():
            empty = "needle" if not text else "question"
            raise PosbiasError(f"{where}: the line's \"{empty}\" is empty", f"write the {empty}'s text on that line, "
                               "or remove the line")
        if not isinstance(prefix, str):
            raise PosbiasError(f"{where}: \"answer_prefix\" must be text, got {shown(prefix)}",
                               'write it as a string, e.g. "answer_prefix": "The answer is"')
        rid = str(r.get("id", f"line{line}"))
        rid = f"{rid}-line{line}" if rid in seen else rid
        if rid in seen:
            raise PosbiasError(f"{where}: id {rid} is given twice", "give every line its own id")
        seen.add(rid)
        out.append((rid, r["question"], ans, text, prefix.rstrip(" "), where))
    if not out:
        raise PosbiasError(f"needle file {path} holds no line", 'add one JSON object per line: {"needle": ..., '
                           '"question": ..., "answers": [...]}')
    return out

