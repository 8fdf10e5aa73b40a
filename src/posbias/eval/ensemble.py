"""Scoring an order ensemble (methods/ensemble.py): each row read under K orders of its items, one row from the votes.

The orders are ordinary rows of the unmodified model (their example ids tagged `#order{j}` so the planners keep them
apart), scored through the Scorer's own path (in process or served), a chunk of examples at a time so a killed run
keeps every finished row. An adaptive ensemble scores its first orders for the chunk, then the rest only for the rows
whose first answers disagree. Each result row is reported at the row's own position; `passes`, `agreement`,
`order_correct` and `arranged_slots` (where the gold sat in each order) say how it was decided.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..methods import Method
from ..methods.ensemble import FIRST
from ..tasks import as_json, placement_key
from ..tasks.arrange import gold_slot
from .encode import Encoded, encode

CHUNK = 8  # examples per chunk: the unit a killed run keeps


def score_ensemble(scorer, rows: list[Encoded], method: Method, done: set,
                   on_batch: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Like Scorer.score for an Ensemble: one result dict per row not in `done`, in row order."""
    todo = [r for r in rows if r.key not in done]
    examples = list(dict.fromkeys(r.key[0] for r in todo))
    out: list[dict] = []
    for c in range(0, len(examples), CHUNK):
        mine = set(examples[c:c + CHUNK])
        chunk = [r for r in todo if r.key[0] in mine]
        first = range(FIRST) if method.adaptive else range(method.orders)
        got = _orders(scorer, method, chunk, first)
        rest = [r for r in chunk if not (method.adaptive and method.settled(got[r.key]))]
        more = _orders(scorer, method, rest, range(len(first), method.orders)) if rest and method.adaptive else {}
        new = []
        for r in chunk:
            res = got[r.key] + more.get(r.key, [])
            row = method.vote(res)
            row.update(example_id=r.key[0], position=as_json(r.key[1]), prompt_tokens=len(r.prompt_ids) or None,
                       arranged_slots=[x.get("arranged_slot") for x in res])
            new.append(row)
        out += new
        if on_batch:
            on_batch(new)
    return out


def _orders(scorer, method: Method, rows: list[Encoded], js) -> dict[tuple, list[dict]]:
    """{row key: [the result of each order j in js]}, scored on the unmodified model."""
    variants, owner, slots = [], [], []
    for r in rows:
        for j in js:
            p = method.variant(r.prompt, j, scorer.task)
            variants.append(encode(scorer.backend.tokenizer, replace(p, example_id=f"{r.key[0]}#order{j}"), scorer.chat,
                                   options=scorer.engine.reads_options))
            owner.append(r.key)
            slots.append(gold_slot(r.key[1], method.order(r.prompt, j)) if isinstance(r.key[1], int) else None)
    scorer.check_window(variants)
    index = {v.key: i for i, v in enumerate(variants)}
    got: dict[tuple, list[dict]] = {r.key: [] for r in rows}
    results = sorted(scorer.score(variants, "none"), key=lambda d: index[(d["example_id"], placement_key(d["position"]))])
    for res in results:
        i = index[(res["example_id"], placement_key(res["position"]))]
        got[owner[i]].append({**res, "arranged_slot": slots[i]})
    return got


def ensemble_record(rows: list[dict]) -> dict | None:
    """The cost and agreement of an ensemble's rows (None for rows of another method): passes per verdict (mean),
    the share decided after the first orders, and how often the orders agreed with the chosen answer."""
    passes = [r["passes"] for r in rows if "passes" in r]
    if not passes:
        return None
    return {"rule": "ensemble", "forward_passes_per_verdict": round(sum(passes) / len(passes), 4),
            "max_passes": max(passes), "stopped_early": sum(p < max(passes) for p in passes) / len(passes),
            "mean_agreement": round(sum(r["agreement"] for r in rows if "passes" in r) / len(passes), 4)}
