"""The collapse guard of `compare`, chance-aware: on a free-answer task a method that loses more than the margin at any
position is flagged; on every task one whose average falls to chance while the first entry's is above it (or lies
below chance); the first entry is the reference and never flagged. On an order task a decision rule that trades the
favourite slot's inflated score for balance is not a collapse."""

from __future__ import annotations

from posbias.eval.compare import _flag_collapse, format_compare


def _entry(label, accs, ci=None):
    per = [{"position": p, "accuracy": a, "ci_low": 0.0, "ci_high": 1.0} for p, a in enumerate(accs)]
    avg = sum(accs) / len(accs)
    return {"label": label, "per_position": per, "summary": {"average": avg, "gap": max(accs) - min(accs),
                                                             "gap_ci": [0.0, 1.0], "average_ci": ci or [avg, avg]}}


def test_a_slot_loss_above_the_margin_is_flagged_and_one_within_is_not():
    rows = [_entry("none", [1.0, 0.2, 0.5]), _entry("ok", [0.95, 0.4, 0.5]), _entry("bad", [0.85, 0.6, 0.6])]
    _flag_collapse(rows, 0.10, 0.0)
    assert [r["collapse"]["flagged"] for r in rows] == [False, False, True]
    assert rows[2]["collapse"]["worst_position"] == "0" and abs(rows[2]["collapse"]["worst_drop"] - 0.15) < 1e-9
    table = format_compare({"config": {"model": "m"}, "methods": rows})
    assert "COLLAPSED bad: position 0 loses 0.150" in table and "COLLAPSED ok" not in table


def test_an_average_at_chance_is_flagged_even_without_a_large_slot_loss():
    rows = [_entry("none", [0.3, 0.25, 0.3, 0.25]), _entry("guess", [0.25, 0.25, 0.25, 0.25])]
    _flag_collapse(rows, 0.10, 0.25)
    assert rows[1]["collapse"]["flagged"] and "chance" in rows[1]["collapse"]["reasons"][0]
    assert not rows[0]["collapse"]["flagged"]


def test_on_an_order_task_trading_the_favourite_slot_is_not_a_collapse():
    """docs/order-bias.md: the judge picks the first answer (1.00 / 0.02); swap and PriDe balance the slots."""
    rows = [_entry("none", [1.0, 0.02], [0.49, 0.53]), _entry("swap", [0.5, 0.5], [0.36, 0.64]),
            _entry("pride", [0.3, 0.68], [0.44, 0.54])]
    _flag_collapse(rows, 0.10, 0.5, order=True)
    assert not any(r["collapse"]["flagged"] for r in rows)
    assert [r["collapse"]["at_chance"] for r in rows] == [True, True, True]
    table = format_compare({"config": {"model": "m"}, "methods": rows})
    assert "COLLAPSED" not in table and "at chance" in table and "chance 0.500" in table


def test_on_an_order_task_falling_to_chance_from_above_or_below_chance_is_a_collapse():
    rows = [_entry("none", [1.0, 0.7], [0.78, 0.92]), _entry("swap", [0.8, 0.8], [0.72, 0.88]),
            _entry("broken", [0.5, 0.52], [0.41, 0.61]), _entry("wrong", [0.1, 0.1], [0.04, 0.18])]
    _flag_collapse(rows, 0.10, 0.5, order=True)
    assert [r["collapse"]["flagged"] for r in rows] == [False, False, True, True]
    assert "at chance (0.500), where none is above it" in rows[2]["collapse"]["reasons"][0]
    assert "below chance" in rows[3]["collapse"]["reasons"][0]


def test_a_baseline_at_chance_is_a_floor_not_a_collapse_and_the_rule_has_no_knife_edge():
    """The old rule flagged a baseline at exactly 0.250 on four options and passed 0.255."""
    rows = [_entry("none", [0.0, 0.0, 1.0, 0.0], [0.25, 0.25]), _entry("pride", [0.2, 0.12, 0.58, 0.12], [0.22, 0.29])]
    _flag_collapse(rows, 0.10, 0.25, order=True)
    assert [r["collapse"]["flagged"] for r in rows] == [False, False]
    assert [r["collapse"]["at_chance"] for r in rows] == [True, True]
