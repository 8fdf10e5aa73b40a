"""core.theorems / core.theorems_pe: the paper's Sec. 4 predictions hold on seeded instances."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posbias.analysis import checks as CH
from posbias.analysis import theorems as TH
from posbias.analysis import theorems_pe as PE
from posbias.core import rollout as R

SEEDS = (0, 1, 2)


pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: one thread is faster


def assert_holds(res: dict):
    failing = [k for k, v in res["checks"].items() if not v]
    assert res["holds"] and not failing, (res["theorem"], failing)
    json.dumps(res)  # plain numbers only


@pytest.mark.parametrize("seed", SEEDS)
def test_thm_4_1_causal(seed):
    res = TH.check_causal(seed=seed)
    assert_holds(res)
    assert res["sink_mass"][-1] > 0.999 and res["max_bound_ratio"] <= 1


@pytest.mark.parametrize("seed", SEEDS)
def test_thm_4_2_sliding_window(seed):
    res = TH.check_sliding_window(seed=seed)
    assert_holds(res)
    t_conv = [r["t_conv"] for r in res["rows"]]
    assert t_conv[0] > 4 * t_conv[-1]  # w = 2 is far slower than the causal mask (w = N)


@pytest.mark.parametrize("seed", SEEDS)
def test_thm_4_3_prefix(seed):
    res = TH.check_prefix(seed=seed, k=4)
    assert_holds(res)
    assert res["kappa_measured"] >= res["kappa_bound"] > 0
    assert sum(res["final_shares"]) == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize("seed", SEEDS)
def test_lemma_4_4_thm_4_5_decay(seed):
    res = PE.check_decay_mask(seed=seed)
    assert_holds(res)
    for r in res["rows"]:
        assert abs(r["argmax"] - r["x_star"]) <= 1 + 0.1 * r["x_star"]


@pytest.mark.parametrize("seed", SEEDS)
def test_lemma_4_6_thm_4_7_rope(seed):
    res = PE.check_rope(seed=seed)
    assert_holds(res)
    assert res["n_sink_rows"] < len(res["rows"])  # most rows have an interior peak to locate


def test_stronger_scores_still_hold():
    assert_holds(TH.check_causal(seed=5, weight_norm=2.0, n_layers=60))
    assert_holds(TH.check_prefix(seed=5, k=8, weight_norm=2.0, n_layers=60))
    assert_holds(PE.check_decay_mask(seed=5, weight_norm=2.0, ms=(0.3, 0.8), depths=(2, 6, 12)))


def test_failures_are_reported_not_hidden():
    shallow = TH.check_causal(n_layers=2, seed=0)
    assert not shallow["holds"] and shallow["checks"] == {
        "bound_j": True, "deficit_bound": True, "monotone": True, "support": True, "converged": False}
    too_shallow = TH.check_sliding_window(n_layers=20, seed=0)
    assert not too_shallow["checks"]["converged"] and too_shallow["rows"][0]["t_conv"] is None


def test_check_all_runs():
    out = CH.check_all(seed=0)
    assert set(out) == {"4.1", "4.2", "4.3", "4.4-4.5", "4.6-4.7"}
    assert all(r["holds"] for r in out.values())
    json.dumps(out)


# ---------------------------------------------------------------- the prediction formulas


@pytest.mark.parametrize("m,t", [(0.223, 3), (0.5, 5), (1.0, 7), (0.3, 10)])
def test_decay_x_star_is_exact_mode_for_constant_scores(m, t):
    """Zero Q/K weights: far from the sink P^(t)_{i, i-x} is negative binomial, mode floor(x*)."""
    n = 200
    layers = R.random_attention_layers(n, t + 1, R.causal_mask(n), weight_norm=0.0, decay_m=m)
    p = R.rollout(layers)
    prof = PE.distance_profile(p, torch.arange(n - 10, n), n - 9)
    assert int(prof.argmax()) == math.floor(PE.decay_critical_distance(t, m))
    shape = torch.exp(PE.log_binom(t, torch.arange(n - 9.0)) - torch.arange(n - 9.0) * m)
    ratio = prof[:60] / shape[:60]  # Theta with constant ratio (1 - e^-m)^(t+1) away from the sink
    torch.testing.assert_close(ratio, torch.full_like(ratio, (-math.expm1(-m)) ** (t + 1)))


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 60), theta=st.floats(1e-3, 0.3), c=st.floats(0.1, 20))
def test_rope_x_star_root_and_trends(t, theta, c):
    x = PE.rope_critical_distance(t, theta, c)
    assert abs(math.log1p(t / x) - 2 * c * theta**2 * x) < 1e-6 * max(1.0, math.log1p(t / x))
    assert PE.rope_critical_distance(t + 1, theta, c) > x  # App. H: dx*/dt > 0
    assert PE.rope_critical_distance(t, theta * 1.1, c) < x  # App. H: dx*/dtheta1 < 0


@settings(max_examples=30, deadline=None)
@given(t=st.integers(0, 40), m=st.floats(0.05, 3.0))
def test_decay_x_star_is_stirling_critical_point(t, m):
    x = PE.decay_critical_distance(t, m)
    assert math.log1p(t / x) == pytest.approx(m, rel=1e-9) if t else x == 0


def test_hops_and_bounds_shapes():
    assert TH.hops(33, 2) == 32 and TH.hops(33, 5) == 8 and TH.hops(33, 33) == 1 and TH.hops(10, 4) == 3
    b = TH.decay_bound(0.01, 5, 6)
    assert b.shape == (5, 6) and (b[:, 0] == 1).all() and b[0, 1] == pytest.approx(0.99)
    bb = TH.block_bound(0.5, 3, 7, 4)
    assert (bb[:2] == 1).all() and bb[2, 1] == pytest.approx(1 - 0.125)
