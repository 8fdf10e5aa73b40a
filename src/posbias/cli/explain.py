"""`posbias theory` and `posbias synth ...`: explain position bias (rollout, theorem checks, synthetic experiments)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import PosbiasError, synth
from ..explain import (
    AttentionConfig,
    PriorConfig,
    RealRollout,
    ShiftingConfig,
    TheoryConfig,
    run_attention,
    run_prior,
    run_shifting,
    run_theory,
)
from .options import (
    MODEL,
    RUN,
    SPLIT,
    TASK,
    Args,
    cli_option,
    field_option,
    floats,
    ints,
    method_values,
    model_fields,
    run_kwargs,
    task_fields,
    uses,
    words,
)

analyze_app = typer.Typer(no_args_is_help=True)  # help: the callback's docstring
synth_app = typer.Typer(no_args_is_help=True, help="Controlled synthetic experiments (Wu et al. 2025, Sec. 5).")


def _bools(s: Optional[str]) -> Optional[list[bool]]:
    if s is None:
        return None
    m = {"on": True, "off": False}
    bad = [x for x in s.split(",") if x not in m]
    if bad:
        raise PosbiasError(f"`residual` takes on,off values, got {bad}", "e.g. `residual=off,on`")
    return [m[x] for x in s.split(",")]


# the synthetic grids' options; one left unset takes the preset's value
Preset = typer.Option("quick", help="quick (CPU, ~30 min for all three grids with --workers 2: 4000 iterations, lr 3e-3, "
                                    "2 seeds, 5000 test sequences) | medium (8000 iterations) | paper (100000 iterations, "
                                    "lr 1e-3, 5 seeds, 10000 test sequences); an option left unset takes the preset's value")
Out = cli_option("out", None, more=" (default runs/synth-GRID-PRESET)")
Seeds = typer.Option(None, help="seeds per configuration (quick 2, paper 5)")
Iters = field_option(synth.RunConfig, "train.iters", default=None)
Lr = field_option(synth.RunConfig, "train.lr", default=None)
EvalSeqs = field_option(synth.RunConfig, "eval.n_seqs", default=None)
Workers = typer.Option(1, help="parallel runs (processes, 1 thread each); 2 on a 2-core machine")
Pes = typer.Option(None, help="comma list of none,sin,rope,decay")
Depths = typer.Option(None, help="comma list of depths")
Residual = typer.Option(None, help="comma list of on,off")
Kind = field_option(synth.RunConfig, "data.kind", default=None)
Twin = field_option(synth.RunConfig, "eval.twin", default=None)
Overwrite = cli_option("overwrite", False, "--overwrite")
Quiet = cli_option("quiet", False, "--quiet")
Device = typer.Option("cpu", help="cpu | cuda | auto (cuda if available, else cpu)")
Group = typer.Option(1, help="runs of one architecture trained at once on --device (batched; 1: one at a time)")
DATA = "Data (App. J)"


def _grid(grid, preset, out, workers, overwrite, quiet, device="cpu", group=1, **over) -> None:
    runs = synth.grid_runs(grid, preset, **over)
    out = out or Path(f"runs/synth-{grid}-{preset}")
    if not quiet:
        typer.echo(f"synth {grid} ({preset}): {len(runs)} runs -> {out}", err=True)
    res = synth.run_grid(grid, runs, out, workers=workers, progress=not quiet, overwrite=overwrite, device=device,
                         group=group)
    typer.echo(res.format())
    typer.echo(f"wrote {out}/{grid}.json, {', '.join(res.figures)}")


@synth_app.command()
def depth(preset: str = Preset, out: Optional[Path] = Out, seeds: Optional[int] = Seeds,
          iters: Optional[int] = Iters, lr: Optional[float] = Lr, eval_seqs: Optional[int] = EvalSeqs, workers: int = Workers,
          depths: Optional[str] = Depths, pes: Optional[str] = Pes, residual: Optional[str] = Residual,
          kind: Optional[str] = Kind, twin: Optional[str] = Twin, overwrite: bool = Overwrite,
          quiet: bool = Quiet, device: str = Device, group: int = Group) -> None:
    """Unbiased data, causal mask: depth x PE x residual (Fig. 2, 4, 5)."""
    _grid("depth", preset, out, workers, overwrite, quiet, device, group, seeds=seeds, iters=iters, lr=lr, eval_seqs=eval_seqs,
          depths=ints(depths), pes=words(pes), residuals=_bools(residual), kind=kind, twin=twin)


@synth_app.command()
def bias(preset: str = Preset, out: Optional[Path] = Out, seeds: Optional[int] = Seeds,
         iters: Optional[int] = Iters, lr: Optional[float] = Lr, eval_seqs: Optional[int] = EvalSeqs, workers: int = Workers,
         masks: Optional[str] = typer.Option(None, help="comma list of none,causal"),
         pes: Optional[str] = Pes,
         biases: Optional[str] = typer.Option(None, help="comma list of first-last,first,middle,last,none"),
         depths: Optional[str] = Depths, kind: Optional[str] = Kind, twin: Optional[str] = Twin,
         overwrite: bool = Overwrite, quiet: bool = Quiet, device: str = Device, group: int = Group) -> None:
    """Biased training data, residual 2-layer nets: mask x PE x data bias (Fig. 3, 6)."""
    _grid("bias", preset, out, workers, overwrite, quiet, device, group, seeds=seeds, iters=iters, lr=lr, eval_seqs=eval_seqs,
          masks=words(masks), pes=words(pes), biases=words(biases), depths=ints(depths), kind=kind, twin=twin)


@synth_app.command()
def sinks(preset: str = Preset, out: Optional[Path] = Out, seeds: Optional[int] = Seeds,
          iters: Optional[int] = Iters, lr: Optional[float] = Lr, eval_seqs: Optional[int] = EvalSeqs, workers: int = Workers,
          masks: Optional[str] = typer.Option(None, help="comma list: causal,window5,window9,prefix2,..."),
          sink_seqs: Optional[int] = field_option(synth.RunConfig, "eval.sink_seqs", default=None),
          residual: Optional[str] = Residual, kind: Optional[str] = Kind, depths: Optional[str] = Depths,
          overwrite: bool = Overwrite, quiet: bool = Quiet, device: str = Device, group: int = Group) -> None:
    """Attention sinks under causal, sliding-window and prefix masks (App. K.4, Fig. 8; the paper: 2 layers)."""
    _grid("sinks", preset, out, workers, overwrite, quiet, device, group, seeds=seeds, iters=iters, lr=lr, eval_seqs=eval_seqs,
          masks=words(masks), sink_seqs=sink_seqs, residuals=_bools(residual), kind=kind, depths=ints(depths))


@synth_app.command()
def train(
    depth: int = field_option(synth.RunConfig, "model.depth"),
    mask: str = field_option(synth.RunConfig, "model.mask"),
    pe: str = field_option(synth.RunConfig, "model.pe"),
    residual: bool = field_option(synth.RunConfig, "model.residual", "--residual/--no-residual"),
    iters: int = field_option(synth.RunConfig, "train.iters", default=4000),
    lr: float = field_option(synth.RunConfig, "train.lr"),
    seed: int = field_option(synth.RunConfig, "seed"),
    eval_seqs: int = field_option(synth.RunConfig, "eval.n_seqs", default=5000),
    bias: str = field_option(synth.RunConfig, "data.bias", rich_help_panel=DATA),
    kind: str = field_option(synth.RunConfig, "data.kind", rich_help_panel=DATA),
    classes: int = field_option(synth.RunConfig, "data.n_classes", rich_help_panel=DATA),
    labels: int = field_option(synth.RunConfig, "data.n_labels", rich_help_panel=DATA),
    burstiness: int = field_option(synth.RunConfig, "data.burstiness", rich_help_panel=DATA),
    eps: float = field_option(synth.RunConfig, "data.eps", rich_help_panel=DATA),
    items: int = field_option(synth.RunConfig, "data.n_items", rich_help_panel=DATA),
    dim: int = field_option(synth.RunConfig, "data.dim", rich_help_panel=DATA),
    lam: float = field_option(synth.RunConfig, "data.lam", rich_help_panel=DATA),
    std: Optional[float] = field_option(synth.RunConfig, "data.component_std", rich_help_panel=DATA),
    out: Path = cli_option("out", Path("runs/synth-train"), more=" (rerun to resume)"),
    quiet: bool = Quiet,
    device: str = Device,
) -> None:
    """Train and evaluate one configuration (the paper's data and lr, a short run: 4000 iterations, 5000 test
    sequences); print its metrics."""
    data = dict(n_classes=classes, n_labels=labels, burstiness=burstiness, eps=eps, n_items=items, dim=dim, bias=bias,
                kind=kind, lam=lam, component_std=std)
    cfg = synth.one_run_config(depth=depth, mask=mask, pe=pe, residual=residual, iters=iters, lr=lr, seed=seed,
                               eval_seqs=eval_seqs, data=data)
    typer.echo(synth.run_single(cfg, out, progress=not quiet, device=device).format())


REAL = "Real model (--real)"


def theory(
    out: Path = cli_option("out", Path("runs/theory"), more=" (a rerun recomputes it: it takes seconds)"),
    seed: int = field_option(TheoryConfig, "seed"),
    tokens: Optional[int] = typer.Option(None, help="sequence length N of the synthetic instances (figures: 64; "
                                                    "given, the theorem checks use it too, else their own defaults)"),
    depth: Optional[int] = typer.Option(None, help="layers of the synthetic instances (figures: 16; given, the "
                                                   "theorem checks use it too, else their own defaults)"),
    real: bool = typer.Option(True, "--real/--no-real", help="also roll out a real model on kv-lookup prompts"),
    model: str = field_option(RealRollout, "model", rich_help_panel=REAL),
    n: int = field_option(RealRollout, "n", rich_help_panel=REAL),
    facts: int = field_option(RealRollout, "facts", rich_help_panel=REAL),
    dtype: str = field_option(RealRollout, "dtype", rich_help_panel=REAL),
) -> None:
    """Attention rollout over masks, decay masks and RoPE: figures, theorem checks, real-model rollout."""
    rollout = RealRollout(model=model, facts=facts, n=n, dtype=dtype).validate() if real else None
    cfg = TheoryConfig(seed=seed, n_tokens=64 if tokens is None else tokens, depth=16 if depth is None else depth,
                        check_tokens=tokens, check_depth=depth)
    res = run_theory(cfg, out, real=rollout)
    typer.echo(res.format())
    typer.echo(f"wrote {out}/theory.json and figures")


@analyze_app.callback()
def _analyze_group() -> None:
    """Why the model fails where it fails: analyses of a real model."""


@analyze_app.command()
@uses(ShiftingConfig, MODEL, TASK, SPLIT, RUN.defaults(out=Path("runs/shifting")))
def shifting(
    model: Args, task: Args, split: Args, run: Args,
    positions: Optional[str] = field_option(ShiftingConfig, "positions"),
    max_new_tokens: Optional[int] = field_option(ShiftingConfig, "max_new_tokens"),
    method: str = field_option(ShiftingConfig, "method", values=method_values),
    top: int = field_option(ShiftingConfig, "top"),
) -> None:
    """Token and thought shifting: where the greedy answer at each placement leaves the advantageous one, the rank of
    the advantageous token there (top 10?), single-token shifts, and perplexities (Pos2Distill Fig. 3a, 8, 9)."""
    cfg = ShiftingConfig(**model_fields(model), **task_fields(task), **vars(split),
                         positions=positions, max_new_tokens=max_new_tokens, method=method, top=top)
    res = run_shifting(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/shifting.json, rows.jsonl, shifting.png, divergence.png")


@analyze_app.command()
@uses(PriorConfig, MODEL, TASK, SPLIT, RUN.defaults(out=Path("runs/prior")))
def prior(model: Args, task: Args, split: Args, run: Args) -> None:
    """The positional attention prior: a content-free item in each slot and the attention it gets, per slot and layer
    band, beside the accuracy (Found-in-the-Middle Sec. 3.2); `--method calib:OUT` calibrates with it."""
    cfg = PriorConfig(**model_fields(model), **task_fields(task), **vars(split))
    res = run_prior(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/prior.json, rows.jsonl and prior.png (use it with --method calib:{run.out})")


@analyze_app.command()
@uses(AttentionConfig, MODEL, TASK, SPLIT, RUN.defaults(out=Path("runs/attention")))
def attention(
    model: Args, task: Args, split: Args, run: Args,
    positions: Optional[str] = field_option(AttentionConfig, "positions"),
    method: str = field_option(AttentionConfig, "method"),
    rows: str = field_option(AttentionConfig, "rows"),
    heads: bool = field_option(AttentionConfig, "heads", "--heads"),
    scales: Optional[str] = field_option(AttentionConfig, "scales"),
    rollout: Optional[bool] = field_option(AttentionConfig, "rollout", "--rollout/--no-rollout"),
) -> None:
    """Attention per document: the mass the answer-producing rows put on each item, per layer, as the gold moves
    (Pos2Distill Fig. 7; LPES Fig. 5 with --scales), with the accuracy and the rollout's prediction beside it."""
    cfg = AttentionConfig(**model_fields(model), **task_fields(task), **vars(split), positions=positions,
                          method=method, rows=rows, heads=heads, scales=floats(scales, what="`scales`"), rollout=rollout)
    res = run_attention(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/attention.json, rows.jsonl and figures")
