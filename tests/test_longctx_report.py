"""The report of a depth x length grid in tokens (task niah): the heatmap marks the window fill, the references and
the effective length; the grid section adds the references, per-length ratios and shapes, and the effective length.
Records are built by hand in grid.json's layout (eval/grid.py, eval/longctx.py): no model is loaded."""

from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import pytest

from posbias.report import plots
from posbias.report.grid_plots import plot_grid_heatmap
from posbias.report.longctx_blocks import effective_bases
from posbias.report.provenance import Run
from posbias.report.sections import grid, renderer_for

SIZES, DEPTHS = [512, 1024], [0, 50, 100]
ACC = {(512, 0): 1.0, (512, 50): 0.75, (512, 100): 1.0, (1024, 0): 1.0, (1024, 50): 0.25, (1024, 100): 0.5}
SHAPES = {512: ("primacy", 0.25, 0.0), 1024: ("U", 0.625, 0.375)}


def _summary(size: int) -> dict:
    name, first, last = SHAPES[size]
    accs = [ACC[(size, d)] for d in DEPTHS]
    return {"average": sum(accs) / len(accs), "gap": max(accs) - min(accs), "gap_ci": [0.0, 0.75],
            "shape": {"shape": name, "first": {"difference": first, "ci": [first - 0.5, first + 0.25]},
                      "last": {"difference": last, "ci": [last - 0.5, last + 0.25]}}}


def _cells() -> list[dict]:
    return [{"size": s, "depth": d, "position": i, "n": 8, "correct": round(8 * ACC[(s, d)]), "accuracy": ACC[(s, d)],
             "ci_low": ACC[(s, d)] / 2, "ci_high": 1.0, "tokens_mean": s - 20.0, "same_slot_as": []}
            for s in SIZES for i, d in enumerate(DEPTHS)]


def facts_record() -> dict:
    """A grid of another task (sizes in facts): no references, no effective length, no fill."""
    sizes = [{"size": s, "dir": f"size-{s}", "positions": [0, 1, 2], "tokens": {"mean": s * 30.0, "min": 1, "max": 2},
              "summary": {"average": 0.5, "gap": 0.25, "gap_ci": [0.0, 0.5]}} for s in SIZES]
    return {"task": "facts", "size_option": "facts", "sizes": sizes, "depths": DEPTHS, "cells": _cells()}


def niah_record(effective_length: int | None) -> dict:
    """A niah grid: references, fill per length, shapes, and the effective length under both bases: NoLiMa's (1024)
    and the needle alone's (a length, 0, or None with a note)."""
    sizes = [{"size": s, "dir": f"size-{s}", "positions": [0, 500, 1000], "tokens": {"mean": s - 20.0, "min": 1, "max": 2},
              "summary": _summary(s), "fill": (s - 20.0) / 8192} for s in SIZES]
    refs = {"closed": {"n": 8, "correct": 1, "accuracy": 0.125, "ci_low": 0.022, "ci_high": 0.471},
            "needle": {"n": 8, "correct": 7, "accuracy": 0.875, "ci_low": 0.529, "ci_high": 0.978}}
    ratios = [{"length": 512, "accuracy": 0.9167, "ratio": 1.0476, "ci": [0.8, 1.3], "keeps": True},
              {"length": 1024, "accuracy": 0.5833, "ratio": 0.6667, "ci": [0.4, 0.9], "keeps": False}]
    needle = {"threshold": 0.85, "base": 0.875, "base_ci": [0.529, 0.978], "n": 8, "lengths": SIZES,
              "effective_length": effective_length, "ci": [0, 1024], "ratios": ratios}
    if effective_length is None:
        needle.update(ci=[0, 1024], base=0.0, ratios=[{**r, "ratio": None, "keeps": None, "ci": [0.0, None]} for r in ratios],
                      note="the base score is 0: no score to relate the lengths to")
    nolima = {"threshold": 0.85, "base": 0.9583, "base_ci": [0.7, 0.99], "n": 8, "lengths": SIZES, "base_lengths": SIZES,
              "effective_length": 1024, "ci": [512, 1024],
              "ratios": [{"length": 512, "accuracy": 0.9167, "ratio": 0.9565, "ci": [0.85, 1.0], "keeps": True},
                         {"length": 1024, "accuracy": 0.8333, "ratio": 0.8696, "ci": [0.7, 0.95], "keeps": True}]}
    eff = {"threshold": 0.85, "lengths": SIZES, "nolima_base": nolima, "needle_alone": needle}
    return {"task": "niah", "size_option": "tokens", "sizes": sizes, "depths": DEPTHS, "cells": _cells(),
            "references": refs, "effective": eff, "window": 8192}


