"""`posbias moice train`: train MoICE routers (the model frozen); `--method moice:OUT` applies them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..moice import TrainConfig, run_train
from .options import MODEL, RUN, SPLIT, TASK, Args, floats, model_fields, run_kwargs, task_fields, uses

moice_app = typer.Typer(no_args_is_help=True, help="MoICE: routers that mix attention over several RoPE bases (trained).")


@moice_app.callback()
def _moice_group() -> None:
    """MoICE: routers that mix attention over several RoPE bases (trained)."""


@moice_app.command()
@uses(MODEL, TASK, SPLIT.defaults(n=None, skip=None), RUN.defaults(out=Path("runs/moice")))
def train(
    model: Args, task: Args, split: Args, run: Args,
    preset: str = typer.Option("cpu", help="cpu (2-core budget; mitigate/moice/config.py) | paper (train.sh: 7 x 32, lr 1e-4)"),
    steps: Optional[int] = typer.Option(None, help="optimizer steps (preset)"),
    batch: Optional[int] = typer.Option(None, help="examples per step (preset; paper 32)"),
    micro_batch: int = typer.Option(4, help="examples per forward (memory only)"),
    lr: Optional[float] = typer.Option(None, help="AdamW learning rate, constant (preset; paper 1e-4)"),
    top_k: Optional[int] = typer.Option(None, help="experts kept per token and head (preset; paper 7)"),
    bases: Optional[str] = typer.Option(None, help="RoPE bases B1,... of the main kind (default: the paper's 7 scaled to theta)"),
    aux: Optional[float] = typer.Option(None, help="load-balancing loss coefficient (paper 0.3)"),
    router_seed: int = typer.Option(0, help="router initialisation seed"),
) -> None:
    """Train per-head MoICE routers on the task's training split; write OUT/moice.json and OUT/routers.safetensors.

    The split is examples SKIP.. (default 3000, or three quarters into a file task's pool); sweeps use examples 0.."""
    cfg = TrainConfig.from_preset(preset, **model_fields(model), **task_fields(task), **vars(split), steps=steps, batch=batch,
                                 micro_batch=micro_batch, lr=lr, top_k=top_k,
                                 bases=floats(bases, None, "bases", "100000,175000,250000"),
                                 aux_coef=aux, router_seed=router_seed)
    if not run.quiet:
        typer.echo(f"loading {model.model} ({model.dtype}, {model.device}) ...", err=True)
    res = run_train(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/moice.json; use it with --method moice:{run.out}")
