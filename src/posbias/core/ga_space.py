"""Search spaces, configuration and operators of the LPES genetic algorithm (Sec. 3.2).

The continuous control-point space is discretised as in Appendix B / Table 9: control-point
x takes the integers 0..L-1 and y the grid {y_min, y_min + y_step, ..., y_max}. Genes are
integers (x itself, and y as an index on the y grid), so an individual is a hashable tuple
of ints and fitness caches are keyed exactly.

Two spaces share one interface (``initial``, ``mutate``, ``valid``, ``factors``, ``random``,
``describe``, ``spec``, ``from_json``):

* ``CurveSpace``: an individual is (x_0, y_0, ..., x_d, y_d), the d+1 control points of a
  curve (Bezier, or a Table 6 alternative) that gives the per-layer factors.
* ``LayerSpace``: the "brute force" space of Table 7, one y gene per layer and no curve.

``GeneticSearch`` in ``posbias.core.ga`` and ``RandomSearch`` in ``posbias.core.ga_random`` drive them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import PosbiasError
from .bezier import CURVES, layer_factors

Individual = tuple[int, ...]

_INT_FIELDS = ("pop_size", "n_parents", "generations", "n_mutation", "n_crossover", "max_crossover_try",
               "max_mutation_try", "max_pair_tries", "mx", "n_points", "seed")


@dataclass(frozen=True)
class GAConfig:
    """Hyper-parameters of the constrained GA; defaults are Table 12 (and Table 9's y grid).

    ``max_mutation_try`` bounds the redraws of one mutation (eq. 10 violations, or a child equal
    to its parent) and of one offspring slot; ``max_pair_tries`` bounds the parent pairs drawn
    for one crossover slot. Neither is given in the paper.

    pop_size: population size N_ps.
    n_parents: parents kept per generation N_pa.
    generations: GA generations T (paper 20).
    n_mutation: mutation offspring per generation N_mu.
    n_crossover: crossover offspring per generation N_cr.
    max_crossover_try: crossover tries N_ct.
    mx: the largest move of a control point along the layers M_x, in layers.
    my: the largest change of a control point's factor M_y (paper 0.2).
    n_points: control points d + 1 (Table 7: 2-5; 4 = cubic).
    y_min: the smallest factor (paper 1.0).
    y_max: the largest factor (paper 2.0).
    y_step: the step of the factor grid the control points take (paper 0.1).
    y_init: the factor of the initial individual (eq. 8: 1.5).
    curve: the curve through the control points: bezier | linear | step (Table 6).
    max_mutation_try: redraws of one mutation or offspring slot at most (above).
    max_pair_tries: parent pairs drawn for one crossover slot at most (above).
    seed: the GA's seed.
    """

    pop_size: int = 32
    n_parents: int = 12
    generations: int = 20
    n_mutation: int = 16
    n_crossover: int = 4
    max_crossover_try: int = 4
    mx: int = 2
    my: float = 0.2
    n_points: int = 4
    y_min: float = 1.0
    y_max: float = 2.0
    y_step: float = 0.1
    y_init: float = 1.5
    curve: str = "bezier"
    max_mutation_try: int = 100
    max_pair_tries: int = 20
    seed: int = 0

    def validate(self) -> GAConfig:
        """Raise PosbiasError on the first inconsistent setting; return self."""
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise PosbiasError(f"GAConfig.{name} must be an integer, got {v!r}", f"set {name} to a whole number")
        for name in ("my", "y_min", "y_max", "y_step", "y_init"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise PosbiasError(f"GAConfig.{name} must be a finite number, got {v!r}", f"set {name} to a number")
        _check(self.pop_size >= 2, f"`pop_size` must be >= 2, got {self.pop_size}", "use e.g. `pop_size=32` (Table 12)")
        _check(self.n_parents >= 1, f"`n_parents` must be >= 1, got {self.n_parents}", "use e.g. `n_parents=12` (Table 12)")
        _check(self.n_mutation >= 0 and self.n_crossover >= 0, "`n_mutation` and `n_crossover` must be >= 0", "use 16 and 4")
        total = self.n_parents + self.n_crossover + self.n_mutation
        _check(total == self.pop_size,
               f"`n_parents` + `n_crossover` + `n_mutation` = {total} but `pop_size` = {self.pop_size}",
               "make them add up (Table 12: 12 + 4 + 16 = 32); the next population is their union")
        _check(self.n_crossover == 0 or self.n_parents >= 2, "crossover needs `n_parents` >= 2", "raise `n_parents`")
        _check(self.generations >= 0, f"`generations` must be >= 0, got {self.generations}", "use e.g. `generations=20`")
        for name in ("max_crossover_try", "max_mutation_try", "max_pair_tries"):
            _check(getattr(self, name) >= 1, f"{name} must be >= 1", f"set {name} to a positive integer")
        _check(self.mx >= 0 and self.my >= 0, f"`mx` and `my` must be >= 0, got {self.mx}, {self.my}", "use 2 and 0.2")
        _check(self.n_points >= 2, f"`n_points` must be >= 2, got {self.n_points}", "use 4 for a cubic Bezier")
        _check(self.curve in CURVES, f"unknown `curve` {self.curve!r}", f"use one of {', '.join(CURVES)}")
        _check(self.seed >= 0, f"`seed` must be >= 0, got {self.seed}", "use a non-negative integer")
        _check(self.y_min > 0, f"`y_min` must be > 0 (a scaling factor divides positions), got {self.y_min}", "use 1.0")
        _check(self.y_step > 0 and self.y_max >= self.y_min, "need `y_step` > 0 and `y_max` >= `y_min`",
               "e.g. `y_min=1.0` with `y_max=2.0` and `y_step=0.1`")
        steps = (self.y_max - self.y_min) / self.y_step
        _check(abs(steps - round(steps)) < 1e-6,
               f"(`y_max` - `y_min`) / `y_step` = {steps:g} is not a whole number", "pick `y_step` dividing `y_max` - `y_min`")
        _check(self.y_min - 1e-9 <= self.y_init <= self.y_max + 1e-9, f"`y_init` {self.y_init} outside [`y_min`, `y_max`]",
               f"set `y_init` between {self.y_min:g} and {self.y_max:g}, e.g. `y_init={self.y_min:g}`")
        k = (self.y_init - self.y_min) / self.y_step
        _check(abs(k - round(k)) < 1e-6, f"`y_init` {self.y_init} is not on the y grid", "set `y_init` to `y_min` + k * `y_step`")
        return self

    def to_dict(self) -> dict:
        """JSON-able dict of all fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GAConfig:
        """Inverse of ``to_dict``; missing keys take the defaults, unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise PosbiasError(f"unknown GAConfig keys {unknown}", f"use only {sorted(names)}")
        return cls(**d).validate()


def _check(ok: bool, problem: str, fix: str) -> None:
    if not ok:
        raise PosbiasError(problem, fix)


class YGrid:
    """The y values {y_min + i * y_step}, i = 0..n-1 (Table 9), and the mutation radius in steps."""

    def __init__(self, cfg: GAConfig):
        self.n = int(round((cfg.y_max - cfg.y_min) / cfg.y_step)) + 1
        self.values = np.round(cfg.y_min + cfg.y_step * np.arange(self.n), 12)
        self.init = self.index(cfg.y_init)
        # Eq. 9 keeps y within [y - M_y, y + M_y]; on the grid that is floor(M_y / y_step) steps.
        self.radius = int(math.floor(cfg.my / cfg.y_step + 1e-9))

    def index(self, y: float) -> int:
        """Grid index of y; PosbiasError if y is not a grid value."""
        i = int(round((y - self.values[0]) / (self.values[1] - self.values[0]))) if self.n > 1 else 0
        if not 0 <= i < self.n or abs(self.values[i] - y) > 1e-9:
            raise PosbiasError(f"y = {y} is not on the grid {self.values.tolist()}", "use a grid value")
        return i

    def mutate(self, i: int, rng: np.random.Generator) -> int:
        """Uniform index in [max(0, i - r), min(i + r, n - 1)] (eq. 9, y part)."""
        return int(rng.integers(max(0, i - self.radius), min(i + self.radius, self.n - 1) + 1))


def _is_int_tuple(ind, n: int) -> bool:
    return isinstance(ind, tuple) and len(ind) == n and all(isinstance(g, (int, np.integer)) for g in ind)


class _GridSpace:
    """Shared parts of the two spaces: spec, mutation retry loop, JSON decoding, input checks."""

    kind = ""
    n_layers: int
    n_genes: int
    cfg: GAConfig
    grid: YGrid

    def spec(self) -> dict:
        """What must match when a saved search state is loaded into this space."""
        return {"type": self.kind, "n_layers": self.n_layers}

    def valid(self, ind) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def _perturb(self, ind: Individual, rng: np.random.Generator) -> Individual:  # pragma: no cover
        raise NotImplementedError

    def mutate(self, ind: Individual, rng: np.random.Generator) -> Individual:
        """Mutation (eq. 9), redrawn until eq. 10 holds and the child differs from the parent.

        After ``max_mutation_try`` failed draws the parent is returned unchanged, so the result
        is always valid.
        """
        self._require(ind)
        for _ in range(self.cfg.max_mutation_try):
            child = self._perturb(ind, rng)
            if child != ind and self.valid(child):
                return child
        return ind

    def from_json(self, genes: Sequence[int]) -> Individual:
        """Individual from its JSON list of genes (checked)."""
        ind = tuple(int(g) for g in genes)
        self._require(ind)
        return ind

    def _require(self, ind) -> None:
        if not self.valid(ind):
            raise PosbiasError(f"invalid individual {ind!r} for the {self.kind} space with L={self.n_layers}",
                               "pass a tuple of integer genes made by this space")


class CurveSpace(_GridSpace):
    """Individuals (x_0, y_0, ..., x_d, y_d): integer x in 0..L-1, y as a y-grid index (Sec. 3.2)."""

    kind = "curve"

    def __init__(self, n_layers: int, cfg: GAConfig):
        cfg.validate()
        if not isinstance(n_layers, (int, np.integer)) or n_layers < cfg.n_points:
            raise PosbiasError(f"{cfg.n_points} control points with distinct integer x need n_layers >= {cfg.n_points}, "
                               f"got {n_layers!r}", "use fewer control points (`n_points`)")
        self.n_layers, self.cfg, self.grid = int(n_layers), cfg, YGrid(cfg)
        self.d = cfg.n_points - 1
        self.n_genes = 2 * cfg.n_points

    def xs(self, ind: Individual) -> tuple[int, ...]:
        return ind[0::2]

    def valid(self, ind) -> bool:
        """Integer genes, x strictly increasing in [0, L-1] (eq. 10), y index on the grid."""
        if not _is_int_tuple(ind, self.n_genes):
            return False
        xs, ys = ind[0::2], ind[1::2]
        return (0 <= xs[0] and xs[-1] <= self.n_layers - 1 and all(a < b for a, b in zip(xs, xs[1:]))
                and all(0 <= y < self.grid.n for y in ys))

    def initial(self) -> Individual:
        """Eq. 8: point k at (k(L-1)/d, y_init), x rounded half up to the integer grid.

        Since L >= d+1 the spacing (L-1)/d is >= 1, so the rounded x stay strictly increasing.
        """
        L, d = self.n_layers, self.d
        genes = []
        for k in range(d + 1):
            genes += [(2 * k * (L - 1) + d) // (2 * d), self.grid.init]  # floor(k(L-1)/d + 1/2), exact
        return tuple(genes)

    def _perturb(self, ind: Individual, rng: np.random.Generator) -> Individual:
        """One draw inside the eq. 9 box; the bounds use the *parent's* neighbouring x."""
        xs, mx, last = self.xs(ind), self.cfg.mx, self.n_layers - 1
        genes = []
        for k in range(self.d + 1):
            lo = max(xs[k - 1] if k > 0 else 0, xs[k] - mx)
            hi = min(xs[k + 1] if k < self.d else last, xs[k] + mx)
            genes += [int(rng.integers(lo, hi + 1)), self.grid.mutate(ind[2 * k + 1], rng)]
        return tuple(genes)

    def random(self, rng: np.random.Generator) -> Individual:
        """Uniform over valid individuals: a uniform (d+1)-subset of 0..L-1 as x, uniform y indices."""
        xs = np.sort(rng.choice(self.n_layers, size=self.d + 1, replace=False))
        ys = rng.integers(0, self.grid.n, size=self.d + 1)
        return tuple(int(g) for pair in zip(xs, ys) for g in pair)

    def control_points(self, ind: Individual) -> np.ndarray:
        """(d+1, 2) float array of (x, y) with y read off the grid."""
        self._require(ind)
        return np.array([[ind[2 * k], self.grid.values[ind[2 * k + 1]]] for k in range(self.d + 1)], dtype=float)

    def factors(self, ind: Individual) -> np.ndarray:
        """Per-layer factors (eqs. 5-6) with the configured curve type."""
        return layer_factors(self.control_points(ind), self.n_layers, self.cfg.curve)

    def describe(self, ind: Individual) -> dict:
        return {"control_points": [[int(x), float(y)] for x, y in self.control_points(ind)], "curve": self.cfg.curve}


class LayerSpace(_GridSpace):
    """Brute-force space of Table 7: one y-grid index per layer, no curve; every such tuple is valid."""

    kind = "layer"

    def __init__(self, n_layers: int, cfg: GAConfig):
        cfg.validate()
        if not isinstance(n_layers, (int, np.integer)) or n_layers < 1:
            raise PosbiasError(f"n_layers must be a positive integer, got {n_layers!r}", "pass the model's layer count")
        self.n_layers, self.cfg, self.grid = int(n_layers), cfg, YGrid(cfg)
        self.n_genes = self.n_layers

    def valid(self, ind) -> bool:
        return _is_int_tuple(ind, self.n_genes) and all(0 <= y < self.grid.n for y in ind)

    def initial(self) -> Individual:
        return (self.grid.init,) * self.n_layers

    def _perturb(self, ind: Individual, rng: np.random.Generator) -> Individual:
        return tuple(self.grid.mutate(y, rng) for y in ind)

    def random(self, rng: np.random.Generator) -> Individual:
        return tuple(int(y) for y in rng.integers(0, self.grid.n, size=self.n_layers))

    def factors(self, ind: Individual) -> np.ndarray:
        self._require(ind)
        return self.grid.values[list(ind)].astype(float)

    def describe(self, ind: Individual) -> dict:
        return {"factors": [float(v) for v in self.factors(ind)]}


Space = _GridSpace  # the interface both spaces implement


def crossover(a: Individual, b: Individual, rng: np.random.Generator, space: Space) -> list[Individual]:
    """Single-point crossover on the flat gene vectors (Sec. 3.2): two children, or [].

    The cut c is uniform in 1..len-1; the children are a[:c] + b[c:] and b[:c] + a[c:]. A cut
    counts only if *both* children satisfy eq. 10 (the paper compares the two children's
    fitness); otherwise they are discarded and a new cut is drawn, up to ``max_crossover_try``
    (N_ct) cuts, after which [] is returned. (For two valid curve individuals at least one
    child of every cut is valid, so requiring one valid child would make N_ct pointless.)
    """
    n = len(a)
    if len(b) != n:
        raise PosbiasError(f"crossover parents differ in length ({n} vs {len(b)})", "cross individuals of one space")
    if n < 2:
        return []
    for _ in range(space.cfg.max_crossover_try):
        c = int(rng.integers(1, n))
        kids = [a[:c] + b[c:], b[:c] + a[c:]]
        if all(space.valid(k) for k in kids):
            return kids
    return []


def select_parents(population: Sequence[Individual], fitness: Sequence[float], n: int) -> list[Individual]:
    """The n fittest individuals, best first; ties go to the earlier position in ``population``."""
    if len(population) != len(fitness):
        raise PosbiasError("population and fitness differ in length", "pass one fitness value per individual")
    if not 0 <= n <= len(population):
        raise PosbiasError(f"cannot select {n} parents from {len(population)} individuals", "lower n")
    order = sorted(range(len(population)), key=lambda i: (-fitness[i], i))
    return [population[i] for i in order[:n]]