CASES = {"positive": 512, "zero": 0, "none": None}


def _draw(record: dict, path: Path, monkeypatch) -> object:
    """Draw the heatmap to `path` and return the Axes it drew on (captured on the way to the file)."""
    seen = []
    real = plots.save_figure

    def keep(fig, p, *a, **kw):
        seen.append(fig)
        return real(fig, p, *a, **kw)

    monkeypatch.setattr(plots, "save_figure", keep)
    plot_grid_heatmap(record, "niah on tiny (n=8 per cell)", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
    return seen[0].axes[0]


def _dashed_at(ax) -> list[float]:
    return [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]


def _styled(ax, style: str) -> list[float]:
    return [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == style]


@pytest.mark.parametrize("case", CASES)
def test_niah_heatmap_shows_fill_references_and_effective_length(case, tmp_path, monkeypatch):
    ax = _draw(niah_record(CASES[case]), tmp_path / "heatmap.png", monkeypatch)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["512 tok\n6% of window", "1024 tok\n12% of window"]
    title = ax.get_title()
    assert "closed-book 0.12 [0.02, 0.47]" in title and "needle alone 0.88 [0.53, 0.98]" in title
    assert _dashed_at(ax) == [1.5]  # NoLiMa's base: 1024, the second column's right edge
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    if case == "positive":  # the needle alone: 512, dotted at the first column's right edge
        assert _styled(ax, ":") == [0.5]
        assert legend == ["effective length 1024 (≥85% of NoLiMa base)", "effective length 512 (≥85% of needle alone)"]
    else:
        assert _styled(ax, ":") == [] and legend == ["effective length 1024 (≥85% of NoLiMa base)"]
    assert ("no length keeps 85% of the needle alone score" in title) == (case == "zero")
    assert ("no effective length vs needle alone: the base score is 0" in title) == (case == "none")


def test_heatmap_of_another_grid_keeps_its_labels_and_marks_nothing(tmp_path, monkeypatch):
    ax = _draw(facts_record(), tmp_path / "heatmap.png", monkeypatch)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["512 facts\n~15360 tok", "1024 facts\n~30720 tok"]
    assert ax.get_title() == "niah on tiny (n=8 per cell)"
    assert _dashed_at(ax) == [] and ax.get_legend() is None


def _render(record: dict, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    plot_grid_heatmap(record, "grid", folder / "heatmap.png")
    assert renderer_for("grid") is grid
    return html.unescape(renderer_for("grid")(Run(folder, "grid", {"kind": "grid"}, record, "grid.json")))


def _row(page: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first` (tags stripped)."""
    m = re.search(rf"<tr><td[^>]*>{re.escape(first)}</td>(.*?)</tr>", page)
    assert m, f"no row {first!r}"
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", m.group(1))]


@pytest.mark.parametrize("case", CASES)
def test_niah_grid_section_has_references_lengths_and_effective_length(case, tmp_path):
    page = _render(niah_record(CASES[case]), tmp_path / case)
    assert _row(page, "closed-book")[:2] == ["0.125", "[0.022, 0.471]"]
    assert _row(page, "needle alone")[:2] == ["0.875", "[0.529, 0.978]"]
    assert _row(page, "NoLiMa base (lengths 512, 1024)")[:2] == ["0.958", "[0.700, 0.990]"]
    assert "ratio to NoLiMa base" in page and "keeps ≥85% of needle alone" in page
    assert "average accuracy (all-or-nothing)" in page and "RULER partial credit" not in page  # one value asked
    long, short = _row(page, "1024"), _row(page, "512")
    assert long[1] == "12.3%" and long[11] == "+0.375 [-0.125, +0.625]"
    assert short[9] == "primacy" and long[9] == "U"
    assert short[3:6] == ["0.957", "[0.850, 1.000]", "yes"] and long[5] == "yes"  # NoLiMa's base
    assert re.search(r"<p>Effective length vs NoLiMa base \([^<]*\): 1024 tokens of the model's 8192-token window, "
                     r"95% CI \[512, 1024\] tokens", page)
    if case == "positive":
        assert short[6:9] == ["1.048", "[0.800, 1.300]", "yes"] and long[8] == "no"
        assert re.search(r"<p>Effective length vs needle alone \([^<]*\): 512 tokens of the model's 8192-token "
                         r"window, 95% CI \[0, 1024\] tokens", page)
    elif case == "zero":
        assert re.search(r"<p>Effective length vs needle alone \([^<]*\): 0 tokens — no length keeps 85% of the "
                         r"needle alone score; 95% CI \[0, 1024\]", page)
    else:
        assert short[6:9] == ["-", "[0.000, -]", "-"]
        assert "<p>Effective length vs needle alone: none — the base score is 0: no score to relate" in page
    assert "heatmap.png" in page


def test_a_grid_from_before_the_two_bases_reads_as_the_needle_alone(tmp_path):
    """grid.json written with one base (the needle alone, `short_context`) renders under its own name."""
    rec = niah_record(512)
    old = rec["effective"]["needle_alone"]
    rec["effective"] = {**{k: v for k, v in old.items() if k not in ("base", "base_ci", "n")}, "short_context": 0.875}
    assert list(effective_bases(rec["effective"])) == ["needle_alone"]
    page = _render(rec, tmp_path / "old")
    assert "Effective length vs needle alone" in page and "NoLiMa base" not in page


def test_a_grid_without_a_length_up_to_1k_says_nolima_s_base_is_unavailable(tmp_path, monkeypatch):
    rec = niah_record(512)
    rec["effective"]["nolima_base"] = {"threshold": 0.85, "base": None, "effective_length": None, "ci": None,
                                       "ratios": [], "base_lengths": [], "note": "no grid length is <= 1024 tokens "
                                       "(NoLiMa's base is the task's own accuracy at 250, 500 and 1K tokens): add 1k to "
                                       "the lengths"}
    page = _render(rec, tmp_path / "none")
    assert "<p>Effective length vs NoLiMa base: none — no grid length is <= 1024 tokens" in page
    assert _row(page, "NoLiMa base (lengths none <= 1K: unavailable)")[0] == "-"
    ax = _draw(rec, tmp_path / "h.png", monkeypatch)
    assert "no effective length vs NoLiMa base: no grid length is <= 1024 tokens" in ax.get_title()


def test_partial_credit_is_a_column_of_its_own_when_several_values_are_asked(tmp_path):
    rec = niah_record(512)
    for s, v in zip(rec["sizes"], (0.9, 0.7)):
        s["partial"] = v
    page = _render(rec, tmp_path / "mv")
    assert "RULER partial credit (share of values found)" in page
    assert _row(page, "512")[2:4] == ["0.917", "0.900"] and _row(page, "1024")[3] == "0.700"


def test_another_grid_renders_without_the_niah_sections(tmp_path):
    page = _render(facts_record(), tmp_path / "facts")
    assert "accuracy [95% CI] (slot) per depth and context size" in page and "512 facts (~492 tok)" in page
    assert _row(page, "512 facts")[:2] == ["15360", "0.500"]
    for absent in ("closed-book", "needle alone", "Effective length", "fill of window", "primacy"):
        assert absent not in page


def test_a_niah_record_without_the_long_keys_renders_as_before(tmp_path):
    """An older tokens grid (no references/effective/fill) gets no niah blocks and the plain ticks."""
    rec = niah_record(512)
    for k in ("references", "effective", "window"):
        rec.pop(k)
    plain = copy.deepcopy(rec)
    page = _render(rec, tmp_path / "old")
    assert "closed-book" not in page and "Effective length" not in page
    assert rec == plain
