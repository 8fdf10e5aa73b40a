"""niah's needles (tasks/haystack.py places them): RULER's kv needles drawn from a seed, NQ-open gold passages (or
their answer-bearing sentences), or a user's JSONL needle file; each an example with its question, answers and the
strings no haystack sentence may hold."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from ..core.metrics import normalize_answer
from ..errors import PosbiasError, shown
from .base import read_jsonl
from .text import content_words, sentences

NEEDLES = ("kv", "nq", "nq-sentence")  # the built-in needles; any other `needle` is a needle file's path
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


def kv_example(index: int, keys: int, values: int, queries: int) -> NiahExample:
    """RULER's kv needles for example `index`, drawn from its seed: the gold needle and `keys` - 1 distractors
    (multi-key), one key's `values` values (multi-value) or `queries` keys asked at once (multi-query)."""
    rng = random.Random(f"niah-kv/{keys}/{values}/{queries}/{index}")
    n_keys = max(keys, queries)
    names = rng.sample([f"{a}-{b}" for a in _ADJ for b in _NOUN], n_keys)
    nums = [str(x) for x in rng.sample(range(10**6, 10**7), n_keys * values)]
    sent = "One of the special magic numbers for {} is: {}."
    if values > 1:  # multi-value: one key, every value asked
        needles = tuple(Needle(sent.format(names[0], v), "gold" if i == 0 else "value", v)
                        for i, v in enumerate(nums))
        q = f"What are all the special magic numbers for {names[0]} mentioned in the provided text?"
        prefix, answers = f"The special magic numbers for {names[0]} mentioned in the provided text are", nums
    elif queries > 1:  # multi-query: several keys, each asked
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


def read_needles(needle: str, oracle: Path | None, overlap: str, answer_prefix: str | None) -> list[NiahExample]:
    """The examples of an NQ needle (`oracle`: the NQ-open gold passages with their questions) or a needle file
    (`needle`, a path), each needle checked against `overlap`; `answer_prefix` for lines without their own."""
    if needle in ("nq", "nq-sentence"):
        path = oracle
        recs = [(f"nq{i}", r["question"], r["answers"], f"{r['ctxs'][0]['title']}. {r['ctxs'][0]['text']}", "",
                 f"`needle={needle}`") for i, (_, r) in enumerate(read_jsonl(path))]
    else:
        recs = needle_lines(needle)
    out, overlapping = [], 0
    for rid, q, ans, text, prefix, source in recs:
        if needle == "nq-sentence":  # the passage's sentences that hold an answer (none: left out)
            norm = [normalize_answer(a) for a in ans]
            text = " ".join(s for s in sentences(text) if any(a and a in normalize_answer(s) for a in norm))
            if not text:
                continue
        if overlap == "none" and content_words(text) & content_words(q):
            overlapping += 1
            continue
        avoid = tuple(a for a in (normalize_answer(x) for x in ans) if a)
        out.append(NiahExample(rid, len(out), (Needle(text, "gold", ans[0]),), q, prefix or answer_prefix or "",
                               tuple(ans), avoid, source))
    if not out and overlapping:
        raise PosbiasError(f"every needle of {needle} shares a content word with its question (overlap=none)",
                           "use `overlap=any`, or a needle file whose needles share no word with their questions")
    if not out:  # nq-sentence: no passage has a sentence holding one of its answers
        raise PosbiasError(f"no passage of {needle} has a sentence holding one of its answers",
                           "use `needle=nq` (the whole passage)")
    return out


def needle_lines(path: str) -> list[tuple]:
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
