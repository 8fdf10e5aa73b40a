"""Command line: a typer shell over the public API (`posbias/__init__.py`), nothing else.

Options shared by several commands are declared once (options.py); library errors name Python
parameters in backticks, which `main` turns into the commands' flags.
"""

from __future__ import annotations

import sys

import typer

from .. import PosbiasError, set_threads
from .explain import synth_app, theory
from .measure import compare, models, sweep, tasks
from .mitigate import distill_app, lpes_app

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="posbias: measure, explain and mitigate position bias in transformer LLMs.",
)
for command in (sweep, compare, theory, tasks, models):
    app.command()(command)
app.add_typer(synth_app, name="synth")
app.add_typer(lpes_app, name="lpes")
app.add_typer(distill_app, name="distill")

# Python parameter -> flag, where the flag is not --the-parameter-name
_FLAGS = {"n_parents": "--parents", "n_crossover": "--crossovers", "n_mutation": "--mutations", "n_points": "--points"}
_FLAG_VALUES = {("correct_only", "False"): "--keep-all", ("correct_only", "True"): "--correct-only",
                ("lora", "False"): "--full"}


def flag(name: str, value: str | None) -> str:
    """How the CLI spells the library parameter `name` (with `value`): `n=5` -> --n 5, `resume=True` -> --resume."""
    if (name, value) in _FLAG_VALUES:
        return _FLAG_VALUES[(name, value)]
    f = _FLAGS.get(name, "--" + name.replace("_", "-"))
    return f if value in (None, "True") else f"{f} {value}"


@app.callback()
def _root() -> None:
    """posbias: measure, explain and mitigate position bias in transformer LLMs."""


def main() -> None:
    set_threads()
    try:
        app()
    except PosbiasError as e:
        typer.echo(f"posbias: error: {e.render(flag)}", err=True)
        sys.exit(2)
