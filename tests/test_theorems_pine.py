"""PINE's attention pattern in the rollout view (analysis/theorems_pine.py): the documents' influence on the last
token is the same under every order of the documents with PINE's mask, and the same check fails on the causal mask."""

from __future__ import annotations

import pytest

from posbias.analysis.theorems_pine import MOVES, TOL, check_pine, invariant


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pine_mask_makes_influence_order_invariant_and_the_causal_mask_does_not(seed):
    r = check_pine(seed=seed)
    assert r["holds"] and r["checks"] == {"pine_invariant": True, "causal_depends_on_order": True}, r
    assert r["spread_pine"] <= TOL < MOVES < r["spread_causal"]


def test_the_invariance_check_fails_on_the_causal_mask():
    spread, runs = invariant("causal")
    assert spread > MOVES and len(runs) == 24
    spread, _ = invariant("pine")
    assert spread <= TOL
