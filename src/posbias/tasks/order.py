"""Order tasks: the position is the slot of the correct candidate among k (a judge's two answers, a multiple-
choice question's options), and the sweep moves it through every slot on the same items.

Placement p shows the candidates in the cyclic order that puts the correct one (candidate 0) at slot p, so
slot s holds candidate (s - p) mod k: for k = 2 the swap of MT-Bench / FairEval, for k options the cyclic
permutations of PriDe. The model answers with an option label; core/order.py turns the choices into the
consistency, conflict and fairness figures.

    judge-nq, mc-nq   NQ-open questions (the shared oracle file: question, gold passage, answers); the wrong
                      candidates are answers to other questions of the same kind (who / when / how many ...)
    judge-kv, mc-kv   generated facts "The code for K is V."; the wrong candidates are near misses of V
                      (one digit changed)
    judge:PATH        your pairwise file, mc:PATH your multiple-choice file (ORDER_SCHEMAS)
"""

from __future__ import annotations

import functools
import json
import math
import random
import string
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.metrics import best_subspan_em, normalize_answer
from ..errors import PosbiasError
from .base import Prompt, Task, file_stamp, read_jsonl, shared_data_dir

LABELS = {"letters": tuple(string.ascii_uppercase[:10]), "digits": tuple("123456789")}
STYLES = ("judge", "mc")

ORDER_SCHEMAS = """\
Pairwise judge file (judge:PATH), one JSON object per line:
  {"id": "p1",                         (optional; default: the line number)
   "question": "...",
   "answers": ["first answer", "second answer"],   (exactly two, different)
   "preferred": 0,                     (optional: the better one; without it, on every line, the curve is the
                                         rate of choosing answers[0] and the consistency figures still hold;
                                         a tie is null or "tie": refused, or left out with the option ties=drop)
   "context": "...",                   (optional reference text shown before the question)
   "scores": [8, 6.5]}                 (optional: the two answers' quality scores, numbers in answers' order, e.g.
                                         MT-Bench human or GPT-4 grades; the sweep bins the order figures by their gap)
Multiple-choice file (mc:PATH):
  {"id": "q1", "question": "...", "options": ["...", "...", ...],   (2 to 10, all different)
   "gold": 2,                          (0-based index of the correct option)
   "context": "...",                   (optional)
   "labels": ["A", "B", ...]}          (optional, one per option, all different, the same on every line; default
                                         A, B, C ...; the option labels=letters|digits replaces them)
Every line must have the same number of options.
Options: labels = letters | digits; a judge's ask = correct ("Which answer is correct?") | preference ("Which
answer is better?", MT-Bench style; the default for judge:PATH) and ties = refuse | drop."""

ASKS = {  # what a judge is asked: its instruction and its question (the order of the answers must not matter)
    "correct": ("You are a fair judge. Decide which candidate answer to the question is correct{ref}. The order of the "
                "answers does not matter.", "Which answer is correct?"),
    "preference": ("You are an impartial judge. Compare the two answers to the user's question{ref} and decide which "
                   "one answers it better: more helpful, relevant, accurate and detailed. Neither the order in which "
                   "the answers are shown nor their length may influence your decision.", "Which answer is better?"),
}
TIES = ("refuse", "drop")


@dataclass(frozen=True)
class OrderItem:
    """An item with its candidates; candidates[0] is the correct (or preferred) one."""

    id: str
    question: str
    candidates: tuple[str, ...]
    context: str = ""
    labels: tuple[str, ...] | None = None  # the item's own labels (a user's file), else the task's
    scores: tuple[float, ...] | None = None  # a judge file's quality scores, in candidate order (correct first)


