"""Command line: a typer shell over the public API (`posbias/__init__.py`), nothing else.

Options shared by several commands are declared once (options.py); library errors name Python
parameters in backticks, which `main` turns into the commands' flags.
"""

from __future__ import annotations

import os
import sys

import typer

from .. import PosbiasError
from ..measure import is_main_process, set_threads

try:  # typer >= 0.20 carries its own copy of click; older ones use click itself
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import NoArgsIsHelpError, UsageError
from .data import data_app
from .explain import analyze_app, synth_app, theory
from .grid import grid
from .hidden import hidden_app
from .measure import backends, compare, export, methods, models, show, sweep, tasks
from .mitigate import distill_app, lpes_app
from .moice import moice_app
from .policy import policy_app
from .report import report

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,  # help: _root's docstring
)
for command in (sweep, compare, show, grid, theory, tasks, methods, models, backends, export, report):
    app.command()(command)
app.add_typer(synth_app, name="synth")
app.add_typer(lpes_app, name="lpes")
app.add_typer(distill_app, name="distill")
app.add_typer(moice_app, name="moice")
app.add_typer(hidden_app, name="hidden")
app.add_typer(analyze_app, name="analyze")
app.add_typer(policy_app, name="policy")
app.add_typer(data_app, name="data")

# Python parameter -> flag, where the flag is not --the-parameter-name
_FLAGS = {"n_parents": "--parents", "n_crossover": "--crossovers", "n_mutation": "--mutations", "n_points": "--points",
          "n_tokens": "--tokens", "n_items": "--items", "n_classes": "--classes", "n_labels": "--labels",
          "component_std": "--std", "eval_seqs": "--eval-seqs", "aux_coef": "--aux", "template": "--judge-template",
          "base": "--base-url"}
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
    """The `posbias` command: every failure is one line on stderr, exit 2 for bad input, 130 for an interrupt."""
    set_threads()
    if not is_main_process():  # under accelerate launch every rank runs the command; rank 0 prints the tables
        sys.stdout = open(os.devnull, "w")
    try:
        code = app(standalone_mode=False)
    except PosbiasError as e:
        _fail(f"posbias: error: {e.render(flag)}", 2)
    except NoArgsIsHelpError as e:  # `posbias lpes`: the group's help, as click would show it
        typer.echo(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(0)
    except UsageError as e:  # an unknown option, a value of the wrong type, a missing command
        where = e.ctx.command_path if e.ctx else "posbias"
        _fail(f"posbias: error: {e.format_message()} -- see {where} --help", 2)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    if code == 130:  # typer turns Ctrl-C into exit code 130
        _fail("\nposbias: interrupted -- what was finished is kept: rerun the same command with --resume to continue"
              " (synth commands continue without it)", 130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    typer.echo(message, err=True)
    sys.exit(code)
