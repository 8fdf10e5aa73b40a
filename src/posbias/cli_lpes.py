"""`posbias lpes ...`: the LPES search (the sweep/compare commands apply its result)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

lpes_app = typer.Typer(no_args_is_help=True, help="LPES: search per-layer RoPE scaling factors (training-free).")

# paper: Sec. 4.1 (200 search examples) and Table 12; cpu: sized by benchmarks/lpes_speed.py for 2 cores
# (docs/lpes.md); its factor range is narrower because SmolLM2 collapses under uniform scaling >= 1.25.
PRESETS = {
    "paper": {"n": 200, "generations": 20, "y_min": 1.0, "y_max": 2.0, "y_step": 0.1, "y_init": 1.5, "my": 0.2},
    "cpu": {"n": 24, "generations": 5, "y_min": 1.0, "y_max": 1.5, "y_step": 0.05, "y_init": 1.1, "my": 0.1},
}


def _floats(s: Optional[str], k: int | None = None) -> Optional[tuple[float, ...]]:
    if s is None:
        return None
    from .errors import PosbiasError

    try:
        v = tuple(float(x) for x in s.split(","))
    except ValueError:
        raise PosbiasError(f"bad number list {s!r}", "write comma-separated numbers, e.g. 0.2,0.3,0.5") from None
    if k is not None and len(v) != k:
        raise PosbiasError(f"expected {k} numbers, got {s!r}", f"pass {k} comma-separated numbers")
    return v


@lpes_app.command()
def search(
    model: str = typer.Option("smollm2-135m", help="a RoPE model (Llama / Qwen2 / Mistral family)"),
    task: str = typer.Option("kv-lookup", help="kv-lookup | kv-uuid | nq | jsonl:PATH"),
    out: Path = typer.Option(Path("runs/lpes"), help="output directory (factors.json, factors.png, logs)"),
    preset: str = typer.Option("cpu", help="cpu (2-core budget; see docs/lpes.md) | paper (Sec. 4.1, Table 12)"),
    n: Optional[int] = typer.Option(None, help="search examples (scored at 3 positions each)"),
    seed: int = typer.Option(0, help="example seed and GA seed"),
    skip: int = typer.Option(1000, help="the search split starts at this example (held-out sweeps use 0..)"),
    positions: Optional[str] = typer.Option(None, help="beginning,middle,end slots (default 0, middle, last)"),
    weights: str = typer.Option("0.2,0.3,0.5", help="lambda_B,lambda_M,lambda_E"),
    space: str = typer.Option("curve", help="curve (Bezier GA) | layers (GA per layer: brute force) | random"),
    curve: str = typer.Option("bezier", help="bezier | linear | step (Table 6)"),
    points: int = typer.Option(4, help="control points (Table 7: 2-5; 4 = cubic)"),
    generations: Optional[int] = typer.Option(None, help="GA generations (paper 20)"),
    pop_size: int = typer.Option(32, help="population size (Table 12)"),
    parents: int = typer.Option(12, help="parents kept per generation (Table 12)"),
    crossovers: int = typer.Option(4, help="crossover offspring per generation (Table 12)"),
    mutations: int = typer.Option(16, help="mutation offspring per generation (Table 12)"),
    mx: int = typer.Option(2, help="max x change of a control point (Table 12)"),
    my: Optional[float] = typer.Option(None, help="max y change of a control point (paper 0.2)"),
    y_min: Optional[float] = typer.Option(None, help="smallest factor (paper 1.0)"),
    y_max: Optional[float] = typer.Option(None, help="largest factor (paper 2.0)"),
    y_step: Optional[float] = typer.Option(None, help="factor grid step (paper 0.1)"),
    y_init: Optional[float] = typer.Option(None, help="factor of the initial individual (eq. 8: 1.5)"),
    budget: Optional[int] = typer.Option(None, help="random search: individuals to draw"),
    facts: Optional[int] = typer.Option(None, help="kv-lookup: facts (default 10)"),
    docs: Optional[int] = typer.Option(None, help="nq: 10 or 20 documents"),
    pairs: Optional[int] = typer.Option(None, help="kv-uuid: pairs"),
    answers: Optional[str] = typer.Option(None, help="nq/jsonl: all | first (only the 1st gold answer counts)"),
    engine: Optional[str] = typer.Option(None, help="teacher-forced | generate (default: the task's)"),
    chat: str = typer.Option("auto", help="auto | on | off"),
    dtype: str = typer.Option("bf16", help="bf16 | fp32"),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    data_dir: Optional[Path] = typer.Option(None, help="benchmark data dir (default ../shared/data)"),
    resume: bool = typer.Option(False, "--resume", help="continue a killed search in OUT"),
    overwrite: bool = typer.Option(False, "--overwrite", help="discard what OUT holds and start again"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
) -> None:
    """Search per-layer RoPE factors (Algorithm 1) on a search split; write OUT/factors.json."""
    from .core.ga import GAConfig
    from .errors import PosbiasError
    from .methods.lpes import SearchConfig, run_search

    if preset not in PRESETS:
        raise PosbiasError(f"unknown preset {preset!r}", f"use one of {', '.join(PRESETS)}")
    p = {**PRESETS[preset], **{k: v for k, v in dict(n=n, generations=generations, y_min=y_min, y_max=y_max,
                                                     y_step=y_step, y_init=y_init, my=my).items() if v is not None}}
    ga = GAConfig(pop_size=pop_size, n_parents=parents, n_crossover=crossovers, n_mutation=mutations,
                  generations=p["generations"], mx=mx, my=p["my"], n_points=points, y_min=p["y_min"], y_max=p["y_max"],
                  y_step=p["y_step"], y_init=p["y_init"], curve=curve, seed=seed)
    opts = {"facts": facts, "docs": docs, "pairs": pairs, "answers": answers}
    pos = _floats(positions, 3)
    cfg = SearchConfig(model=model, task=task, task_options={k: v for k, v in opts.items() if v is not None}, n=p["n"],
                       seed=seed, skip=skip, positions=tuple(int(x) for x in pos) if pos else None,
                       weights=_floats(weights, 3), space=space, budget=budget, ga=ga, engine=engine, chat=chat,
                       dtype=dtype, device=device, data_dir=str(data_dir) if data_dir else None)
    typer.echo(f"loading {model} ({dtype}, {device}) ...", err=True)
    res = run_search(cfg, out, resume=resume, overwrite=overwrite, progress=not quiet)
    acc, base = res["accuracy"], res["baseline"]["accuracy"]
    typer.echo(f"best fitness {res['fitness']:.3f} (unmodified {res['baseline']['fitness']:.3f}) after "
               f"{res['evaluations']} evaluations")
    typer.echo("search split accuracy  begin/middle/end: " + " / ".join(f"{acc[k]:.3f}" for k in acc)
               + "   unmodified: " + " / ".join(f"{base[k]:.3f}" for k in base))
    typer.echo("per-layer factors: " + " ".join(f"{f:.3f}" for f in res["factors"]))
    typer.echo(f"wrote {out}/factors.json and factors.png; use it with --method lpes:{out}/factors.json")
