"""`posbias data list | fetch | path | verify`: the benchmark data sets, fetched from their pinned public originals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .. import PosbiasError
from ..data import DATASETS, fetch, listing, require, verify
from .options import cli_option

data_app = typer.Typer(no_args_is_help=True)  # help: the callback's docstring

DATA_DIR = typer.Option(None, "--data-dir", help="a folder of your own to read (and fetch into) instead of $POSBIAS_DATA "
                                                 "or the user cache")


@data_app.callback()
def _data_group() -> None:
    """Benchmark data sets (NQ, kv-uuid, MuSiQue): where each is read from, and fetching them from their pinned public
    originals (docs/data.md)."""


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@data_app.command("list")
def list_(data_dir: Optional[Path] = DATA_DIR,
          as_json: bool = typer.Option(False, "--json", help="print the listing as JSON")) -> None:
    """Each data set: what it is, its sources (repository@commit), licence, size, the tasks that read it, and whether
    it is here (and where)."""
    rows = listing(data_dir)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        here = f"here: {r['here']}" if r["here"] else f"not here: posbias data fetch {r['name']}"
        typer.echo(f"{r['name']:8s} {here}  ({_mb(r['size'])}; download {_mb(r['download'])})")
        typer.echo(f"  {r['description']}")
        typer.echo(f"  sources: {', '.join(r['sources'])}")
        typer.echo(f"  licence: {r['licence']}")
        typer.echo(f"  read by: {r['tasks']}")


@data_app.command("fetch")
def fetch_(names: List[str] = typer.Argument(..., help=f"data sets to fetch ({', '.join(DATASETS)}), or all"),
           data_dir: Optional[Path] = DATA_DIR,
           base: Optional[str] = typer.Option(None, "--base-url", help="a mirror of GitHub's raw file layout "
                                                             "(BASE/OWNER/REPO/COMMIT/PATH); default $POSBIAS_DATA_URL, "
                                                             "else https://raw.githubusercontent.com"),
           retries: int = typer.Option(2, min=0, help="further tries of a download that failed"),
           quiet: bool = cli_option("quiet", False, "--quiet")) -> None:
    """Download each named data set's pinned originals, rebuild our copy of each file from them where it is a
    selection, and check every file's SHA-256; what is already there and matches is kept (nothing downloaded)."""
    states = fetch(names, data_dir, base=base, retries=retries, show_progress=not quiet)
    for s in states:
        typer.echo(s.line())
    got = sum(s.status != "present" for s in states)
    typer.echo(f"{got} of {len(states)} files fetched, {len(states) - got} already here and verified; "
               f"read from {states[0].path.parents[1] if states else data_dir}")


@data_app.command("path")
def path(name: str = typer.Argument(..., help="a data set"), data_dir: Optional[Path] = DATA_DIR) -> None:
    """Where a task reads data set NAME from (the first folder in the lookup order that holds it): each file's path."""
    folder = require(name, data_dir)
    for f in DATASETS[name].files:
        typer.echo(str(folder / f.name))


@data_app.command("verify")
def verify_(names: Optional[List[str]] = typer.Argument(None, help="data sets to check (default: all)"),
            data_dir: Optional[Path] = DATA_DIR) -> None:
    """Check each file where a task would read it against its pinned SHA-256 (a flipped byte fails)."""
    states = verify(names or ["all"], data_dir)
    for s in states:
        typer.echo(s.line())
    bad = [s for s in states if s.status == "mismatch"]
    missing = sorted({s.dataset for s in states if s.status == "missing"})
    if bad:
        sets = " ".join(sorted({s.dataset for s in bad}))
        raise PosbiasError(f"{len(bad)} file(s) do not match their pinned SHA-256 ({', '.join(s.file for s in bad)})",
                           f"run `posbias data fetch {sets}` to replace them (a copy you keep yourself: fetch it again)")
    if missing and names:
        raise PosbiasError(f"data set(s) {', '.join(missing)} not here",
                           f"get them with `posbias data fetch {' '.join(missing)}`")
    typer.echo(f"{sum(s.status != 'missing' for s in states)} files match their pinned SHA-256"
               + (f"; not here: {', '.join(missing)}" if missing else ""))
