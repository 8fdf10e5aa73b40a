"""`posbias hidden search`: find the positional hidden channel and its scale; `--method hidden:OUT` applies it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..hidden import SearchConfig, run_search
from .options import MODEL, RUN, SCORING, SPLIT, TASK, Args, floats, ints, model_fields, run_kwargs, task_fields, uses

hidden_app = typer.Typer(no_args_is_help=True, help="Positional hidden-channel scaling: find the channel (training-free).")


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
@uses(MODEL, TASK, SPLIT.defaults(n=None, skip=None), SCORING, RUN.defaults(out=Path("runs/hidden")))
def search(
    model: Args, task: Args, split: Args, scoring: Args, run: Args,
    preset: str = typer.Option("cpu", help="cpu (2-core budget; docs/hidden.md) | paper (the public search_dims.py)"),
    samples: Optional[int] = typer.Option(None, help="random-text sequences averaged (preset; paper 200)"),
    length: Optional[int] = typer.Option(None, help="tokens per sequence (preset; paper 1000)"),
    top_k: Optional[int] = typer.Option(None, help="candidate channels scored on the task (preset; paper 10)"),
    scales: Optional[str] = typer.Option(None, help="factors tried per candidate, e.g. 0,-1 (preset; paper 0.5,0,-0.5,-1)"),
    layers: Optional[str] = typer.Option(None, help="decoder layers scaled, a-b (default: the paper's middle layers)"),
    positions: Optional[str] = typer.Option(None, help="calibration slots (default 0, middle, last)"),
    select: Optional[str] = typer.Option(None, help="accuracy (loss breaks ties) | loss (preset; paper loss)"),
) -> None:
    """Average hidden states over random text, keep the smoothest monotone channels, and score each with each
    scale on a calibration split; write OUT/hidden.json.

    The split is examples SKIP.. (default 1500, or the last N of a file task's pool); sweeps use examples 0.."""
    pos = floats(positions, None, "positions")
    cfg = SearchConfig.from_preset(preset, **model_fields(model), **task_fields(task), **vars(split), **vars(scoring),
                                   samples=samples, length=length, top_k=top_k, scales=floats(scales, None, "scales"),
                                   layers=_layers(layers), select=select,
                                   positions=tuple(int(x) for x in pos) if pos else None)
    if not run.quiet:
        typer.echo(f"loading {model.model} ({model.dtype}, {model.device}) ...", err=True)
    res = run_search(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/hidden.json; use it with --methods none,hidden:{run.out}")