class OrderTask(Task):
    """k candidates per item, the correct one moved through the slots (cyclically; module docstring)."""

    metric = "choice"  # the engines score an order task by the option it names (Prompt.options)
    default_engine = "teacher-forced"
    max_new_tokens = 8
    order = True  # sweeps add the order figures (core/order.py) and accept the order decisions (swap, pride)

    def __init__(self, name: str, items: list[OrderItem] | None, k: int, style: str = "mc", labels: str = "letters",
                 make=None, has_gold: bool = True, ask: str = "correct", dropped_ties: int = 0):
        if style not in STYLES:
            raise PosbiasError(f"unknown order style {style!r}", "use `style=judge` or `style=mc`")
        if ask not in ASKS:
            raise PosbiasError(f"unknown judge question ask={ask!r}", "use `ask=correct` or `ask=preference`")
        if labels not in LABELS:
            raise PosbiasError(f"unknown labels {labels!r}", f"use `labels={'` or `labels='.join(LABELS)}`")
        if not 2 <= k <= len(LABELS[labels]):
            raise PosbiasError(f"{name}: {k} options cannot be labelled with {labels} (2..{len(LABELS[labels])})",
                               "use `options` between 2 and 9" if labels == "digits" else "use `options` between 2 and 10")
        self.name, self._items, self.k, self.style, self.label_set = name, items, k, style, labels
        self._make, self.has_gold, self.ask, self.dropped_ties = make, has_gold, ask, dropped_ties
        # what the curve measures: whether the verdict is right, or (a judge file without "preferred") how often the
        # model picks the file's first answer
        self.score_name = "accuracy" if has_gold else "picks answers[0]"

    @property
    def n_slots(self) -> int:
        return self.k

    @property
    def chance(self) -> float:  # type: ignore[override]
        return 1 / self.k

    @property
    def pool_size(self) -> int | None:
        return None if self._items is None else len(self._items)

    def config(self) -> dict:
        own = self._items[0].labels if self._items else None  # a file's own labels (the same on every line)
        out = {**super().config(), "style": self.style, "labels": list(own) if own else self.label_set,
               "has_gold": self.has_gold}
        if self.style == "judge":
            out["ask"] = self.ask
        return {**out, **({"dropped_ties": self.dropped_ties} if self.dropped_ties else {})}

    def _example(self, index: int) -> OrderItem:
        return self._make(index) if self._items is None else self._items[index]

    def labels_of(self, item: OrderItem) -> tuple[str, ...]:
        return item.labels or LABELS[self.label_set][: self.k]

    def arrangement(self, item: OrderItem, position: int) -> list[str]:
        """The candidates in slot order with the correct one at `position` (slot s: candidate (s - p) mod k)."""
        return [item.candidates[(s - position) % self.k] for s in range(self.k)]

    def items(self, item: OrderItem, position: int) -> list[str]:
        labels = self.labels_of(item)
        if self.style == "judge":
            return [f"[Answer {lb}]\n{c}" for lb, c in zip(labels, self.arrangement(item, position))]
        return [f"{lb}. {c}" for lb, c in zip(labels, self.arrangement(item, position))]

    def build(self, item: OrderItem, position: int) -> Prompt:
        labels = self.labels_of(item)
        ref = f"Reference:\n{item.context}\n\n" if item.context else ""
        if self.style == "judge":
            reply = " or ".join(labels) if self.k == 2 else ", ".join(labels)
            instruction, question = ASKS[self.ask]
            user = (instruction.format(ref=", using the reference" if item.context else "") + "\n\n"
                    f"{ref}Question: {item.question}\n\n" + "\n\n".join(self.items(item, position))
                    + f"\n\n{question} Reply with {reply} only.")
            prefix = "Verdict:"
        else:
            what = "letter" if labels == LABELS["letters"][: self.k] else "label"
            user = (f"{ref}Question: {item.question}\n" + "\n".join(self.items(item, position))
                    + f"\nAnswer with the {what} of the correct option.")
            prefix = "Answer:"
        # rows record the candidates' lengths (and a judge file's scores), in candidate order: eval/judging.py bins
        # the order figures by them and tells a length-driven flip
        meta = {"candidate_chars": [len(c) for c in item.candidates],
                **({"candidate_scores": list(item.scores)} if item.scores is not None else {})}
        return Prompt(item.id, position, user, prefix, (labels[position],), tuple(labels), meta=meta)


