"""The random-search baseline: distinct uniformly random individuals, scored as ``GeneticSearch`` scores them.

``RandomSearch(space, cfg, evaluate, budget)`` shares ``posbias.core.ga``'s search machinery (the fitness cache,
the seeded RNG, the history, ``state_dict`` / ``load_state_dict``), so it is seeded, deterministic and resumable in
the same way, and its history entries have the same fields.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import PosbiasError
from .ga import Evaluate, SearchResult, _Search
from .ga_space import GAConfig, Individual, Space


class RandomSearch(_Search):
    """Baseline: ``budget`` distinct uniformly random individuals, in batches of ``pop_size``.

    Each batch is one "generation" of the history; its best/mean fitness are those of the best
    individual so far and of the batch. A drawn individual that was already evaluated is redrawn
    (up to ``max_mutation_try`` times), so the budget counts distinct evaluations.
    """

    kind = "random"

    def __init__(self, space: Space, cfg: GAConfig, evaluate: Evaluate, budget: int):
        super().__init__(space, cfg, evaluate)
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
            raise PosbiasError(f"budget must be a positive integer, got {budget!r}", "pass the number of evaluations")
        self.budget = int(budget)
        self.sampled = 0
        self.best: Individual | None = None

    @property
    def total_steps(self) -> int:
        """Batches of pop_size (the last one may be smaller)."""
        return -(-self.budget // self.cfg.pop_size)

    def step(self) -> dict:
        """Sample, evaluate and record one batch."""
        if self.done:
            raise PosbiasError(f"the random search already used its budget of {self.budget}", "read result()")
        t0 = time.perf_counter()
        batch: list[Individual] = []
        seen = set(batch)
        for _ in range(min(self.cfg.pop_size, self.budget - self.sampled)):
            ind = self.space.random(self.rng)
            for _ in range(self.cfg.max_mutation_try):
                if ind not in self.cache and ind not in seen:
                    break
                ind = self.space.random(self.rng)
            batch.append(ind)
            seen.add(ind)
        fitness = self.evaluate(batch)
        self.sampled += len(batch)
        for ind, fit in zip(batch, fitness):
            if self.best is None or fit > self.cache[self.best]:
                self.best = ind
        self.generation += 1
        self._record(batch, fitness, t0)
        self.history[-1].update(best_fitness=self.cache[self.best], best=list(self.best),
                                best_description=self.space.describe(self.best))
        return self.history[-1]

    def result(self) -> SearchResult:
        """Best individual sampled so far (the first one on ties)."""
        if self.best is None:
            raise PosbiasError("the random search has not sampled anything yet", "call step() or run() first")
        return self._result(self.best, self.cache[self.best])

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(budget=self.budget, sampled=self.sampled, best=None if self.best is None else list(self.best))
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("budget") != self.budget:
            raise PosbiasError(f"saved random search has budget {state.get('budget')}, this one {self.budget}",
                               "resume with the same budget")
        super().load_state_dict(state)
        self.sampled = int(state["sampled"])
        self.best = None if state["best"] is None else self.space.from_json(state["best"])
