"""`posbias report RUN_DIR... --out report.html`: one self-contained HTML page from finished run folders."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import build_report


def report(
    runs: list[Path] = typer.Argument(..., help="finished run folders (any kind: sweep, compare, lpes search, distill, "
                                      "theory, synth, analyses, grid); a folder holding run folders adds each of them"),
    out: Path = typer.Option(Path("report.html"), help="the HTML file to write"),
    title: Optional[str] = typer.Option(None, help="page title (default: posbias report)"),
) -> None:
    """One static, self-contained HTML page (figures embedded, no network, no script) from finished run folders:
    curves with CI, tables with paired differences, heatmaps, factor and training curves, provenance."""
    res = build_report(runs, out, title)
    typer.echo(res.format())
