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
level: the model runs as it is, so they work on every backend, served ones included (eval/ensemble.py scores them).
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager
from typing import Iterator

from ..core.metrics import normalize_answer
from ..errors import PosbiasError
from ..models.load import Loaded
from ..tasks import Prompt, Task
from ..tasks.arrange import arrange
from .base import Active, Method, refuse_without_items
from .registry import register_method

MODES = ("shift", "perm")
FIRST = 2  # orders an adaptive ensemble reads before it decides whether to read the rest


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
        if getattr(task, "order", False):
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

    def order(self, prompt: Prompt, j: int) -> list[int]:
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
        return arrange(prompt, self.order(prompt, j), task.slot_label)

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
