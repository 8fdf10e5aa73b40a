import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posbias.core.metrics import best_subspan_em, normalize_answer, substring_match, summarize_curve
from posbias.core.stats import exact_ci, wilson_ci


def test_normalize_answer_follows_squad():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("  Wilhelm Conrad Röntgen. ") == "wilhelm conrad röntgen"


def test_best_subspan_em():
    assert best_subspan_em("It was Wilhelm Conrad Röntgen, in 1901.", ["Wilhelm Conrad Röntgen"])
    assert best_subspan_em("the answer: PARIS", ["Paris", "London"])
    assert not best_subspan_em("Lyon", ["Paris"])
    # only the first line counts
    assert not best_subspan_em("I think\nParis", ["Paris"])
    # articles dropped on both sides
    assert best_subspan_em("surface of enamel", ["the surface of the enamel"])


def test_substring_match_first_line_only():
    assert substring_match(" 771204.", ["771204"])
    assert not substring_match(" 77120", ["771204"])
    assert not substring_match("no\n771204", ["771204"])


def test_wilson_ci_known_values():
    lo, hi = wilson_ci(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert wilson_ci(0, 10)[0] == 0.0 and wilson_ci(10, 10)[1] == 1.0


@pytest.mark.parametrize("interval", [wilson_ci, exact_ci], ids=["wilson", "clopper-pearson"])
@settings(max_examples=50, deadline=None)
@given(k=st.integers(0, 300), extra=st.integers(0, 300))
def test_interval_contains_estimate(interval, k, extra):
    """Wilson's and Clopper-Pearson's (the per-slot interval) hold the estimate, within [0, 1]."""
    n = k + extra
    if n == 0:
        return
    lo, hi = interval(k, n)
    assert 0 <= lo <= k / n <= hi <= 1


def test_summarize_curve():
    m = np.array([[1, 0, 1], [1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)
    s = summarize_curve([0, 5, 9], m)
    assert s.best == 1.0 and s.best_position == 0
    assert s.worst == 0.25 and s.worst_position == 5
    assert s.gap == 0.75
    assert s.average == pytest.approx((1 + 0.25 + 0.5) / 3)
    assert s.std == pytest.approx(np.std([1, 0.25, 0.5]))
    assert s.gap_ci[0] <= s.gap <= s.gap_ci[1]
    assert summarize_curve([0, 5, 9], m).gap_ci == s.gap_ci  # seeded: reproducible


def test_paired_difference_power_figure_by_hand():
    """16 examples, one position: b gains on 4 (d = 1), loses on none. Agresti-Min's pseudo-pairs at 95% (w = z^2/8 at
    +1 and at -1, 2w at 0): n' = 16 + 4w, mean 4/n', second moment (4 + 2w)/n', se = sqrt((that - mean^2)/n');
    mde80 = 2.8016 * se. Never 0, unlike the plain sample sd on 16 equal rows."""
    import numpy as np

    from posbias.core.metrics import paired_difference

    a = np.zeros((16, 1), dtype=bool)
    b = a.copy()
    b[:4] = True
    r = paired_difference(a, b)
    assert r["difference"] == 0.25
    w = 1.959963984540054**2 / 8
    n = 16 + 4 * w
    se = ((4 + 2 * w) / n - (4 / n) ** 2) ** 0.5 / n**0.5
    assert abs(r["se"] - se) < 1e-12 and abs(r["mde80"] - 2.8016 * se) < 1e-12


@pytest.mark.parametrize("rates, shape", [
    ((0.9, 0.2, 0.2, 0.2, 0.9), "U"), ((0.9, 0.2, 0.2, 0.2, 0.2), "primacy"), ((0.2, 0.2, 0.2, 0.2, 0.9), "recency"),
    ((0.5, 0.5, 0.5, 0.5, 0.5), "flat"), ((0.0, 0.0, 0.0, 0.0, 0.0), "flat"), ((0.1, 0.8, 0.8, 0.8, 0.1), "middle"),
])
def test_curve_shape_reads_the_edges_against_the_interior(rates, shape):
    from posbias.core.metrics import curve_shape, format_shape

    rng = np.random.default_rng(0)
    correct = rng.random((200, len(rates))) < np.array(rates)
    got = curve_shape([0, 1, 2, 3, 4], correct)
    assert got["shape"] == shape and format_shape(got).startswith(f"shape {shape} (first - interior")
    # the columns' order does not matter: the slots say where each one sits
    order = [3, 0, 4, 1, 2]
    assert curve_shape(order, correct[:, np.argsort(np.argsort(order))])["shape"] == shape


def test_curve_shape_needs_three_single_slots():
    from posbias.core.metrics import curve_shape

    m = np.ones((10, 2), dtype=bool)
    assert curve_shape([0, 1], m) is None and curve_shape(["0:1", "1:0", "2:2"], np.ones((10, 3))) is None
