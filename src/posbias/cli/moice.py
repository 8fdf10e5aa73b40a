"""`posbias moice train`: train MoICE routers (the model frozen); `--method moice:OUT` applies them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..moice import TrainConfig, run_train
from .options import MODEL, RUN, SPLIT, TASK, Args, announce, field_option, floats, model_fields, run_kwargs, task_fields, uses

moice_app = typer.Typer(no_args_is_help=True)  # help: the callback's docstring


@moice_app.callback()
def _moice_group() -> None:
    """MoICE: routers that mix attention over several RoPE bases (trained)."""


@moice_app.command()
@uses(TrainConfig, MODEL, TASK, SPLIT.defaults(n=None, skip=None), RUN.defaults(out=Path("runs/moice")))
def train(
    model: Args, task: Args, split: Args, run: Args,
    preset: str = typer.Option("cpu", help="cpu (2-core budget: 6 steps x 4 examples, lr 1e-2; mitigate/moice/config.py) "
                                           "| paper (train.sh: 7 steps x 32, lr 1e-4)"),
    steps: Optional[int] = field_option(TrainConfig, "steps", default=None),
    batch: Optional[int] = field_option(TrainConfig, "batch", default=None),
    micro_batch: int = field_option(TrainConfig, "micro_batch"),
    lr: Optional[float] = field_option(TrainConfig, "lr", default=None),
    top_k: Optional[int] = field_option(TrainConfig, "top_k", default=None),
    bases: Optional[str] = field_option(TrainConfig, "bases"),
    aux: Optional[float] = field_option(TrainConfig, "aux_coef", default=None),
    router_seed: int = field_option(TrainConfig, "router_seed"),
) -> None:
    """Train per-head MoICE routers on the task's training split; write OUT/moice.json and OUT/routers.safetensors.
    Options left unset take the preset's values.

    The split is examples SKIP.. (default 3000, or three quarters into a file task's pool); sweeps use examples 0.."""
    cfg = TrainConfig.from_preset(preset, **model_fields(model), **task_fields(task), **vars(split), steps=steps, batch=batch,
                                 micro_batch=micro_batch, lr=lr, top_k=top_k,
                                 bases=floats(bases, None, "bases", "100000,175000,250000"),
                                 aux_coef=aux, router_seed=router_seed)
    if not run.quiet:
        typer.echo(announce(model, cfg), err=True)
    res = run_train(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/moice.json; use it with --method moice:{run.out}")
