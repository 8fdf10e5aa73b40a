"""docs/python-api.md runs as written: its `python` blocks in order in one namespace, in a scratch directory, on the
real default model (loaded once per session); its "not run here" `py` blocks at least compile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import posbias

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_names_every_main_entry_point_and_its_blocks_compile():
    text = DOC.read_text()
    for name in ("load_model", "wrap_model", "run_sweep", "run_compare", "get_task", "register_task", "get_method",
                 "register_method", "lpes.run_search", "distill.run_distill", "moice.run_train", "hidden.run_search",
                 "run_grid", "explain.run_attention", "explain.run_theory", "build_report", "PosbiasError"):
        assert f"posbias.{name}" in text, name
    for b in blocks("python") + blocks("py"):
        compile(b, str(DOC), "exec")


@pytest.fixture
def registries():
    """The page registers a task and a method: both registries are restored afterwards (the conformance suites
    iterate over every registered method)."""
    saved = [(r, dict(r), dict(r.origins)) for r in (posbias.TASKS, posbias.METHODS)]
    yield
    for registry, entries, origins in saved:
        registry.clear(), registry.update(entries)
        registry.origins.clear(), registry.origins.update(origins)


@pytest.mark.real
def test_the_python_api_page_runs(one_load, registries, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "python_api_doc"}
    for block in blocks("python"):
        exec(compile(block, str(DOC), "exec"), ns)
    out = capsys.readouterr().out
    assert "my-smollm2" in out and "pi:1.1" in out and "must be slots" in out
    toy = ns["toy"]  # scaling the logits changes no greedy verdict: the curve is the same
    assert toy.entries[0]["per_position"] == toy.entries[1]["per_position"]
    for d in ("api-sweep", "api-compare", "api-grid", "api-attention", "api-theory"):
        assert any((tmp_path / "runs" / d).glob("*.json")), d
    assert (tmp_path / "runs" / "api-report.html").exists()
