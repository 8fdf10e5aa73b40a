"""Order tasks on users' files (ORDER_SCHEMAS, tasks/order.py): `judge:PATH` (pairwise) and `mc:PATH` (multiple
choice), checked line by line before any model loads."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from ..errors import PosbiasError, shown
from .base import read_jsonl
from .judge_template import JudgeTemplate
from .order import TIES, OrderItem, OrderTask, template_for, unseen_context


def _bad(where: str, what: str) -> PosbiasError:
    return PosbiasError(f"{where}: {what}", "fix that line (the schemas: posbias tasks)")


def _strings(where: str, field: str, value, lo: int, hi: int, empty: bool = False) -> list[str]:
    """A list of lo..hi strings, all different; empty=True admits an empty one (a judge's empty response: shown as an
    empty answer block, as the published judge sets hold them)."""
    count = f"exactly {lo}" if lo == hi else f"{lo} to {hi}"
    kind = "strings" if empty else "non-empty strings"
    if not isinstance(value, list) or not lo <= len(value) <= hi or not all(
            isinstance(x, str) and (empty or x.strip()) for x in value):
        n = f"{len(value)} of them" if isinstance(value, list) and not lo <= len(value) <= hi else "got"
        example = '["first answer", ""]' if empty else '["first", "second", "third"]'
        fix = f"give {field!r} as a JSON list of {count} {kind}, e.g. {example}"
        raise PosbiasError(f"{where}: {field!r} must be a list of {count} {kind}; {n} {shown(value)}", fix)
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
        raise _bad(where, f"'question' must be a non-empty string, got {shown(r['question'])}")
    cands = _strings(where, field, r[field], 2, 2 if style == "judge" else 10, empty=style == "judge")
    key = "preferred" if style == "judge" else "gold"
    gold = r.get(key, 0)
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(cands):
        raise PosbiasError(f"{where}: {key}={json.dumps(gold)} but there are {len(cands)} {field}",
                           f"{key} is a 0-based index below {len(cands)}")
    context = r.get("context", "")
    if not isinstance(context, str):
        raise _bad(where, f"'context' must be a string, got {shown(context)}")
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
        raise _bad(where, f"'scores' must be a list of {n} numbers, one per answer (judge files only), got {shown(scores)}")
    return tuple(float(x) for x in scores)


def order_file_task(style: str, path: str | Path, labels: str | None = None, ask: str | None = None,
                    ties: str = "refuse", template: str | Path | None = None) -> OrderTask:
    """A user's pairwise (style judge) or multiple-choice (mc) file in ORDER_SCHEMAS, checked line by line.

    labels: None keeps the file's own labels (one set on every line) or A, B, C ...; letters | digits replace them.
    ask: a judge's question (default preference: a judge file's "preferred" names the better answer, MT-Bench style).
    ties: a judge line whose "preferred" is null or "tie" names no better answer, so no slot is right: refused, or
    with ties=drop left out (their count recorded in the task's config).
    template: a judge template file (tasks/judge_template.py) instead of the built-in question."""
    if ties not in TIES:
        raise PosbiasError(f"unknown ties={ties!r}", "use `ties=refuse` or `ties=drop`")
    tpl = template_for(style, ask, template, labels)
    items, named, dropped = _read_order_file(style, path, labels, ties, tpl)
    if not items:
        raise PosbiasError(f"{path} holds no items" + (f" ({dropped} ties left out)" if dropped else ""),
                           "add one JSON object per line")
    if len(set(named)) > 1:
        raise PosbiasError(f"{path}: some lines name the preferred answer and some do not",
                           "give 'preferred' on every line, or on none")
    if labels is not None:  # the flag replaces the lines' own labels
        items = [replace(it, labels=None) for it in items]
    return OrderTask(f"{style}:{path}", items, len(items[0].candidates), style, labels or "letters",
                     has_gold=named[0] or style == "mc", ask=ask or "preference", dropped_ties=dropped, template=tpl)


def _read_order_file(style: str, path, labels: str | None, ties: str,
                     tpl: JudgeTemplate | None) -> tuple[list[OrderItem], list[bool], int]:
    """(the items, whether each names its correct answer, ties left out) of an order file, line by line."""
    items, named, dropped, first_line = [], [], 0, {}
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
        if item.id in first_line:  # LogiQA 2.0 repeats ids
            raise PosbiasError(f"{where}: id {item.id!r} is also the id of line {first_line[item.id]}: the rows of the "
                               "two items could not be told apart", f"give line {lineno} another 'id', or remove 'id' "
                               "from every line (the line numbers are used)")
        first_line[item.id] = lineno
        if tpl is not None and item.context and not tpl.shows_context:
            raise unseen_context(f"{where} (id {item.id}) gives a 'context'", tpl, "remove 'context' from the lines")
        _same_shape(where, item, items[0] if items else None, labels is None)
        items.append(item)
        named.append(has)
    return items, named, dropped


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