# --- NQ: the oracle file's questions, wrong candidates from questions of the same kind ---------------------------

def _kind(question: str) -> str:
    words = question.lower().split()
    if not words:
        return "other"
    if words[0] == "how" and len(words) > 1:
        return f"how {words[1]}"
    return words[0] if words[0] in ("who", "when", "where", "what", "which", "why") else "other"


def nq_order_task(style: str, k: int, data_dir=None, reference: str = "yes", labels: str = "letters",
                  ask: str | None = None) -> OrderTask:
    """NQ-open questions from the shared oracle file; `reference=yes` shows the gold passage (a reference-guided
    judge), `no` asks closed-book."""
    if reference not in ("yes", "no"):
        raise PosbiasError(f"reference must be yes or no, got {reference!r}", "use `reference=yes` or `reference=no`")
    path = Path(data_dir or shared_data_dir()) / "nq" / "nq-open-oracle.jsonl.gz"
    _judge_only(style, ask)
    return OrderTask(f"{style}-nq", list(_nq_items(path, file_stamp(path), k, reference == "yes")), k, style, labels,
                     ask=ask or "correct")


def _judge_only(style: str, ask: str | None) -> None:
    if style != "judge" and ask is not None:
        raise PosbiasError("`ask` sets a judge's question, and multiple choice has none", "drop `ask`")


@functools.lru_cache(maxsize=8)
def _nq_items(path: Path, stamp: tuple | None, k: int, reference: bool) -> tuple[OrderItem, ...]:
    """Every question's item, built once per process, file version (stamp: mtime and size), k and reference: 2,655
    questions whose wrong candidates are checked against every gold answer take 1.5 s, and the judge and
    multiple-choice tasks, a comparison and the tests build them many times."""
    recs = []
    for lineno, r in read_jsonl(path):
        ctxs, answers = r.get("ctxs"), r.get("answers")
        if not (isinstance(r.get("question"), str) and isinstance(answers, list) and answers and isinstance(ctxs, list) and ctxs):
            raise PosbiasError(f"{path}:{lineno}: not an NQ-open oracle record", "use the Lost in the Middle oracle file")
        recs.append((r["question"], [str(a) for a in answers], str(ctxs[0].get("text", ""))))
    by_kind: dict[str, list[int]] = {}
    for i, (q, _, _) in enumerate(recs):
        by_kind.setdefault(_kind(q), []).append(i)
    return tuple(_nq_item(i, recs, by_kind, k, reference) for i in range(len(recs)))


def _nq_item(i: int, recs: list, by_kind: dict, k: int, reference: bool) -> OrderItem:
    """Question i with k - 1 wrong candidates: first answers of other questions of its kind (all questions when its
    kind has too few), none matching a gold answer either way, all different (seeded by i)."""
    question, golds, passage = recs[i]
    rng = random.Random(f"order-nq/{i}")
    wrong: list[str] = []
    seen = {normalize_answer(golds[0])}
    for pool in (by_kind[_kind(question)], range(len(recs))):
        order = [j for j in pool if j != i]
        rng.shuffle(order)
        for j in order:
            cand = recs[j][1][0]
            norm = normalize_answer(cand)
            if len(wrong) == k - 1:
                break
            if norm and norm not in seen and not best_subspan_em(cand, golds) and not best_subspan_em(golds[0], [cand]):
                seen.add(norm)
                wrong.append(cand)
    return OrderItem(f"nq{i}", question, (golds[0], *wrong), passage if reference else "")


# --- kv: generated facts, wrong candidates one digit away ----------------------------------------------------------

