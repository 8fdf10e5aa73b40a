"""`posbias lpes search` and `posbias distill r1`: mitigations that search or train (the sweep and
compare commands apply their results). Multi-GPU: `accelerate launch -m posbias.cli distill r1 ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..distill import DistillConfig, run_distill
from ..lpes import SearchConfig, run_gain, run_search
from .options import (
    FIELD,
    MODEL,
    RUN,
    SCORING,
    SPLIT,
    TASK,
    Args,
    Group,
    Opt,
    announce,
    cli_option,
    field_default,
    field_option,
    floats,
    ints,
    model_fields,
    run_kwargs,
    task_fields,
    uses,
)

lpes_app = typer.Typer(no_args_is_help=True, help="LPES: search per-layer RoPE scaling factors (training-free).")
distill_app = typer.Typer(no_args_is_help=True)  # help: the callback's docstring


@distill_app.callback()
def _distill_group() -> None:
    """Train a model to lose its position bias (Pos2Distill, SFT, SeqKD)."""


GA = "Genetic algorithm (Table 12; unset: the preset's)"


def _ga(name: str, default: object = FIELD) -> typer.Option:
    """An option of the GA's settings (SearchConfig.ga): GAConfig's default, or None: the preset's."""
    return field_option(SearchConfig, f"ga.{name}", default=default, rich_help_panel=GA)


@lpes_app.command()
@uses(SearchConfig, MODEL, TASK, SPLIT.defaults(n=None, skip=None), SCORING, RUN.defaults(out=Path("runs/lpes")))
def search(
    model: Args, task: Args, split: Args, scoring: Args, run: Args,
    preset: str = typer.Option("cpu", help="cpu (2-core budget: 24 examples, 5 generations, factors 1.0-1.5 step 0.05; "
                                           "docs/lpes.md) | paper (Sec. 4.1, Table 12: 200 examples, 20 generations, "
                                           "factors 1.0-2.0 step 0.1)"),
    positions: Optional[str] = field_option(SearchConfig, "positions"),
    weights: str = field_option(SearchConfig, "weights", default=",".join(map(str, field_default(SearchConfig, "weights")))),
    space: str = field_option(SearchConfig, "space"),
    budget: Optional[int] = field_option(SearchConfig, "budget"),
    curve: str = _ga("curve"),
    points: int = _ga("n_points"),
    generations: Optional[int] = _ga("generations", None),
    pop_size: int = _ga("pop_size"),
    parents: int = _ga("n_parents"),
    crossovers: int = _ga("n_crossover"),
    mutations: int = _ga("n_mutation"),
    mx: int = _ga("mx"),
    my: Optional[float] = _ga("my", None),
    y_min: Optional[float] = _ga("y_min", None),
    y_max: Optional[float] = _ga("y_max", None),
    y_step: Optional[float] = _ga("y_step", None),
    y_init: Optional[float] = _ga("y_init", None),
) -> None:
    """Search per-layer RoPE factors (Algorithm 1) on a search split; write OUT/factors.json. Options left unset
    take the preset's values.

    The split is examples SKIP.. (default 1000, or the last N of a file task's pool); sweeps use examples 0.."""
    pos = ints(positions, "positions", "0,MIDDLE,LAST", 3)
    ga = dict(curve=curve, n_points=points, generations=generations, pop_size=pop_size, n_parents=parents,
              n_crossover=crossovers, n_mutation=mutations, mx=mx, my=my, y_min=y_min, y_max=y_max, y_step=y_step,
              y_init=y_init, seed=split.seed)
    cfg = SearchConfig.from_preset(preset, ga=ga, **model_fields(model), **task_fields(task), **vars(split), **vars(scoring),
                                   positions=tuple(pos) if pos else None,
                                   weights=floats(weights, 3, "weights", "0.2,0.3,0.5"), space=space, budget=budget)
    if not run.quiet:
        typer.echo(announce(model, cfg), err=True)
    res = run_search(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/factors.json and factors.png; use it with --method lpes:{run.out}/factors.json")


@lpes_app.command()
def gain(
    dirs: list[Path] = typer.Argument(..., help="`posbias compare` folders: the same methods at different context lengths"),
    out: Path = cli_option("out", Path("runs/lpes-gain"), more=" (gain.json, gain.png)"),
    overwrite: bool = cli_option("overwrite", False, "--overwrite"),
) -> None:
    """Gain of each method over the unmodified model (paired 95% CI) against prompt length -> OUT/gain.png."""
    res = run_gain(dirs, out, overwrite=overwrite)
    typer.echo(res.format())
    typer.echo(f"wrote {out}/gain.json and gain.png")


TRAIN = Group(  # DistillConfig's fields
    "train", "Training",
    preset=Opt(),
    k=Opt(None, type=Optional[int]),
    anchor=Opt(type=Optional[str]),
    correct_only=Opt(type=bool, flags=("--correct-only/--keep-all",)),
    lora=Opt(type=bool, flags=("--lora/--full",)),
    lr=Opt(type=Optional[float]),
    batch_size=Opt(type=int),
    micro_batch=Opt(type=int),
    gradient_checkpointing=Opt(type=bool, flags=("--gradient-checkpointing",)),
    epochs=Opt(type=float),
    max_steps=Opt(type=int),
    max_new_tokens=Opt(type=Optional[int]),
    save_steps=Opt(type=int),
)


def _distill(stage: str, model: Args, task: Args, split: Args, train: Args, run: Args, **method) -> None:
    cfg = DistillConfig.from_preset(train.preset, stage=stage, **model_fields(model), **task_fields(task), **vars(split),
                                    **{k: v for k, v in vars(train).items() if k != "preset"}, **method)
    if not run.quiet:
        typer.echo(announce(model, cfg), err=True)
    res = run_distill(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {res.model_dir}; evaluate it with: posbias sweep --model {res.model_dir} --task {task.task}")


@distill_app.command()
@uses(DistillConfig, MODEL, TASK, SPLIT.defaults(n=None, skip=None), TRAIN, RUN.defaults(out=Path("runs/distill")))
def r1(
    model: Args, task: Args, split: Args, train: Args, run: Args,
    method: str = field_option(DistillConfig, "method"),
    ablation: str = field_option(DistillConfig, "ablation"),
    lam: float = field_option(DistillConfig, "lam"),
    anchor_copy: bool = field_option(DistillConfig, "anchor_copy", "--anchor-copy/--no-anchor-copy"),
) -> None:
    """Retrieval: distil the anchor slot's behaviour into the other slots (Sec. 4.2); write OUT/model.

    The training split starts at --skip (default 2000, or half a file task's pool); sweeps use examples 0.."""
    _distill("r1", model, task, split, train, run, method=method, ablation=ablation, lam=lam, anchor_copy=anchor_copy)


@distill_app.command()
@uses(DistillConfig, MODEL, TASK.defaults(task="kv-2hop"), SPLIT.defaults(n=None, skip=None), TRAIN,
      RUN.defaults(out=Path("runs/distill-r2")))
def r2(
    model: Args, task: Args, split: Args, train: Args, run: Args,
    method: str = field_option(DistillConfig, "method"),
) -> None:
    """Reasoning: train on the chain of thought of the advantageous two-hop placement at K other placements
    (Sec. 4.3); write OUT/model. Tasks: kv-2hop, musique, two-hop jsonl."""
    _distill("r2", model, task, split, train, run, method=method)
