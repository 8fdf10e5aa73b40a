"""Order tasks: the position is the slot of the correct candidate among k (a judge's two answers, a multiple-
choice question's options), and the sweep moves it through every slot on the same items.

Placement p shows the candidates in the cyclic order that puts the correct one (candidate 0) at slot p, so
slot s holds candidate (s - p) mod k: for k = 2 the swap of MT-Bench / FairEval, for k options the cyclic
permutations of PriDe. The model answers with an option label; core/order.py turns the choices into the
consistency, conflict and fairness figures.

    judge-nq, mc-nq   NQ-open questions (the nq data set's oracle file: question, gold passage, answers); the wrong
                      candidates are answers to other questions of the same kind (who / when / how many ...)
    judge-kv, mc-kv   generated facts "The code for K is V."; the wrong candidates are near misses of V
                      (one digit changed)
    judge:PATH        your pairwise file, mc:PATH your multiple-choice file (ORDER_SCHEMAS; tasks/order_files.py)

A judge reads a template (tasks/judge_template.py): the built-in question `ask`, or a user's file `template`.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.metrics import best_subspan_em, normalize_answer
from ..data import data_file
from ..errors import PosbiasError
from .base import Prompt, Task, file_stamp, read_jsonl
from .judge_template import ASKS, JudgeTemplate, builtin, load_template

LABELS = {"letters": tuple(string.ascii_uppercase[:10]), "digits": tuple("123456789")}
STYLES = ("judge", "mc")

ORDER_SCHEMAS = """\
Pairwise judge file (judge:PATH), one JSON object per line:
  {"id": "p1",                         (optional; default: the line number)
   "question": "...",
   "answers": ["first answer", "second answer"],   (exactly two, different; one may be empty: "")
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
answer is better?", MT-Bench style; the default for judge:PATH), or template = FILE (--judge-template: your own
prompt with {question} {answer_a} {answer_b}, optional {label_a} {label_b} {context}; .txt, or .json with
"prompt", "prompt_with_context", "answer_prefix", "labels", "verdict" (e.g. "[[{label}]]"), "tie", "max_new_tokens";
docs/order-bias.md) and ties = refuse | drop."""

TIES = ("refuse", "drop")
BINDS = ("slot", "candidate")  # a label names a slot (the default), or goes with its candidate wherever it is shown


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
    bind = "slot"  # what a label names (BINDS; `bound`)

    def __init__(self, name: str, items: list[OrderItem] | None, k: int, style: str = "mc", labels: str = "letters",
                 make=None, has_gold: bool = True, ask: str = "correct", dropped_ties: int = 0,
                 template: JudgeTemplate | None = None):
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
        if template is not None and style != "judge":
            raise PosbiasError("a judge template sets a judge's prompt, and multiple choice has none", "drop `template`")
        # what a judge reads: a user's template, or the built-in question `ask` as one (tasks/judge_template.py)
        self.template = (template or builtin(ask, k)).check(k) if style == "judge" else None
        if self.template is not None and self.template.verdict:  # a reply that may explain first: its room, all lines
            self.multiline = True
            self.max_new_tokens = self.template.max_new_tokens or 256
        elif self.template is not None and self.template.max_new_tokens:
            self.max_new_tokens = self.template.max_new_tokens
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
        t = self.template
        own = own or (t.labels if t is not None else None)
        out = {**super().config(), "style": self.style, "labels": list(own) if own else self.label_set,
               "has_gold": self.has_gold, **({"bind": self.bind} if self.bind != "slot" else {})}
        if t is not None:  # a built-in question is recorded by name, as before templates; a file by name, hash, text
            out.update({"ask": self.ask} if t.sha256 is None else {"template": t.config()})
        return {**out, **({"dropped_ties": self.dropped_ties} if self.dropped_ties else {})}

    def _example(self, index: int) -> OrderItem:
        return self._make(index) if self._items is None else self._items[index]

    def read_choice(self, text: str, labels: tuple[str, ...]) -> int:
        """The slot a generated verdict names: the template's verdict pattern (its last match; a tie -2) or, without
        one, core.order.parse_choice; -1: none read."""
        return self.template.read(text, labels) if self.template is not None else super().read_choice(text, labels)

    def bound(self, bind: str) -> "OrderTask":
        """The task with its labels bound to slots (the default) or to candidates (`bind=candidate`: candidate i
        keeps the label (i + offset) mod k wherever it is shown, the offset seeded by the item's id, so the correct
        one's label varies between items and not between its slots; moving the candidates then only reorders the
        same labelled texts, which PINE's invariance needs: docs/mitigations.md, "PINE")."""
        if bind not in BINDS:
            raise PosbiasError(f"unknown bind={bind!r}", "use `bind=slot` or `bind=candidate`")
        self.bind = bind
        return self

    def labels_of(self, item: OrderItem) -> tuple[str, ...]:
        own = self.template.labels if self.template is not None else None
        return item.labels or own or LABELS[self.label_set][: self.k]

    def slot_labels(self, item: OrderItem, position: int) -> tuple[str, ...]:
        """The labels in slot order: the task's (bind=slot), or each shown candidate's own (bind=candidate)."""
        labels = self.labels_of(item)
        if self.bind == "slot":
            return labels
        offset = random.Random(f"bind/{item.id}").randrange(self.k)
        return tuple(labels[((s - position) % self.k + offset) % self.k] for s in range(self.k))

    def arrangement(self, item: OrderItem, position: int) -> list[str]:
        """The candidates in slot order with the correct one at `position` (slot s: candidate (s - p) mod k)."""
        return [item.candidates[(s - position) % self.k] for s in range(self.k)]

    def items(self, item: OrderItem, position: int) -> list[str]:
        labels = self.slot_labels(item, position)
        if self.template is not None:
            return self.template.items(self.arrangement(item, position), labels)
        return [f"{lb}. {c}" for lb, c in zip(labels, self.arrangement(item, position))]

    def build(self, item: OrderItem, position: int) -> Prompt:
        labels = self.slot_labels(item, position)
        if self.template is not None:
            user = self.template.render(item.question, self.arrangement(item, position), labels, item.context,
                                        self.labels_of(item))
            prefix = self.template.answer_prefix
        else:
            ref = f"Reference:\n{item.context}\n\n" if item.context else ""
            what = "letter" if self.labels_of(item) == LABELS["letters"][: self.k] else "label"
            user = (f"{ref}Question: {item.question}\n" + "\n".join(self.items(item, position))
                    + f"\nAnswer with the {what} of the correct option.")
            prefix = "Answer:"
        # rows record the candidates' lengths (and a judge file's scores), in candidate order: eval/judging.py bins
        # the order figures by them and tells a length-driven flip
        meta = {"candidate_chars": [len(c) for c in item.candidates],
                **({"candidate_scores": list(item.scores)} if item.scores is not None else {})}
        head = self.template.head if self.template is not None else ""
        rank = tuple(self.labels_of(item).index(lb) for lb in labels) if self.bind == "candidate" else ()
        return Prompt(item.id, position, user, prefix, (labels[position],), tuple(labels), meta=meta, verdict_head=head,
                      option_rank=rank)


# --- NQ: the oracle file's questions, wrong candidates from questions of the same kind ---------------------------

def _kind(question: str) -> str:
    words = question.lower().split()
    if not words:
        return "other"
    if words[0] == "how" and len(words) > 1:
        return f"how {words[1]}"
    return words[0] if words[0] in ("who", "when", "where", "what", "which", "why") else "other"


def nq_order_task(style: str, k: int, data_dir=None, reference: str = "yes", labels: str | None = None,
                  ask: str | None = None, template: str | Path | None = None) -> OrderTask:
    """NQ-open questions from the nq data set's oracle file; `reference=yes` shows the gold passage (a reference-guided
    judge), `no` asks closed-book."""
    if reference not in ("yes", "no"):
        raise PosbiasError(f"reference must be yes or no, got {reference!r}", "use `reference=yes` or `reference=no`")
    tpl = template_for(style, ask, template, labels)
    if tpl is not None and reference == "yes" and not tpl.shows_context:
        raise unseen_context(f"{style}-nq shows each question's gold passage as its context", tpl, "use `reference=no`")
    path = data_file("nq", "nq/nq-open-oracle.jsonl.gz", data_dir)
    task = OrderTask(f"{style}-nq", list(_nq_items(path, file_stamp(path), k, reference == "yes")), k, style,
                     labels or "letters", ask=ask or "correct", template=tpl)
    task.inputs = (path,)
    return task


def template_for(style: str, ask: str | None, template, labels: str | None) -> JudgeTemplate | None:
    """A judge task's template file, read (None: the built-in question `ask`; OrderTask checks either for its k
    answers); `labels` replaces the template's own labels, as it replaces a multiple-choice file's."""
    for key, value in (("ask", ask), ("template", template)):
        if style != "judge" and value is not None:
            raise PosbiasError(f"`{key}` sets a judge's prompt, and multiple choice has none", f"drop `{key}`")
    if template is None:
        return None
    if ask is not None:
        raise PosbiasError(f"`ask={ask}` picks a built-in judge question, and `template` gives your own prompt",
                           "drop `ask`")
    tpl = load_template(template)
    return replace(tpl, labels=None) if labels is not None else tpl


def unseen_context(what: str, tpl: JudgeTemplate, more: str) -> PosbiasError:
    return PosbiasError(f"{what}, and judge template {tpl.name} has no {{context}}: the judge would not see it",
                        f"add {{context}} to the template's prompt (or a prompt_with_context that shows it), or {more}")


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
        if len(wrong) == k - 1:  # enough from its kind: the whole pool is not shuffled (the same items, 8x faster)
            break
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

def kv_order_task(style: str, k: int, facts: int = 6, digits: int = 6, labels: str | None = None,
                  ask: str | None = None, template: str | Path | None = None) -> OrderTask:
    tpl = template_for(style, ask, template, labels)
    if tpl is not None and not tpl.shows_context:
        raise unseen_context(f"{style}-kv shows its facts as the context", tpl, "use another task")
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

    return OrderTask(f"{style}-kv", None, k, style, labels or "letters", make=make, ask=ask or "correct", template=tpl)
