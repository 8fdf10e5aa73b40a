"""`posbias lpes search` and `posbias distill r1`: mitigations that search or train (the sweep and
compare commands apply their results). Multi-GPU: `accelerate launch -m posbias.cli distill r1 ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..distill import DistillConfig, run_distill
from ..lpes import SearchConfig, run_gain, run_search
from .options import (MODEL, RUN, SCORING, SPLIT, TASK, Args, Group, Opt, default, floats, ints, model_fields, run_kwargs,
                      task_fields, uses)

lpes_app = typer.Typer(no_args_is_help=True, help="LPES: search per-layer RoPE scaling factors (training-free).")
distill_app = typer.Typer(no_args_is_help=True, help="Train a model to lose its position bias (Pos2Distill, SFT, SeqKD).")


@distill_app.callback()
def _distill_group() -> None:
    """Train a model to lose its position bias (Pos2Distill, SFT, SeqKD)."""


GA = "Genetic algorithm (Table 12)"


def _ga(**kw) -> typer.Option:
    return typer.Option(rich_help_panel=GA, **kw)


@lpes_app.command()
@uses(MODEL, TASK, SPLIT.defaults(n=None, skip=None), SCORING, RUN.defaults(out=Path("runs/lpes")))
def search(
    model: Args, task: Args, split: Args, scoring: Args, run: Args,
    preset: str = typer.Option("cpu", help="cpu (2-core budget; see docs/lpes.md) | paper (Sec. 4.1, Table 12)"),
    positions: Optional[str] = typer.Option(None, help="beginning,middle,end slots (default 0, middle, last)"),
    weights: str = typer.Option(",".join(map(str, default("weights", SearchConfig))),
                                help="lambda_B,lambda_M,lambda_E"),
    space: str = typer.Option(default("space", SearchConfig),
                              help="curve (Bezier GA) | layers (GA per layer: brute force) | random"),
    budget: Optional[int] = typer.Option(None, help="random search: individuals to draw"),
    curve: str = _ga(default="bezier", help="bezier | linear | step (Table 6)"),
    points: int = _ga(default=4, help="control points (Table 7: 2-5; 4 = cubic)"),
    generations: Optional[int] = _ga(default=None, help="GA generations (preset; paper 20)"),
    pop_size: int = _ga(default=32, help="population size"),
    parents: int = _ga(default=12, help="parents kept per generation"),
    crossovers: int = _ga(default=4, help="crossover offspring per generation"),
    mutations: int = _ga(default=16, help="mutation offspring per generation"),
    mx: int = _ga(default=2, help="max x change of a control point"),
    my: Optional[float] = _ga(default=None, help="max y change of a control point (preset; paper 0.2)"),
    y_min: Optional[float] = _ga(default=None, help="smallest factor (preset; paper 1.0)"),
    y_max: Optional[float] = _ga(default=None, help="largest factor (preset; paper 2.0)"),
    y_step: Optional[float] = _ga(default=None, help="factor grid step (preset; paper 0.1)"),
    y_init: Optional[float] = _ga(default=None, help="factor of the initial individual (preset; eq. 8: 1.5)"),
) -> None:
    """Search per-layer RoPE factors (Algorithm 1) on a search split; write OUT/factors.json.

    The split is examples SKIP.. (default 1000, or the last N of a file task's pool); sweeps use examples 0.."""
    pos = ints(positions, "positions", "0,MIDDLE,LAST", 3)
    ga = dict(curve=curve, n_points=points, generations=generations, pop_size=pop_size, n_parents=parents,
              n_crossover=crossovers, n_mutation=mutations, mx=mx, my=my, y_min=y_min, y_max=y_max, y_step=y_step,
              y_init=y_init, seed=split.seed)
    cfg = SearchConfig.from_preset(preset, ga=ga, **model_fields(model), **task_fields(task), **vars(split), **vars(scoring),
                                   positions=tuple(pos) if pos else None,
                                   weights=floats(weights, 3, "weights", "0.2,0.3,0.5"), space=space, budget=budget)
    if not run.quiet:
        typer.echo(f"loading {model.model} ({model.dtype}, {model.device}) ...", err=True)
    res = run_search(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/factors.json and factors.png; use it with --method lpes:{run.out}/factors.json")


@lpes_app.command()
def gain(
    dirs: list[Path] = typer.Argument(..., help="`posbias compare` folders: the same methods at different context lengths"),
    out: Path = typer.Option(Path("runs/lpes-gain"), help="output folder (gain.json, gain.png)"),
    overwrite: bool = typer.Option(False, help="replace an existing result in OUT"),
) -> None:
    """Gain of each method over the unmodified model (paired 95% CI) against prompt length -> OUT/gain.png."""
    res = run_gain(dirs, out, overwrite=overwrite)
    typer.echo(res.format())
    typer.echo(f"wrote {out}/gain.json and gain.png")


TRAIN = Group(
    "train", "Training",
    preset=Opt("cpu", "cpu (64 questions, lr 1e-4; docs/pos2distill.md) | paper (r1 300 / r2 500 questions, lr 3e-6)"),
    k=Opt(None, "trivial placements per question (default: the preset's; r1 5, Sec. 5.2.2: 4-6; r2 4)", Optional[int]),
    anchor=Opt(None, "advantageous placement: a slot (r1, default 0) or i:j (r2, default the last two slots), or "
                     "auto:PATH (the best placement of a sweep.json)", Optional[str]),
    correct_only=Opt(True, "keep only questions answered correctly at the anchor (released code)", bool,
                     ("--correct-only/--keep-all",)),
    lora=Opt(False, "LoRA adapters (merged at the end) or full fine-tuning (paper)", bool, ("--lora/--full",)),
    lr=Opt(None, "learning rate (default: the preset's for full fine-tuning; 1e-4 LoRA)", Optional[float]),
    batch_size=Opt(32, "training sequences per optimizer step (paper 32); whole questions kept", int),
    micro_batch=Opt(0, "questions per forward (0: a whole step); smaller saves memory", int),
    gradient_checkpointing=Opt(False, "recompute activations in the backward pass (less memory, ~30% slower)", bool,
                               ("--gradient-checkpointing",)),
    epochs=Opt(2.0, "epochs (paper 2)", float),
    max_steps=Opt(0, "stop after this many optimizer steps (0: use --epochs)", int),
    max_new_tokens=Opt(None, "anchor response length (default: the task's)", Optional[int]),
    save_steps=Opt(10, "checkpoint every this many steps", int),
)


def _distill(stage: str, model: Args, task: Args, split: Args, train: Args, run: Args, **method) -> None:
    cfg = DistillConfig.from_preset(train.preset, stage=stage, **model_fields(model), **task_fields(task), **vars(split),
                                    **{k: v for k, v in vars(train).items() if k != "preset"}, **method)
    if not run.quiet:
        typer.echo(f"loading {model.model} ({model.dtype}, {model.device}) ...", err=True)
    res = run_distill(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {res.model_dir}; evaluate it with: posbias sweep --model {res.model_dir} --task {task.task}")


@distill_app.command()
@uses(MODEL, TASK, SPLIT.defaults(n=None, skip=None), TRAIN, RUN.defaults(out=Path("runs/distill")))
def r1(
    model: Args, task: Args, split: Args, train: Args, run: Args,
    method: str = typer.Option("pos2distill", help="pos2distill | sft (gold answers) | seqkd (teacher responses, CE)"),
    ablation: str = typer.Option("full", help="pos2distill: kl | kl+align | full (= kl + align + anchoring)"),
    lam: float = typer.Option(1.0, help="lambda, the weight of the anchoring loss (paper 1)"),
    anchor_copy: bool = typer.Option(True, "--anchor-copy/--no-anchor-copy",
                                     help="sft/seqkd: also train on the anchor-slot copy, the data Pos2Distill gets"),
) -> None:
    """Retrieval: distil the anchor slot's behaviour into the other slots (Sec. 4.2); write OUT/model.

    The training split starts at --skip (default 2000, or half a file task's pool); sweeps use examples 0.."""
    _distill("r1", model, task, split, train, run, method=method, ablation=ablation, lam=lam, anchor_copy=anchor_copy)


@distill_app.command()
@uses(MODEL, TASK.defaults(task="kv-2hop"), SPLIT.defaults(n=None, skip=None), TRAIN, RUN.defaults(out=Path("runs/distill-r2")))
def r2(
    model: Args, task: Args, split: Args, train: Args, run: Args,
    method: str = typer.Option("pos2distill", help="pos2distill (the anchor's chain of thought, CE) | sft (gold "
                                                    "answers) | selftrain (own correct response at each placement)"),
) -> None:
    """Reasoning: train on the chain of thought of the advantageous two-hop placement at K other placements
    (Sec. 4.3); write OUT/model. Tasks: kv-2hop, musique, two-hop jsonl."""
    _distill("r2", model, task, split, train, run, method=method)
