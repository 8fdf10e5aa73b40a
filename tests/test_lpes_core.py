"""LPES maths core: Bezier layer curves (Sec. 3.1, App. D) and the constrained GA (Sec. 3.2, Alg. 1)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posbias.core import bezier as B
from posbias.core.ga import (
    CurveSpace,
    GAConfig,
    GeneticSearch,
    LayerSpace,
    crossover,
    select_parents,
)
from posbias.core.ga_random import RandomSearch
from posbias.errors import PosbiasError

CORE = Path(__file__).resolve().parents[1] / "src" / "posbias" / "core"
FAST = settings(max_examples=60, deadline=None)


def test_lpes_core_never_imports_transformers_or_torch():
    for name in ("bezier.py", "ga.py", "ga_random.py", "ga_space.py"):
        tree = ast.parse((CORE / name).read_text())
        mods = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
        mods += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not any(m.split(".")[0] in ("transformers", "torch") for m in mods), name


# ---------------------------------------------------------------- Bezier curves

@st.composite
def increasing_ctrl(draw, max_points=6):
    """Control points with strictly increasing x (eq. 10) and arbitrary y."""
    n = draw(st.integers(2, max_points))
    x0 = draw(st.floats(-50, 50))
    gaps = draw(st.lists(st.floats(0.05, 20), min_size=n - 1, max_size=n - 1))
    ys = draw(st.lists(st.floats(0.5, 3.0), min_size=n, max_size=n))
    return np.column_stack([x0 + np.concatenate([[0.0], np.cumsum(gaps)]), ys])


def test_bernstein_partition_of_unity_and_values():
    t = np.linspace(0, 1, 11)
    assert np.allclose(sum(B.bernstein(3, k, t) for k in range(4)), 1.0)
    assert B.bernstein(3, 1, 0.5) == pytest.approx(3 * 0.5 * 0.25)  # eq. 4
    with pytest.raises(PosbiasError):
        B.bernstein(3, 4, 0.5)


@FAST
@given(increasing_ctrl())
def test_bezier_end_points(ctrl):
    assert np.allclose(B.bezier(ctrl, 0.0), ctrl[0])
    assert np.allclose(B.bezier(ctrl, 1.0), ctrl[-1])
    assert B.bezier(ctrl, np.linspace(0, 1, 5)).shape == (5, 2)


@settings(max_examples=150, deadline=None)
@given(increasing_ctrl(), st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_t_of_x_inverts_x_of_t(ctrl, fracs):
    x = ctrl[0, 0] + (ctrl[-1, 0] - ctrl[0, 0]) * np.array(fracs)
    t = B.t_of_x(ctrl, x)
    assert np.all((t >= 0) & (t <= 1))
    assert np.max(np.abs(B.bezier(ctrl, t)[:, 0] - x)) < 1e-9


def test_t_of_x_errors():
    with pytest.raises(PosbiasError, match="strictly increasing"):
        B.t_of_x([[0, 1], [5, 1], [5, 2], [9, 1]], 3.0)
    with pytest.raises(PosbiasError, match="x must lie"):
        B.t_of_x([[0, 1], [9, 1]], 10.0)
    with pytest.raises(PosbiasError, match="shape"):
        B.bezier(np.zeros((3, 3)), 0.5)


def test_layer_abscissae_eq6():
    xs = B.layer_abscissae([[2, 1.0], [5, 1.2], [11, 1.0]], 4)
    assert np.allclose(xs, [2, 5, 8, 11])
    assert B.layer_abscissae([[2, 1.0], [5, 1.2]], 1).tolist() == [2.0]


@pytest.mark.parametrize("curve", B.CURVES)
@FAST
@given(ctrl=increasing_ctrl(), n_layers=st.integers(1, 40), y=st.sampled_from([1.0, 1.25, 1.7, 2.0]))
def test_constant_y_gives_constant_factors(curve, ctrl, n_layers, y):
    ctrl = ctrl.copy()
    ctrl[:, 1] = y
    f = B.layer_factors(ctrl, n_layers, curve)
    assert f.shape == (n_layers,) and f.dtype == float
    assert np.allclose(f, y, atol=1e-12)


def test_linear_and_step_curves():
    ctrl = [[0, 1.0], [3, 1.6], [9, 1.0]]
    # L = 10 puts x_h on 0..9 (eq. 6)
    assert np.allclose(B.layer_factors(ctrl, 10, "linear"), [1.0, 1.2, 1.4, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0])
    assert B.layer_factors(ctrl, 10, "step").tolist() == [1.0] * 3 + [1.6] * 6 + [1.0]
    # L = 4 puts x_h on 0, 3, 6, 9: the step reaches the point at x = 3 exactly
    assert B.layer_factors(ctrl, 4, "step").tolist() == [1.0, 1.6, 1.6, 1.0]
    with pytest.raises(PosbiasError, match="unknown curve"):
        B.layer_factors(ctrl, 4, "spline")


def test_bezier_factors_match_direct_formula():
    ctrl = np.array([[0, 1.0], [3, 2.0], [6, 1.0], [9, 1.5]])
    f = B.layer_factors(ctrl, 10)
    assert f[0] == pytest.approx(1.0) and f[-1] == pytest.approx(1.5)
    # equal x gaps make x(t) linear, so x_h = 9t and s_h = y(h/9) (eqs. 5, 13)
    t = np.arange(10) / 9
    y = (1 - t) ** 3 * 1.0 + 3 * (1 - t) ** 2 * t * 2.0 + 3 * (1 - t) * t**2 * 1.0 + t**3 * 1.5
    assert np.allclose(f, y, atol=1e-9)


# ---------------------------------------------------------------- config and spaces

def test_gaconfig_defaults_are_table12_and_roundtrip():
    cfg = GAConfig().validate()
    assert (cfg.pop_size, cfg.n_parents, cfg.generations, cfg.n_mutation, cfg.n_crossover) == (32, 12, 20, 16, 4)
    assert (cfg.max_crossover_try, cfg.mx, cfg.my, cfg.n_points) == (4, 2, 0.2, 4)
    assert GAConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    GAConfig(y_min=1.0, y_max=1.3, y_step=0.05, y_init=1.1).validate()


@pytest.mark.parametrize("kwargs, match", [
    ({"n_parents": 10}, "add up"),
    ({"n_points": 1, }, "n_points"),
    ({"y_init": 1.55}, "not on the y grid"),
    ({"y_init": 2.5}, "outside"),
    ({"y_step": 0.3}, "whole number"),
    ({"curve": "spline"}, "unknown `curve`"),
    ({"mx": 1.5}, "integer"),
    ({"y_min": 0.0, "y_init": 1.0}, "y_min"),
    ({"max_crossover_try": 0}, "max_crossover_try"),
])
def test_gaconfig_validation_errors(kwargs, match):
    with pytest.raises(PosbiasError, match=match):
        GAConfig(**kwargs).validate()


def test_gaconfig_from_dict_rejects_unknown_keys():
    with pytest.raises(PosbiasError, match="unknown GAConfig keys"):
        GAConfig.from_dict({"pop_sise": 3})


def test_initial_individual_eq8():
    cfg = GAConfig()
    space = CurveSpace(30, cfg)
    ind = space.initial()  # k * 29 / 3 = 0, 9.67, 19.33, 29 -> rounded half up
    assert ind == (0, 5, 10, 5, 19, 5, 29, 5)
    assert space.describe(ind) == {"control_points": [[0, 1.5], [10, 1.5], [19, 1.5], [29, 1.5]], "curve": "bezier"}
    assert np.allclose(space.factors(ind), 1.5)
    assert CurveSpace(4, cfg).initial()[0::2] == (0, 1, 2, 3)
    assert LayerSpace(5, cfg).initial() == (5,) * 5
    with pytest.raises(PosbiasError):
        CurveSpace(3, cfg)


def test_small_y_range_grid():
    cfg = GAConfig(y_min=1.0, y_max=1.3, y_step=0.05, y_init=1.1)
    space = CurveSpace(12, cfg)
    assert space.grid.values.tolist() == [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3]
    assert space.grid.radius == 4  # M_y = 0.2 is 4 steps of 0.05
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert np.all(space.factors(space.random(rng)) <= 1.3 + 1e-12)


@st.composite
def curve_individual(draw):
    n_points = draw(st.integers(2, 5))
    n_layers = draw(st.integers(n_points, 40))
    cfg = GAConfig(n_points=n_points, mx=draw(st.integers(0, 4)), my=draw(st.sampled_from([0.0, 0.1, 0.2, 0.35])))
    space = CurveSpace(n_layers, cfg)
    return space, space.random(np.random.default_rng(draw(st.integers(0, 2**32))))


@FAST
@given(curve_individual(), st.integers(0, 2**32))
def test_curve_mutation_respects_eq9_eq10_and_grid(space_ind, seed):
    space, parent = space_ind
    rng = np.random.default_rng(seed)
    xs, ys, d, r = parent[0::2], parent[1::2], space.d, space.grid.radius
    for _ in range(5):
        child = space.mutate(parent, rng)
        assert space.valid(child)
        cx, cy = child[0::2], child[1::2]
        assert all(a < b for a, b in zip(cx, cx[1:]))  # eq. 10
        for k in range(d + 1):
            lo = max(xs[k - 1] if k else 0, xs[k] - space.cfg.mx)
            hi = min(xs[k + 1] if k < d else space.n_layers - 1, xs[k] + space.cfg.mx)
            assert lo <= cx[k] <= hi  # eq. 9, x
            assert max(0, ys[k] - r) <= cy[k] <= min(space.grid.n - 1, ys[k] + r)  # eq. 9, y
        assert np.all((space.factors(child) >= 1.0 - 1e-12) & (space.factors(child) <= 2.0 + 1e-12))


@FAST
@given(curve_individual(), st.integers(0, 2**32))
def test_crossover_children_are_valid(space_ind, seed):
    space, a = space_ind
    rng = np.random.default_rng(seed)
    b = space.random(rng)
    kids = crossover(a, b, rng, space)
    assert len(kids) in (0, 2) and all(space.valid(k) for k in kids)
    if kids:  # single-point: a prefix of one parent and the tail of the other
        c = next((i for i in range(1, len(a)) if kids[0] == a[:i] + b[i:]), None)
        assert c is not None and kids[1] == b[:c] + a[c:]


def test_crossover_gives_up_after_n_ct_tries():
    space = CurveSpace(10, GAConfig(n_points=2))
    a, b = (0, 0, 1, 0), (8, 1, 9, 1)  # cuts 1 and 2 break eq. 10 in one child; cut 3 swaps y_1 only
    outcomes = {tuple(crossover(a, b, np.random.default_rng(s), space)) for s in range(40)}
    assert outcomes == {(), ((0, 0, 1, 1), (8, 1, 9, 0))}  # [] after N_ct = 4 bad cuts, (2/3)^4 of the time


@FAST
@given(st.integers(1, 30), st.sampled_from([0.0, 0.1, 0.2]), st.integers(0, 2**32))
def test_layer_space_operators(n_layers, my, seed):
    space = LayerSpace(n_layers, GAConfig(my=my))
    rng = np.random.default_rng(seed)
    a, b = space.random(rng), space.random(rng)
    child = space.mutate(a, rng)
    assert space.valid(child)
    assert all(abs(c - p) <= space.grid.radius for c, p in zip(child, a))
    assert all(space.valid(k) for k in crossover(a, b, rng, space))
    assert space.factors(child).shape == (n_layers,)


def test_select_parents_ties_by_first_occurrence():
    pop = [(0,), (1,), (2,), (3,), (4,)]
    assert select_parents(pop, [0.5, 0.9, 0.9, 0.1, 0.5], 3) == [(1,), (2,), (0,)]
    with pytest.raises(PosbiasError):
        select_parents(pop, [0.1], 1)


# ---------------------------------------------------------------- search

N_LAYERS = 16
TARGET = CurveSpace(N_LAYERS, GAConfig()).factors((0, 2, 4, 8, 11, 3, 15, 6))


class Fitness:
    """Synthetic fitness: minus the RMS distance of the layer factors to TARGET; records every call."""

    def __init__(self, space):
        self.space, self.seen, self.calls = space, [], 0

    def __call__(self, inds):
        self.calls += 1
        self.seen += inds
        return [-float(np.sqrt(np.mean((self.space.factors(i) - TARGET) ** 2))) for i in inds]


def _search(cfg, n_layers=N_LAYERS, space_cls=CurveSpace):
    space = space_cls(n_layers, cfg)
    fit = Fitness(space)
    return GeneticSearch(space, cfg, fit), fit


def _strip(history):
    return [{k: v for k, v in h.items() if k != "wall_s"} for h in history]


def test_ga_improves_and_never_evaluates_twice():
    ga, fit = _search(GAConfig(generations=12, seed=3))
    entries = []
    best_ind = ga.run(on_generation=entries.append)
    res = ga.result()
    assert best_ind == res.individual and entries == ga.history and ga.steps_done == ga.total_steps == 13
    assert len(set(fit.seen)) == len(fit.seen) == ga.n_evaluations  # the cache works
    assert fit.calls == 13  # S_0, then one batch per generation
    assert ga.cache_hits > 0 and len(ga.history) == 13
    best = [h["best_fitness"] for h in ga.history]
    assert all(b2 >= b1 for b1, b2 in zip(best, best[1:]))  # parents survive (elitism)
    assert -best[-1] < 0.5 * -best[0]  # distance to the target at least halved
    assert res.fitness == best[-1] and res.individual == tuple(ga.history[-1]["best"])
    assert len(ga.population) == 32 and all(ga.space.valid(i) for i in ga.population)
    assert len(res.factors) == N_LAYERS and res.generations == 12


def test_ga_is_seeded_and_deterministic():
    runs = [_search(GAConfig(generations=5, seed=s))[0] for s in (7, 7, 8)]
    results = [(r.run(), r.result()) for r in runs]
    assert results[0] == results[1]
    assert _strip(runs[0].history) == _strip(runs[1].history)
    assert _strip(runs[0].history) != _strip(runs[2].history)


@pytest.mark.parametrize("space_cls", [CurveSpace, LayerSpace])
def test_resume_equals_uninterrupted_run(space_cls):
    cfg = GAConfig(generations=7, seed=11)
    full, _ = _search(cfg, space_cls=space_cls)
    full.run()
    want = full.result()

    saved = {}
    killed, _ = _search(cfg, space_cls=space_cls)

    def save_then_die(entry):
        saved["state"] = json.dumps(killed.state_dict())
        if entry["generation"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        killed.run(on_generation=save_then_die)

    resumed, fit = _search(cfg, space_cls=space_cls)
    resumed.load_state_dict(json.loads(saved["state"]))
    assert resumed.steps_done == 4
    resumed.run()
    assert resumed.result() == want
    assert _strip(resumed.history) == _strip(full.history)
    assert resumed.cache == full.cache and resumed.population == full.population
    saved_keys = {tuple(ind) for ind, _ in json.loads(saved["state"])["cache"]}
    assert fit.seen and not set(fit.seen) & saved_keys  # nothing evaluated before the kill is evaluated again


def test_load_state_rejects_other_config_but_lets_a_run_grow():
    ga, _ = _search(GAConfig(generations=2))
    assert ga.step()["generation"] == 0 and ga.step()["generation"] == 1
    other, _ = _search(GAConfig(generations=2, mx=1))
    with pytest.raises(PosbiasError, match="config"):
        other.load_state_dict(json.loads(json.dumps(ga.state_dict())))
    short, _ = _search(GAConfig(generations=2, seed=5))
    short.run()
    longer, _ = _search(GAConfig(generations=4, seed=5))
    longer.load_state_dict(json.loads(json.dumps(short.state_dict())))  # more generations: continue
    longer.run()
    whole, _ = _search(GAConfig(generations=4, seed=5))
    whole.run()
    assert _strip(longer.history) == _strip(whole.history) and longer.result() == whole.result()


def test_zero_generations_and_step_after_done():
    ga, fit = _search(GAConfig(generations=0))
    best = ga.run()
    assert len(ga.history) == 1 and fit.calls == 1 and best in ga.population
    with pytest.raises(PosbiasError):
        ga.step()


def test_initial_population_eq8_plus_mutations():
    ga, _ = _search(GAConfig())
    pop = ga.population
    assert pop[0] == ga.space.initial() and len(set(pop)) == 32
    with pytest.raises(PosbiasError, match="distinct"):
        _search(GAConfig(my=0.0, mx=0), n_layers=4)


def test_evaluate_errors():
    space = CurveSpace(8, GAConfig())
    with pytest.raises(PosbiasError, match="values"):
        GeneticSearch(space, GAConfig(), lambda inds: [0.0]).run()
    with pytest.raises(PosbiasError, match="NaN"):
        GeneticSearch(space, GAConfig(), lambda inds: [math.nan] * len(inds)).run()


def test_random_search_budget_cache_and_resume():
    cfg = GAConfig(seed=5)
    space = CurveSpace(N_LAYERS, cfg)
    fit = Fitness(space)
    rs = RandomSearch(space, cfg, fit, budget=70)
    rs.run()
    res = rs.result()
    assert rs.total_steps == 3 and rs.n_evaluations == 70 == len(set(fit.seen)) and len(rs.history) == 3
    assert res.fitness == max(rs.cache.values())
    bests = [h["best_fitness"] for h in rs.history]
    assert bests == sorted(bests)

    part = RandomSearch(space, cfg, Fitness(space), budget=70)
    part.step()
    again = RandomSearch(space, cfg, Fitness(space), budget=70)
    again.load_state_dict(json.loads(json.dumps(part.state_dict())))
    assert again.run() == res.individual and again.result() == res and _strip(again.history) == _strip(rs.history)


def test_converged_at_is_the_first_generation_with_the_final_best():
    from posbias.mitigate.lpes.search import converged_at

    hist = lambda *b: [{"generation": g, "best_fitness": f} for g, f in enumerate(b)]  # noqa: E731
    assert converged_at(hist(0.4, 0.5, 0.5, 0.5)) == 1  # nothing better after generation 1
    assert converged_at(hist(0.4, 0.45, 0.5)) == 2 and converged_at(hist(0.5)) == 0 and converged_at([]) is None
