"""`posbias moice train`: train MoICE routers (the model frozen); `--method moice:OUT` applies them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import MoICEConfig, train_moice
from .options import MODEL, RUN, SPLIT, TASK, Args, field_option, floats, model_fields, run_kwargs, task_fields, uses

moice_app = typer.Typer(no_args_is_help=True)  # help: the callback's docstring


@moice_app.callback()
def _moice_group() -> None:
    """MoICE: routers that mix attention over several RoPE bases (trained)."""


@moice_app.command()
@uses(MoICEConfig, MODEL, TASK, SPLIT.defaults(n=None, skip=None), RUN.defaults(out=Path("runs/moice")))
def train(
    model: Args, task: Args, split: Args, run: Args,
    preset: str = typer.Option("cpu", help="cpu (2-core budget: 6 steps x 4 examples, lr 1e-2; mitigate/moice/config.py) "
                                           "| paper (train.sh: 7 steps x 32, lr 1e-4)"),
    steps: Optional[int] = field_option(MoICEConfig, "steps", default=None),
    batch: Optional[int] = field_option(MoICEConfig, "batch", default=None),
    micro_batch: int = field_option(MoICEConfig, "micro_batch"),
    lr: Optional[float] = field_option(MoICEConfig, "lr", default=None),
    top_k: Optional[int] = field_option(MoICEConfig, "top_k", default=None),
    bases: Optional[str] = field_option(MoICEConfig, "bases"),
    aux: Optional[float] = field_option(MoICEConfig, "aux_coef", default=None),
    router_seed: int = field_option(MoICEConfig, "router_seed"),
) -> None:
    """Train per-head MoICE routers on the task's training split; write OUT/moice.json and OUT/routers.safetensors.
    Options left unset take the preset's values.

    The split is examples SKIP.. (default 3000, or three quarters into a file task's pool); sweeps use examples 0.."""
    cfg = MoICEConfig.from_preset(preset, **model_fields(model), **task_fields(task), **vars(split), steps=steps, batch=batch,
                                  micro_batch=micro_batch, lr=lr, top_k=top_k,
                                  bases=floats(bases, None, "bases", "100000,175000,250000"),
                                  aux_coef=aux, router_seed=router_seed)
    if not run.quiet:
        typer.echo(f"loading {model.model} ({model.dtype}, {model.device}) ...", err=True)
    res = train_moice(cfg, run.out, **run_kwargs(run))
    rec = res.record
    typer.echo(f"{rec['steps']} steps of {cfg.batch} examples, {rec['seconds'] / 60:.1f} min; "
               f"loss {rec['first_loss']:.4f} -> {rec['last_loss']:.4f} (ce {res.losses[0]['ce']:.4f} -> {res.losses[-1]['ce']:.4f})")
    typer.echo(f"bases {', '.join(f'{b:g}' for b in rec['bases'])}; top-k {rec['top_k']}")
    typer.echo(f"wrote {run.out}/moice.json; use it with --method moice:{run.out}")
