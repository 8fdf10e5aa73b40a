"""The collapse guard of `compare`: a method that loses more than the margin at any position, or whose average is
at chance, is flagged in compare.json and in the printed table."""

from __future__ import annotations

from posbias.eval.compare import _flag_collapse, format_compare


def _entry(label, accs):
    per = [{"position": p, "accuracy": a, "ci_low": 0.0, "ci_high": 1.0} for p, a in enumerate(accs)]
    return {"label": label, "per_position": per,
            "summary": {"average": sum(accs) / len(accs), "gap": max(accs) - min(accs), "gap_ci": [0.0, 1.0]}}


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
