"""`posbias hidden search`: find the positional hidden channel and its scale; `--method hidden:OUT` applies it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..hidden import SearchConfig, run_search
from .options import (
    MODEL,
    RUN,
    SCORING,
    SPLIT,
    TASK,
    Args,
    announce,
    field_option,
    floats,
    ints,
    model_fields,
    run_kwargs,
    task_fields,
    uses,
)

hidden_app = typer.Typer(no_args_is_help=True)  # help: the callback's docstring


@hidden_app.callback()
def _hidden_group() -> None:
    """Positional hidden-channel scaling: find the channel (training-free)."""


def _layers(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """`a-b` (inclusive) or `a,b,c`."""
    if text is None:
        return None
    a, dash, b = text.partition("-")
    if dash and a.isdigit() and b.isdigit():
        return tuple(range(int(a), int(b) + 1))
    return tuple(ints(text, "layers") or ())


@hidden_app.command()
@uses(SearchConfig, MODEL, TASK, SPLIT.defaults(n=None, skip=None), SCORING, RUN.defaults(out=Path("runs/hidden")))
def search(
    model: Args, task: Args, split: Args, scoring: Args, run: Args,
    preset: str = typer.Option("cpu", help="cpu (2-core budget: 48 samples of 384 tokens, 4 candidates, scales 0,-1, "
                                           "16 examples; docs/hidden.md) | paper (the public search_dims.py)"),
    samples: Optional[int] = field_option(SearchConfig, "samples", default=None),
    length: Optional[int] = field_option(SearchConfig, "length", default=None),
    top_k: Optional[int] = field_option(SearchConfig, "top_k", default=None),
    scales: Optional[str] = field_option(SearchConfig, "scales", default=None),
    layers: Optional[str] = field_option(SearchConfig, "layers"),
    positions: Optional[str] = field_option(SearchConfig, "positions"),
    select: Optional[str] = field_option(SearchConfig, "select", default=None),
) -> None:
    """Average hidden states over random text, keep the smoothest monotone channels, and score each with each
    scale on a calibration split; write OUT/hidden.json. Options left unset take the preset's values.

    The split is examples SKIP.. (default 1500, or the last N of a file task's pool); sweeps use examples 0.."""
    pos = floats(positions, None, "positions")
    cfg = SearchConfig.from_preset(preset, **model_fields(model), **task_fields(task), **vars(split), **vars(scoring),
                                   samples=samples, length=length, top_k=top_k, scales=floats(scales, None, "scales"),
                                   layers=_layers(layers), select=select,
                                   positions=tuple(int(x) for x in pos) if pos else None)
    if not run.quiet:
        typer.echo(announce(model, cfg), err=True)
    res = run_search(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/hidden.json; use it with --methods none,hidden:{run.out}")
