"""Genetic search for layer-specific RoPE scaling factors (LPES, Algorithm 1); the random baseline built on the same
machinery (``RandomSearch``) is in ``posbias.core.ga_random``.

``GeneticSearch(space, cfg, evaluate)`` runs Algorithm 1 over a search space from
``posbias.core.ga_space`` (Bezier control points, or one gene per layer). ``evaluate`` maps a
*list* of individuals to a list of fitness values (higher is better), so the caller can batch
and parallelise model runs; a cache guarantees no individual is evaluated twice.

A search is seeded (one ``numpy.random.Generator(PCG64(seed))`` drives every random choice),
deterministic, and resumable: ``state_dict()`` after any generation is JSON-able, and
``load_state_dict`` on a fresh search with the same space and config continues exactly as the
uninterrupted run would (only the recorded wall times differ).

One generation (``step``), following Algorithm 1:

1. Fitness of the population S_{i-1} (cached) and the parents S_pa = its N_pa fittest.
2. N_cr crossover slots: a random pair of distinct parents is crossed (``crossover``: up to
   N_ct cuts until both children satisfy eq. 10); children equal to an individual already in
   the next population are dropped; if nothing is left a new pair is drawn, up to
   ``max_pair_tries`` pairs (then the last valid children are used even if not new; if no pair
   gave valid children at all, the slot becomes an extra mutation slot).
3. N_mu mutation slots: a mutation of a random parent, redrawn (new parent and mutation) up to
   ``max_mutation_try`` times while it duplicates an individual of the next population.
4. All new children are evaluated in one batch; each crossover slot keeps its fitter child
   (Sec. 3.2; ties go to the first child). S_i = S_pa + S_cr + S_mu (line 7).

Before the first generation S_0 is built from eq. 8 plus distinct mutations of it (an error if
``max_mutation_try`` mutations in a row bring nothing new) and evaluated.
The first ``step`` only evaluates S_0 (history entry 0, so its cost is saved at once); each later
step runs one generation. History entry g describes S_g: a run of T generations takes T+1 steps
and has T+1 entries. ``run(on_generation)`` calls ``on_generation(entry)`` with each new entry
(save ``state_dict()`` there) and returns the best individual of S_T; ``result()`` gives more.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import PosbiasError
from .ga_space import CurveSpace as CurveSpace  # these eight: re-exported, the public GA API lives here
from .ga_space import GAConfig as GAConfig
from .ga_space import Individual as Individual
from .ga_space import LayerSpace as LayerSpace
from .ga_space import Space as Space
from .ga_space import YGrid as YGrid
from .ga_space import crossover as crossover
from .ga_space import select_parents as select_parents

Evaluate = Callable[[list[Individual]], Sequence[float]]
STATE_VERSION = 1


@dataclass(frozen=True)
class SearchResult:
    """Best individual found, its fitness, per-layer factors and a JSON-able description."""

    individual: Individual
    fitness: float
    factors: list[float]
    description: dict
    generations: int
    evaluations: int
    cache_hits: int


class _Search:
    """Cache, RNG, history and state handling shared by the genetic and random searches."""

    kind = ""

    def __init__(self, space: Space, cfg: GAConfig, evaluate: Evaluate):
        cfg.validate()
        if space.cfg != cfg:
            raise PosbiasError("the space was built with a different GAConfig", "build the space from the same config")
        self.space, self.cfg, self._evaluate_fn = space, cfg, evaluate
        self.rng = np.random.Generator(np.random.PCG64(cfg.seed))
        self.cache: dict[Individual, float] = {}
        self.n_evaluations = 0
        self.cache_hits = 0
        self.generation = 0
        self.history: list[dict] = []

    # ------------------------------------------------------------ evaluation
    def evaluate(self, inds: Sequence[Individual]) -> list[float]:
        """Fitness of each individual; only individuals never seen before go to ``evaluate``, in one batch."""
        todo: list[Individual] = []
        pending: set[Individual] = set()
        for ind in inds:
            if ind in self.cache or ind in pending:
                self.cache_hits += 1
            else:
                todo.append(ind)
                pending.add(ind)
        if todo:
            values = list(self._evaluate_fn(list(todo)))
            if len(values) != len(todo):
                raise PosbiasError(f"evaluate returned {len(values)} values for {len(todo)} individuals",
                                   "return one fitness per individual, in order")
            for ind, v in zip(todo, values):
                v = float(v)
                if math.isnan(v):
                    raise PosbiasError(f"evaluate returned NaN for {ind}", "return a number (use -inf for failures)")
                self.cache[ind] = v
            self.n_evaluations += len(todo)
        return [self.cache[ind] for ind in inds]

    def fitness_of(self, inds: Sequence[Individual]) -> list[float]:
        """Like ``evaluate`` but lookups of known individuals are not counted as cache hits.

        Used for the population itself, which is always fully evaluated already, so that
        ``cache_hits`` counts only individuals that the operators re-created.
        """
        missing = [ind for ind in inds if ind not in self.cache]
        if missing:
            self.evaluate(missing)
        return [self.cache[ind] for ind in inds]

    def _record(self, population: Sequence[Individual], fitness: Sequence[float], t0: float) -> None:
        best = select_parents(population, fitness, 1)[0]
        self.history.append({
            "generation": self.generation,
            "best_fitness": float(max(fitness)),
            "mean_fitness": float(np.mean(fitness)),
            "best": list(best),
            "best_description": self.space.describe(best),
            "evaluations": self.n_evaluations,
            "cache_hits": self.cache_hits,
            "wall_s": time.perf_counter() - t0,
        })

    # ------------------------------------------------------------ driving
    @property
    def done(self) -> bool:
        return self.steps_done >= self.total_steps

    @property
    def total_steps(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def steps_done(self) -> int:
        """Steps finished so far (each added one history entry)."""
        return len(self.history)

    def step(self) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError

    def run(self, on_generation: Callable[[dict], None] | None = None) -> Individual:
        """Step until done, calling ``on_generation(entry)`` with each new history entry; return the best individual.

        Save ``state_dict()`` in the callback to make the run resumable.
        """
        while not self.done:
            entry = self.step()
            if on_generation is not None:
                on_generation(entry)
        return self.result().individual

    def _result(self, best: Individual, fitness: float) -> SearchResult:
        return SearchResult(individual=best, fitness=fitness, factors=[float(v) for v in self.space.factors(best)],
                            description=self.space.describe(best), generations=self.generation,
                            evaluations=self.n_evaluations, cache_hits=self.cache_hits)

    def result(self) -> SearchResult:  # pragma: no cover - overridden
        raise NotImplementedError

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """JSON-able snapshot (config, space, RNG state, cache in insertion order, counters, history)."""
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "config": self.cfg.to_dict(),
            "space": self.space.spec(),
            "generation": self.generation,
            "rng": self.rng.bit_generator.state,
            "cache": [[list(ind), fit] for ind, fit in self.cache.items()],
            "n_evaluations": self.n_evaluations,
            "cache_hits": self.cache_hits,
            "history": [dict(h) for h in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict()`` taken from a search with the same kind, space and config; only the
        number of generations may differ (a longer run continues a shorter one exactly: nothing else reads it)."""
        def budget_free(d: dict) -> dict:
            return {k: v for k, v in d.items() if k != "generations"}

        for key, saved, mine in (("version", state.get("version"), STATE_VERSION), ("kind", state.get("kind"), self.kind),
                                 ("space", state.get("space"), self.space.spec()),
                                 ("config", budget_free(state.get("config") or {}), budget_free(self.cfg.to_dict()))):
            if saved != mine:
                raise PosbiasError(f"saved search state has {key} = {saved!r}, this search has {mine!r}",
                                   "resume with the same search kind, space and GAConfig, or start afresh")
        self.generation = int(state["generation"])
        self.rng.bit_generator.state = state["rng"]
        self.cache = {self.space.from_json(ind): float(fit) for ind, fit in state["cache"]}
        self.n_evaluations = int(state["n_evaluations"])
        self.cache_hits = int(state["cache_hits"])
        self.history = [dict(h) for h in state["history"]]


