"""The README's Python example runs as written (on the real default model, in a scratch directory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_a_python_example():
    blocks = python_blocks()
    assert blocks and all("import posbias" in b for b in blocks)


@pytest.mark.real
def test_the_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert (tmp_path / "runs" / "api-sweep" / "sweep.json").exists()
    assert (tmp_path / "runs" / "api-compare" / "compare.json").exists()
    assert "mspoe:1-1.2" in printed and "pi:1.1" in printed