def kv_order_task(style: str, k: int, facts: int = 6, digits: int = 6, labels: str = "letters",
                  ask: str | None = None) -> OrderTask:
    _judge_only(style, ask)
    if facts < 1 or not 3 <= digits <= 12:
        raise PosbiasError(f"kv order tasks need facts >= 1 and digits 3..12, got {facts} and {digits}",
                           "use `facts=6` and `digits=6`")

    def make(index: int) -> OrderItem:
        rng = random.Random(f"order-kv/{facts}/{digits}/{k}/{index}")
        codes: list[str] = []
        while len(codes) < 2 * facts:
            c = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
            if c not in codes:
                codes.append(c)
        pairs = [(codes[2 * j], codes[2 * j + 1]) for j in range(facts)]
        key, value = pairs[rng.randrange(facts)]
        near: list[str] = []
        while len(near) < k - 1:  # one digit changed, never a code of the context
            pos = rng.randrange(digits)
            digit = rng.choice([d for d in "0123456789" if d != value[pos] and not (pos == 0 and d == "0")])
            miss = value[:pos] + digit + value[pos + 1:]
            if miss not in codes and miss not in near:
                near.append(miss)
        context = "\n".join(f"The code for {a} is {b}." for a, b in pairs)
        return OrderItem(f"kv{index}", f"What is the code for {key}?", (value, *near), context)

    return OrderTask(f"{style}-kv", None, k, style, labels, make=make, ask=ask or "correct")


# --- users' files ---------------------------------------------------------------------------------------------------

def _bad(where: str, what: str) -> PosbiasError:
    return PosbiasError(f"{where}: {what}", "fix that line (the schemas: posbias tasks)")


def _strings(where: str, field: str, value, lo: int, hi: int) -> list[str]:
    if not isinstance(value, list) or not lo <= len(value) <= hi or not all(isinstance(x, str) and x.strip() for x in value):
        raise _bad(where, f"{field!r} must be a list of {lo} to {hi} non-empty strings, got {value!r}"[:160])
    # the same text up to white space cannot be told apart; case can (ARC's genetics options R, rr, Rr, RR)
    norm = [" ".join(x.split()) for x in value]
    dup = next((x for j, x in enumerate(value) if norm[j] in norm[:j]), None)
    if dup is not None:
        raise _bad(where, f"{field!r} lists {dup!r} twice: the sweep could not tell the two apart")
    return value


def _is_tie(value) -> bool:
    return value is None or isinstance(value, str) and value.strip().lower() == "tie"


def _order_record(where: str, r: dict, style: str, default_id: str) -> tuple[OrderItem, bool]:
    """One line of ORDER_SCHEMAS -> (item with the correct candidate first, whether it names one)."""
    field = "answers" if style == "judge" else "options"
    for need in ("question", field) + (() if style == "judge" else ("gold",)):
        if need not in r:
            raise _bad(where, f"missing field {need!r}")
    if not isinstance(r["question"], str) or not r["question"].strip():
        raise _bad(where, f"'question' must be a non-empty string, got {r['question']!r}"[:160])
    cands = _strings(where, field, r[field], 2, 2 if style == "judge" else 10)
    key = "preferred" if style == "judge" else "gold"
    gold = r.get(key, 0)
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(cands):
        raise PosbiasError(f"{where}: {key}={json.dumps(gold)} but there are {len(cands)} {field}",
                           f"{key} is a 0-based index below {len(cands)}")
    context = r.get("context", "")
    if not isinstance(context, str):
        raise _bad(where, f"'context' must be a string, got {context!r}"[:160])
    labels = r.get("labels")
    if labels is not None:
        labels = tuple(_strings(where, "labels", labels, len(cands), len(cands)))
        if style == "judge":
            raise _bad(where, "'labels' belongs to multiple-choice files; a judge file's answers are labelled A and B")
    scores = _scores(where, r.get("scores"), len(cands), style)
    rid = r.get("id", default_id)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise _bad(where, f"'id' must be a string or an integer, got {rid!r}")
    ordered = (cands[gold], *cands[:gold], *cands[gold + 1:])  # the correct one first, the others in file order
    ranked = None if scores is None else (scores[gold], *scores[:gold], *scores[gold + 1:])  # as the candidates
    return OrderItem(str(rid), r["question"], ordered, context, labels, ranked), key in r


