"""The README's examples run as written, on the real default model, in a scratch directory: its Python blocks
executed, and its command-line quickstart run line by line through `posbias.cli.main`. The model is loaded once
per session (the `smollm2` fixture stands in for each load of smollm2-135m in bf16 on the CPU)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(lang: str, text: str | None = None) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text() if text is None else text, flags=re.S)


def cli_quickstart() -> list[list[str]]:
    """The commands of the README's "Quickstart on the command line" block, as argv lists."""
    section = README.read_text().split("## Quickstart on the command line", 1)[1].split("\n## ", 1)[0]
    (block,) = blocks("bash", section)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def test_the_readme_has_a_python_quickstart_and_three_cli_lines():
    py = blocks("python")
    assert py and all("import posbias" in b for b in py)
    assert any("jsonl:" in b and "open(" in b for b in py)  # a sweep of the reader's own JSONL file, written in place
    lines = cli_quickstart()
    assert len(lines) == 3 and all(argv[0] == "posbias" for argv in lines)


@pytest.mark.real
def test_the_readme_python_quickstart_runs(one_load, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for block in blocks("python"):
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert (tmp_path / "runs" / "mine" / "sweep.json").exists() and (tmp_path / "runs" / "mine" / "curve.png").exists()
    assert "average" in printed and "gap" in printed  # format_table's summary line


@pytest.mark.real
def test_the_readme_cli_quickstart_runs(one_load, tmp_path, monkeypatch, capsys):
    from posbias.cli import main

    monkeypatch.chdir(tmp_path)
    for argv in cli_quickstart():
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code == 0, (argv, capsys.readouterr().err)
    assert (tmp_path / "runs" / "first" / "sweep.json").exists()
    assert (tmp_path / "runs" / "first-cmp" / "compare.json").exists()
    assert (tmp_path / "runs" / "first.html").exists()
