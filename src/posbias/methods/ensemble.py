"""Order ensembles for documents: the same example read under k orders of its items, one answer from them all.

    ensemble[:K][:shift|perm][:adaptive]    K orders (default 3): `shift` (default) moves every item by round(j*n/K)
                                            slots for order j (the gold visits K evenly spread slots); `perm` takes
                                            seeded random permutations (seeded by example id and order), each
                                            different from the earlier ones. Order 0 is always the prompt as the
                                            task built it. K above the distinct orders (n items: n shifts, n!
                                            permutations) is refused: it would read some order twice.

The answer is the majority over the K answers, compared after normalisation (SQuAD's: lower case, no articles or
punctuation). A tie (2-2 at K = 4; three different answers at K = 3) goes to one of the tied answers drawn uniformly,
seeded by the example and its slot: a rule that prefers an order (the earliest, say) hands every tie to that order's
answer, and order 0 is the unmodified prompt, so `ensemble:2` would always be the unmodified model. Teacher forcing also
records the mean answer log-probability over the orders (`ensemble_logprob`); its verdict is still the vote, because
a free-answer task has no competing answers to compare log-probabilities with (the order tasks' `swap` averages the
option labels' log-probabilities instead). Cost: K passes per row.

`adaptive` reads two orders first and stops when their answers agree (2 passes), else reads the other K - 2: the
label-free stand-in for a margin on a free-answer task (a judge's `aswap` uses the label margin). Both are decision
level: the model runs as it is, so they work on every backend, served ones included.

Reading (the `read` stage): the orders are ordinary rows of the unmodified model (their example ids tagged
`#order{j}` so the planners keep them apart), read through the Scorer's own path (in process or served) a chunk of
examples at a time, so a killed run keeps every finished row. An adaptive ensemble reads its first orders for the
chunk, then the rest only for the rows whose first answers disagree. Each result row is reported at the row's own
position; `passes`, `agreement`, `order_correct` and `arranged_slots` (where the gold sat in each order) say how it was
decided, and the `decide` stage records the cost and agreement over all rows.
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterator

from ..core.metrics import normalize_answer
from ..errors import PosbiasError
from ..models.load import Loaded
from ..tasks import Prompt, Task, as_json
from ..tasks.arrange import arrange, gold_slot
from .base import Active, Method, ReadView, refuse_without_items
from .registry import register_method

MODES = ("shift", "perm")
FIRST = 2  # orders an adaptive ensemble reads before it decides whether to read the rest
CHUNK = 8  # examples per chunk: the unit a killed run keeps


@register_method
class Ensemble(Method):
    """K orders of each prompt's items, the majority answer (decision level: the model is untouched)."""

    name = "ensemble"
    usage = "ensemble[:K][:shift|perm][:adaptive]"
    changes_model = False
    prefix_safe = True

    def __init__(self, k: int = 3, mode: str = "shift", adaptive: bool = False, seed: int = 0):
        if k < 2:
            raise PosbiasError(f"an order ensemble needs at least 2 orders, got {k}", "write ensemble:3 or so")
        if mode not in MODES:
            raise PosbiasError(f"unknown ensemble order {mode!r}", f"write ensemble:{k}:{'|'.join(MODES)}")
        if adaptive and k <= FIRST:
            raise PosbiasError(f"an adaptive ensemble reads {FIRST} orders first, so it needs more than {FIRST}, got {k}",
                               "write ensemble:5:adaptive or so")
        self.orders, self.mode, self.adaptive, self.seed = k, mode, adaptive, seed

    @property
    def passes(self) -> int:  # type: ignore[override]
        return self.orders

    @classmethod
    def from_spec(cls, arg: str) -> "Ensemble":
        parts = [p for p in arg.split(":") if p] if arg else []
        k = int(parts.pop(0)) if parts and parts[0].isdigit() else 3
        mode = parts.pop(0) if parts and parts[0] in MODES else "shift"
        adaptive = bool(parts) and parts[0] == "adaptive"
        if adaptive:
            parts.pop(0)
        if parts:
            raise PosbiasError(f"bad ensemble spec {arg!r}", f"write it as {cls.usage}, e.g. ensemble:5:perm:adaptive")
        return cls(k, mode, adaptive)

    @property
    def label(self) -> str:
        return f"ensemble:{self.orders}:{self.mode}" + (":adaptive" if self.adaptive else "")

    def config(self) -> dict:
        return {"name": self.name, "k": self.orders, "mode": self.mode, "adaptive": self.adaptive, "seed": self.seed}

    def check_task(self, task: Task, positions: list, engine: str) -> None:
        refuse_without_items(self, task)
        if task.order:
            raise PosbiasError(f"{self.label} reorders documents, and {task.name} already shows every order of its "
                               "candidates", "use swap, aswap or pride on an order task")
        if task.n_slots < 2:
            raise PosbiasError(f"{task.name} has {task.n_slots} slot: there is no other order", "use a task with items")
        self._check_distinct(task.name, task.n_slots)

    def _check_distinct(self, task: str, n: int) -> None:
        """Refuse K above the distinct orders of n items (n shifts; n! permutations): one would be read twice."""
        most = n if self.mode == "shift" else math.factorial(min(n, 20))  # 20! orders: more than anyone asks for
        if self.orders <= most:
            return
        kinds = "shifts" if self.mode == "shift" else "orders"
        tail = ":adaptive" if self.adaptive and most > FIRST else ""
        perm = (f", or ensemble:{self.orders}:perm" + ":adaptive" * self.adaptive
                if self.mode == "shift" and math.factorial(n) >= self.orders else "")
        raise PosbiasError(f"{self.label} asks for {self.orders} orders, and {task}'s {n} items have only {most} "
                           f"distinct {kinds}", f"write ensemble:{most}:{self.mode}{tail}{' or fewer orders' * (most > 2)}{perm}")

    def permutation(self, prompt: Prompt, j: int) -> list[int]:
        """order[s] = the slot whose item order j shows at slot s (order 0: as built)."""
        n = len(prompt.items)
        if self.mode == "shift":  # d = round(j*n/K) differ for j < K <= n (steps of n/K >= 1): K distinct shifts
            d = round(j * n / self.orders)
            return [(s - d) % n for s in range(n)]
        if j >= math.factorial(min(n, 20)):  # check_distinct refuses it for the task; a prompt of fewer items too
            raise PosbiasError(f"{self.label} asks for order {j} of {n} items, which have {math.factorial(n)} orders",
                               f"write ensemble:{math.factorial(n)}:perm or fewer orders")
        seen = [list(range(n))]
        for i in range(1, j + 1):  # order i: the first seeded shuffle that differs from orders 0..i-1
            out, tries = list(seen[0]), 0
            while out in seen:
                out = list(range(n))
                random.Random(f"{self.seed}:{prompt.example_id}:{i}" + (f":{tries}" if tries else "")).shuffle(out)
                tries += 1
            seen.append(out)
        return seen[j]

    def variant(self, prompt: Prompt, j: int, task: Task) -> Prompt:
        if not prompt.items:
            raise PosbiasError(f"{task.name} does not list its items, so {self.label} cannot reorder them",
                               "use a task with items (kv-lookup, nq, jsonl:PATH, niah is one needle: not)")
        return arrange(prompt, self.permutation(prompt, j), task.slot_label)

    def vote(self, results: list[dict]) -> dict:
        """The ensemble's row from the orders' results (in order): the majority answer; a tie goes to one of the tied
        answers drawn uniformly (seeded by the example and its slot), never to a fixed order, so order 0 (the
        unmodified prompt) wins no more ties than any other. The row is that of the first order that gave it."""
        keys = [normalize_answer(str(r.get("prediction", ""))) for r in results]
        count = {a: keys.count(a) for a in keys}
        tied = sorted(a for a in count if count[a] == max(count.values()))
        row = results[0]
        seed = f"{self.seed}:tie:{str(row.get('example_id', '')).split('#order')[0]}:{row.get('position')}"
        answer = tied[0] if len(tied) == 1 else random.Random(seed).choice(tied)
        win = keys.index(answer)
        out = {**results[win], "correct": bool(results[win]["correct"]), "passes": len(results),
               "agreement": count[answer] / len(results), "chosen_order": win, "tie": len(tied) > 1,
               "order_correct": [bool(r["correct"]) for r in results],
               "order_predictions": [r.get("prediction", "") for r in results]}
        lps = [r.get("logprob") for r in results]
        if lps and all(isinstance(x, (int, float)) for x in lps):
            out["ensemble_logprob"] = sum(lps) / len(lps)
        return out

    def settled(self, results: list[dict]) -> bool:
        """An adaptive ensemble stops after its first orders when their answers agree."""
        return len({normalize_answer(str(r.get("prediction", ""))) for r in results}) == 1

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        yield Active()

    def read(self, view: ReadView, rows: list, done: set, on_batch: Callable[[list[dict]], None] | None) -> list[dict]:
        """One result dict per row not in `done` (rows: the Scorer's encoded rows), in row order, chunk by chunk."""
        todo = [r for r in rows if r.key not in done]
        examples = list(dict.fromkeys(r.key[0] for r in todo))
        out: list[dict] = []
        for c in range(0, len(examples), CHUNK):
            mine = set(examples[c:c + CHUNK])
            chunk = [r for r in todo if r.key[0] in mine]
            first = range(FIRST) if self.adaptive else range(self.orders)
            got = self._orders(view, chunk, first)
            rest = [r for r in chunk if not (self.adaptive and self.settled(got[r.key]))]
            more = self._orders(view, rest, range(len(first), self.orders)) if rest and self.adaptive else {}
            new = []
            for r in chunk:
                res = got[r.key] + more.get(r.key, [])
                row = self.vote(res)
                row.update(example_id=r.key[0], position=as_json(r.key[1]), prompt_tokens=len(r.prompt_ids) or None,
                           arranged_slots=[x.get("arranged_slot") for x in res])
                new.append(row)
            out += new
            if on_batch:
                on_batch(new)
        return out

    def _orders(self, view: ReadView, rows: list, js) -> dict[tuple, list[dict]]:
        """{row key: [the result of each order j in js]}, read on the unmodified model."""
        prompts, owner, slots = [], [], []
        for r in rows:
            for j in js:
                p = self.variant(r.prompt, j, view.task)
                prompts.append(replace(p, example_id=f"{r.key[0]}#order{j}"))
                owner.append(r.key)
                slots.append(gold_slot(r.key[1], self.permutation(r.prompt, j)) if isinstance(r.key[1], int) else None)
        got: dict[tuple, list[dict]] = {r.key: [] for r in rows}
        for key, slot, res in zip(owner, slots, view.read_unmodified(prompts)):
            got[key].append({**res, "arranged_slot": slot})
        return got

    def decide(self, rows: list[dict], calibration: list[dict], k: int) -> tuple[list[dict], dict | None]:
        """The rows as voted, and the cost and agreement over them: passes per verdict (mean), the share decided after
        the first orders, and how often the orders agreed with the chosen answer."""
        passes = [r["passes"] for r in rows if "passes" in r]
        if not passes:
            return rows, None
        return rows, {"rule": "ensemble", "forward_passes_per_verdict": round(sum(passes) / len(passes), 4),
                      "max_passes": max(passes), "stopped_early": sum(p < max(passes) for p in passes) / len(passes),
                      "mean_agreement": round(sum(r["agreement"] for r in rows if "passes" in r) / len(passes), 4)}
