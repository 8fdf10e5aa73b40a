"""`posbias theory` and `posbias synth ...`: explain position bias (rollout, theorem checks, synthetic experiments)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import PosbiasError, synth
from ..explain import (AttentionConfig, PriorConfig, RealRollout, ShiftingConfig, TheoryConfig, run_attention, run_prior,
                       run_shifting, run_theory)
from .options import (MODEL, RUN, SPLIT, TASK, Args, default, floats, ints, method_help, model_fields, placements,
                      run_kwargs, task_fields, uses, words)

analyze_app = typer.Typer(no_args_is_help=True, help="Why the model fails where it fails: analyses of a real model.")
synth_app = typer.Typer(no_args_is_help=True, help="Controlled synthetic experiments (Wu et al. 2025, Sec. 5).")


def _bools(s: Optional[str]) -> Optional[list[bool]]:
    if s is None:
        return None
    m = {"on": True, "off": False}
    bad = [x for x in s.split(",") if x not in m]
    if bad:
        raise PosbiasError(f"`residual` takes on,off values, got {bad}", "e.g. `residual=off,on`")
    return [m[x] for x in s.split(",")]


Preset = typer.Option("quick", help="quick (CPU, ~30 min for all three grids with --workers 2) | medium | paper")
Out = typer.Option(None, help="output directory (default runs/synth-GRID-PRESET)")
Seeds = typer.Option(None, help="seeds per configuration (quick 2, paper 5)")
Iters = typer.Option(None, help="training iterations (quick 4000, paper 100000)")
Lr = typer.Option(None, help="AdamW learning rate (quick 3e-3, paper 1e-3)")
EvalSeqs = typer.Option(None, help="test sequences per swap-test set (quick 5000, paper 10000)")
Workers = typer.Option(1, help="parallel runs (processes, 1 thread each); 2 on a 2-core machine")
Pes = typer.Option(None, help="comma list of none,sin,rope,decay")
Depths = typer.Option(None, help="comma list of depths")
Residual = typer.Option(None, help="comma list of on,off")
Kind = typer.Option(None, help="gaussian | fixed (App. L fixed vocabulary, lambda 0.75)")
Twin = typer.Option(None, help="swap-test twin: other (its label is wrong) | any (public code)")
Overwrite = typer.Option(False, "--overwrite", help="discard the finished runs in OUT and start again")
Quiet = typer.Option(False, "--quiet", help="no progress bars")
Device = typer.Option("cpu", help="cpu | cuda | auto (cuda if available, else cpu)")
Group = typer.Option(1, help="runs of one architecture trained at once on --device (batched; 1: one at a time)")


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
          sink_seqs: Optional[int] = typer.Option(None, help="sequences for the sink metric"),
          residual: Optional[str] = Residual, kind: Optional[str] = Kind, depths: Optional[str] = Depths,
          overwrite: bool = Overwrite, quiet: bool = Quiet, device: str = Device, group: int = Group) -> None:
    """Attention sinks under causal, sliding-window and prefix masks (App. K.4, Fig. 8; the paper: 2 layers)."""
    _grid("sinks", preset, out, workers, overwrite, quiet, device, group, seeds=seeds, iters=iters, lr=lr, eval_seqs=eval_seqs,
          masks=words(masks), sink_seqs=sink_seqs, residuals=_bools(residual), kind=kind, depths=ints(depths))


@synth_app.command()
def train(
    depth: int = typer.Option(2, help="attention layers"),
    mask: str = typer.Option("causal", help="none | causal | windowN | prefixN (tokens)"),
    pe: str = typer.Option("none", help="none | sin | rope | decay"),
    residual: bool = typer.Option(True, "--residual/--no-residual"),
    bias: str = typer.Option("none", help="training-data bias: none | first | middle | last | first-last"),
    kind: str = typer.Option("gaussian", help="gaussian | fixed (App. L)"),
    iters: int = typer.Option(4000, help="training iterations (paper: 100000)"),
    lr: float = typer.Option(1e-3, help="AdamW learning rate (paper 1e-3; the quick grids use 3e-3)"),
    seed: int = typer.Option(0),
    eval_seqs: int = typer.Option(5000, help="test sequences per swap-test set (paper: 10000)"),
    classes: int = typer.Option(2048, help="K"), labels: int = typer.Option(32, help="L"),
    burstiness: int = typer.Option(4, help="B"), eps: float = typer.Option(0.75, help="within-class noise"),
    items: int = typer.Option(8, help="n"), dim: int = typer.Option(64, help="d"),
    lam: float = typer.Option(0.75, help="anisotropy (kind=fixed)"),
    std: Optional[float] = typer.Option(None, help="component std (default 1/sqrt(d); the public code uses 1/d)"),
    out: Path = typer.Option(Path("runs/synth-train"), help="output directory (rerun to resume)"),
    quiet: bool = Quiet,
    device: str = Device,
) -> None:
    """Train and evaluate one configuration; print its metrics."""
    data = dict(n_classes=classes, n_labels=labels, burstiness=burstiness, eps=eps, n_items=items, dim=dim, bias=bias,
                kind=kind, lam=lam, component_std=std)
    cfg = synth.one_run_config(depth=depth, mask=mask, pe=pe, residual=residual, iters=iters, lr=lr, seed=seed,
                               eval_seqs=eval_seqs, data=data)
    typer.echo(synth.run_single(cfg, out, progress=not quiet, device=device).format())


def theory(
    out: Path = typer.Option(Path("runs/theory"), help="output directory (a rerun recomputes it: it takes seconds)"),
    seed: int = typer.Option(0, help="seed of the random instances"),
    tokens: Optional[int] = typer.Option(None, help="sequence length N of the synthetic instances (figures: 64; "
                                                    "given, the theorem checks use it too, else their own defaults)"),
    depth: Optional[int] = typer.Option(None, help="layers of the synthetic instances (figures: 16; given, the "
                                                   "theorem checks use it too, else their own defaults)"),
    real: bool = typer.Option(True, "--real/--no-real", help="also roll out a real model on kv-lookup prompts"),
    model: str = typer.Option("smollm2-135m", help="the real model"),
    n: int = typer.Option(8, help="real model: kv-lookup examples per gold position"),
    facts: int = typer.Option(10, help="real model: facts per prompt"),
    dtype: str = typer.Option("bf16", help="real model: bf16 | fp32"),
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
@uses(MODEL, TASK, SPLIT.defaults(n=20), RUN.defaults(out=Path("runs/shifting")))
def shifting(
    model: Args, task: Args, split: Args, run: Args,
    positions: Optional[str] = typer.Option(None, help="the placements measured (default: the task's)"),
    max_new_tokens: Optional[int] = typer.Option(None, help="response length (default: the task's)"),
    method: str = typer.Option(default("method", ShiftingConfig),
                               help=method_help("a training-free method at every placement: ")),
    top: int = typer.Option(10, help="tokens listed at the first divergence (Fig. 8)"),
) -> None:
    """Token and thought shifting: where the greedy answer at each placement leaves the advantageous one, the rank of
    the advantageous token there (top 10?), single-token shifts, and perplexities (Pos2Distill Fig. 3a, 8, 9)."""
    cfg = ShiftingConfig(**model_fields(model), **task_fields(task), **vars(split),
                         positions=placements(task, positions), max_new_tokens=max_new_tokens, method=method, top=top)
    res = run_shifting(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/shifting.json, rows.jsonl, shifting.png, divergence.png")


@analyze_app.command()
@uses(MODEL, TASK, SPLIT.defaults(n=20, skip=1000), RUN.defaults(out=Path("runs/prior")))
def prior(model: Args, task: Args, split: Args, run: Args) -> None:
    """The positional attention prior: a content-free item in each slot and the attention it gets, per slot and layer
    band, beside the accuracy (Found-in-the-Middle Sec. 3.2); `--method calib:OUT` calibrates with it."""
    cfg = PriorConfig(**model_fields(model), **task_fields(task), **vars(split))
    res = run_prior(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/prior.json, rows.jsonl and prior.png (use it with --method calib:{run.out})")


@analyze_app.command()
@uses(MODEL, TASK, SPLIT.defaults(n=20), RUN.defaults(out=Path("runs/attention")))
def attention(
    model: Args, task: Args, split: Args, run: Args,
    positions: Optional[str] = typer.Option(None, help="the placements measured (default: the task's)"),
    method: str = typer.Option("none", help="a RoPE-rescaling method: none | pi:1.2 | layers:... | lpes:DIR"),
    rows: str = typer.Option("last", help="last (the last prompt token) | answer (every row that predicts an answer "
                                          "token, averaged)"),
    heads: bool = typer.Option(False, "--heads", help="also store the per-head masses"),
    scales: Optional[str] = typer.Option(None, help="uniform RoPE factors for the LPES Fig. 5 study, e.g. 1.0,1.2,1.5"),
    rollout: Optional[bool] = typer.Option(None, "--rollout/--no-rollout",
                                           help="real-model rollout beside the accuracy (default: on for prompts "
                                                "<= 1000 tokens)"),
) -> None:
    """Attention per document: the mass the answer-producing rows put on each item, per layer, as the gold moves
    (Pos2Distill Fig. 7; LPES Fig. 5 with --scales), with the accuracy and the rollout's prediction beside it."""
    cfg = AttentionConfig(**model_fields(model), **task_fields(task), **vars(split), positions=placements(task, positions),
                          method=method, rows=rows, heads=heads, scales=floats(scales, what="`scales`"), rollout=rollout)
    res = run_attention(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/attention.json, rows.jsonl and figures")
