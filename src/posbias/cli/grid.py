"""`posbias grid`: accuracy over context size x depth of the gold item (one sweep per size)."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import GridConfig, run_grid
from .options import (
    MODEL,
    RUN,
    SCORING,
    SPLIT,
    TASK,
    Args,
    announce,
    field_option,
    method_values,
    model_fields,
    run_kwargs,
    task_fields,
    uses,
)


@uses(GridConfig, MODEL, TASK, SPLIT, SCORING, RUN.defaults(out=Path("runs/grid")))
def grid(model: Args, task: Args, split: Args, scoring: Args, run: Args,
         sizes: str = field_option(GridConfig, "sizes", "--sizes", "--lengths"),
         fill: str = field_option(GridConfig, "fill"),
         threshold: float = field_option(GridConfig, "threshold"),
         depths: str = field_option(GridConfig, "depths"),
         method: str = field_option(GridConfig, "method", values=method_values)
         ) -> None:
    """Put the gold item at each depth for each context size; a depth x length heatmap with per-cell CIs."""
    cfg = GridConfig(**model_fields(model), **task_fields(task), **vars(split), **vars(scoring), sizes=sizes,
                     depths=depths, method=method, fill=fill, threshold=threshold)
    if not run.quiet:
        typer.echo(announce(model, cfg), err=True)
    res = run_grid(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    refs = ", the closed-book and needle-alone references" if res.record.get("references") else ""
    typer.echo(f"wrote {run.out}/grid.json, heatmap.png and one sweep directory per size{refs}")