class GeneticSearch(_Search):
    """Algorithm 1 (see the module docstring for the exact operator semantics)."""

    kind = "genetic"

    def __init__(self, space: Space, cfg: GAConfig, evaluate: Evaluate):
        super().__init__(space, cfg, evaluate)
        self.population: list[Individual] = self._initial_population()

    def _initial_population(self) -> list[Individual]:
        """S_0: the eq. 8 individual, then distinct mutations of it until pop_size (Sec. 3.2)."""
        first = self.space.initial()
        pop, seen, stale = [first], {first}, 0
        while len(pop) < self.cfg.pop_size:
            child = self.space.mutate(first, self.rng)
            if child in seen:
                stale += 1
                if stale >= self.cfg.max_mutation_try:  # this many repeats in a row: the neighbourhood is exhausted
                    raise PosbiasError(f"only {len(pop)} distinct mutations of the initial individual were found, "
                                       f"pop_size is {self.cfg.pop_size}", "lower pop_size or raise mx / my")
                continue
            pop.append(child)
            seen.add(child)
            stale = 0
        return pop

    @property
    def total_steps(self) -> int:
        """S_0, then T generations."""
        return self.cfg.generations + 1

    def step(self) -> dict:
        """Evaluate S_0 (first step), else one generation of Algorithm 1 (lines 3-7); return the new history entry."""
        if self.done:
            raise PosbiasError(f"the search already ran its {self.cfg.generations} generations", "read result()")
        t0 = time.perf_counter()
        if not self.history:
            self._record(self.population, self.fitness_of(self.population), t0)
            return self.history[-1]
        parents = select_parents(self.population, self.fitness_of(self.population), self.cfg.n_parents)
        taken = set(parents)
        groups, extra = [], 0
        for _ in range(self.cfg.n_crossover):
            kids = self._crossover_slot(parents, taken)
            if kids:
                groups.append(kids)
                taken.update(kids)
            else:
                extra += 1
        mutants = []
        for _ in range(self.cfg.n_mutation + extra):
            child = self._mutation_slot(parents, taken)
            mutants.append(child)
            taken.add(child)
        self.evaluate([k for g in groups for k in g] + mutants)  # one batch for all new children
        kept = [max(g, key=lambda k: self.cache[k]) for g in groups]  # max keeps the first on ties
        self.population = parents + kept + mutants
        self.generation += 1
        self._record(self.population, self.fitness_of(self.population), t0)
        return self.history[-1]

    def _crossover_slot(self, parents: list[Individual], taken: set[Individual]) -> list[Individual]:
        """Children of one crossover slot: new valid children of a random distinct-parent pair (see module doc)."""
        last: list[Individual] = []
        for _ in range(self.cfg.max_pair_tries):
            i, j = self.rng.choice(len(parents), size=2, replace=False)
            kids = crossover(parents[int(i)], parents[int(j)], self.rng, self.space)
            if not kids:
                continue
            last = kids
            new = [k for n, k in enumerate(kids) if k not in taken and k not in kids[:n]]
            if new:
                return new
        return last

    def _mutation_slot(self, parents: list[Individual], taken: set[Individual]) -> Individual:
        """A mutation of a random parent, preferring one not already in the next population."""
        child = parents[0]
        for _ in range(self.cfg.max_mutation_try):
            child = self.space.mutate(parents[int(self.rng.integers(len(parents)))], self.rng)
            if child not in taken:
                break
        return child

    def result(self) -> SearchResult:
        """Best individual of the current population (line 9), ties to the earlier one; evaluates it if needed."""
        fitness = self.fitness_of(self.population)
        best = select_parents(self.population, fitness, 1)[0]
        return self._result(best, self.cache[best])

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["population"] = [list(ind) for ind in self.population]
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.population = [self.space.from_json(ind) for ind in state["population"]]
