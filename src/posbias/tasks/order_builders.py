"""The six order-task families as builders (tasks/registry.py registers each): each binds its style (judge or
multiple choice) and default number of candidates, and its signature and docstring are its options, their types,
defaults and docs (the CLI's task options, `posbias tasks`). An entry "see `NAME`" takes NAME's text."""

from __future__ import annotations

from .order import OrderTask, kv_order_task, nq_order_task
from .order_files import order_file_task


def judge_nq(options: int = 2, labels: str | None = None, reference: str = "yes", ask: str | None = None,
             template: str | None = None, data_dir: str | None = None, bind: str = "slot") -> OrderTask:
    """A pairwise judge on NQ-open questions, the wrong candidates answers to other questions of the same kind.

    options: candidates per item, 2 to 10
    labels: the option labels, letters (A, B, ...; unset: these) | digits (1, 2, ...)
    reference: show the gold passage, yes | no (closed book)
    ask: the judge's question, correct (which answer is correct; unset: this) | preference (which is better,
      MT-Bench style)
    template: your own judge prompt instead of `ask`, a .txt file (the prompt) or .json (prompt, prompt_with_context,
      answer_prefix, labels) with {question} {answer_a} {answer_b} and optional {label_a} {label_b} {context}
      (docs/order-bias.md); checked before the model loads, its name and sha256 recorded
    bind: what a label names, slot (A is always the first shown; unset: this) | candidate (each candidate keeps its
      label wherever it is shown, so the orders are one set of labelled texts reordered: PINE's case)
    """
    return nq_order_task("judge", options, data_dir, reference, labels, ask, template).bound(bind)


def mc_nq(options: int = 4, labels: str | None = None, reference: str = "yes",
          data_dir: str | None = None, bind: str = "slot") -> OrderTask:
    """Multiple choice on NQ-open questions.

    options, labels, reference, bind: see `judge_nq`
    """
    return nq_order_task("mc", options, data_dir, reference, labels).bound(bind)


def judge_kv(facts: int = 6, digits: int = 6, options: int = 2, labels: str | None = None, ask: str | None = None,
             template: str | None = None, bind: str = "slot") -> OrderTask:
    """A pairwise judge on generated facts, the wrong candidates one digit off.

    facts: facts in the context, one of them asked
    digits: digits per key and value, 3 to 12
    options, labels, ask, template, bind: see `judge_nq`
    """
    return kv_order_task("judge", options, facts, digits, labels, ask, template).bound(bind)


def mc_kv(facts: int = 6, digits: int = 6, options: int = 4, labels: str | None = None,
          bind: str = "slot") -> OrderTask:
    """Multiple choice on generated facts.

    facts, digits, options, labels, bind: see `judge_kv`
    """
    return kv_order_task("mc", options, facts, digits, labels).bound(bind)


def judge_file(path: str, labels: str | None = None, ask: str | None = None, template: str | None = None,
               ties: str = "refuse", bind: str = "slot") -> OrderTask:
    """Your own pairwise judge file (ORDER_SCHEMAS).

    labels: letters | digits, replacing the file's own (unset: the file's own, else A, B, ...)
    ask: the judge's question, preference (which is better, MT-Bench style; unset: this) | correct (which answer is
      correct)
    template: see `judge_nq`
    ties: a line whose "preferred" is null or "tie", refuse | drop (left out, counted)
    bind: see `judge_nq`
    """
    return order_file_task("judge", path, labels, ask, ties, template).bound(bind)


def mc_file(path: str, labels: str | None = None, bind: str = "slot") -> OrderTask:
    """Your own multiple-choice file (ORDER_SCHEMAS).

    labels, bind: see `judge_file`
    """
    return order_file_task("mc", path, labels).bound(bind)