def _scores(where: str, scores, n: int, style: str) -> tuple[float, ...] | None:
    """A judge line's optional "scores": one finite number per answer, in the answers' order."""
    if scores is None:
        return None
    if style != "judge" or not isinstance(scores, list) or len(scores) != n or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in scores):
        raise _bad(where, f"'scores' must be a list of {n} numbers, one per answer (judge files only), got {scores!r}"[:160])
    return tuple(float(x) for x in scores)


def order_file_task(style: str, path: str | Path, labels: str | None = None, ask: str | None = None,
                    ties: str = "refuse") -> OrderTask:
    """A user's pairwise (style judge) or multiple-choice (mc) file in ORDER_SCHEMAS, checked line by line.

    labels: None keeps the file's own labels (one set on every line) or A, B, C ...; letters | digits replace them.
    ask: a judge's question (default preference: a judge file's "preferred" names the better answer, MT-Bench style).
    ties: a judge line whose "preferred" is null or "tie" names no better answer, so no slot is right: refused, or
    with ties=drop left out (their count recorded in the task's config)."""
    if ties not in TIES:
        raise PosbiasError(f"unknown ties={ties!r}", "use `ties=refuse` or `ties=drop`")
    _judge_only(style, ask)
    items, named, dropped = [], [], 0
    for lineno, r in read_jsonl(path):
        where = f"{path}:{lineno}"
        if style == "judge" and "preferred" in r and _is_tie(r["preferred"]):
            if ties == "drop":
                dropped += 1
                continue
            raise PosbiasError(f"{where}: 'preferred' is {json.dumps(r['preferred'])}, a tie: no answer is the better "
                               "one, so no slot can be scored right", "leave ties out with `ties=drop` (their count is "
                               "recorded), or remove 'preferred' from every line to measure consistency alone")
        item, has = _order_record(where, r, style, f"line{lineno}")
        _same_shape(where, item, items[0] if items else None, labels is None)
        items.append(item)
        named.append(has)
    if not items:
        raise PosbiasError(f"{path} holds no items" + (f" ({dropped} ties left out)" if dropped else ""),
                           "add one JSON object per line")
    if len(set(named)) > 1:
        raise PosbiasError(f"{path}: some lines name the preferred answer and some do not",
                           "give 'preferred' on every line, or on none")
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        raise PosbiasError(f"{path}: duplicate ids", "give every line a unique 'id'")
    if labels is not None:  # the flag replaces the lines' own labels
        items = [replace(it, labels=None) for it in items]
    return OrderTask(f"{style}:{path}", items, len(items[0].candidates), style, labels or "letters",
                     has_gold=named[0] or style == "mc", ask=ask or "preference", dropped_ties=dropped)


def _same_shape(where: str, item: OrderItem, first: OrderItem | None, own_labels: bool) -> None:
    """Every line of a file: the same number of options and (keeping the file's own labels) the same label set, so
    one curve describes every item."""
    if first is None:
        return
    if len(item.candidates) != len(first.candidates):
        raise PosbiasError(f"{where}: {len(item.candidates)} options, but earlier lines have {len(first.candidates)}",
                           "give every line the same number of options")
    if own_labels and item.labels != first.labels:
        show = lambda lb: ",".join(lb) if lb else "none (A, B, ...)"  # noqa: E731 - two uses in one message
        raise PosbiasError(f"{where}: labels {show(item.labels)}, but earlier lines have {show(first.labels)}: one "
                           "curve would pool slots labelled differently", "give every line the same labels, split "
                           "the file, or relabel every line with `labels=letters`")
