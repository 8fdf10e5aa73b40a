"""Command line: a thin typer shell over the Python API."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .cli_distill import distill_app
from .cli_lpes import lpes_app
from .cli_synth import synth_app
from .errors import PosbiasError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="posbias: measure, explain and mitigate position bias in transformer LLMs.",
)


app.add_typer(synth_app, name="synth")
app.add_typer(lpes_app, name="lpes")
app.add_typer(distill_app, name="distill")


@app.callback()
def _root() -> None:
    """posbias: measure, explain and mitigate position bias in transformer LLMs."""


@app.command()
def sweep(
    model: str = typer.Option("smollm2-135m", help="registered name, HF model dir or hub id, or a .gguf file"),
    task: str = typer.Option("kv-lookup", help="kv-lookup | kv-uuid | nq | jsonl:PATH"),
    positions: str = typer.Option("all", help="all | 0,4,9 | 0%,50%,100%"),
    n: int = typer.Option(100, help="examples per position"),
    seed: int = typer.Option(0, help="example selection / generation seed"),
    out: Path = typer.Option(Path("runs/sweep"), help="output directory"),
    engine: Optional[str] = typer.Option(None, help="teacher-forced | generate (default: the task's)"),
    facts: Optional[int] = typer.Option(None, help="kv-lookup: number of facts (default 10)"),
    digits: Optional[int] = typer.Option(None, help="kv-lookup: digits per key/value (default 6)"),
    docs: Optional[int] = typer.Option(None, help="nq: 10 or 20 documents (default 10)"),
    pairs: Optional[int] = typer.Option(None, help="kv-uuid: key-value pairs (75/140 from files; default 75)"),
    answers: Optional[str] = typer.Option(None, help="nq/jsonl: all | first (only the 1st gold answer counts)"),
    skip: int = typer.Option(0, help="skip the first SKIP examples of the order (disjoint splits)"),
    max_new_tokens: Optional[int] = typer.Option(None, help="generate: token limit (default: the task's)"),
    chat: str = typer.Option("auto", help="use the chat template: auto | on | off"),
    dtype: str = typer.Option("bf16", help="bf16 | fp32"),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    batch_tokens: int = typer.Option(16384, help="padded tokens per batch"),
    max_batch: int = typer.Option(32, help="rows per batch at most"),
    data_dir: Optional[Path] = typer.Option(None, help="benchmark data dir (default ../shared/data)"),
    method: str = typer.Option("none", help="none | pi:1.2 | lpes:DIR/factors.json | mspoe | buckets | layers:F1,..."),
    resume: bool = typer.Option(False, "--resume", help="continue a killed sweep in OUT"),
    overwrite: bool = typer.Option(False, "--overwrite", help="discard what OUT holds and start again"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
) -> None:
    """Put the gold item at each position in turn, score the model, report the curve."""
    from .eval.sweep import SweepConfig, format_table, run_sweep

    opts = {"facts": facts, "digits": digits, "docs": docs, "pairs": pairs, "answers": answers}
    cfg = SweepConfig(
        model=model, task=task, task_options={k: v for k, v in opts.items() if v is not None},
        positions=positions, n=n, seed=seed, skip=skip, engine=engine, max_new_tokens=max_new_tokens,
        chat=chat, dtype=dtype, device=device, batch_tokens=batch_tokens, max_batch=max_batch,
        data_dir=str(data_dir) if data_dir else None, method=method,
    )
    typer.echo(f"loading {model} ({dtype}, {device}) ...", err=True)
    res = run_sweep(cfg, out, resume=resume, overwrite=overwrite, progress=not quiet)
    typer.echo(f"{task} on {model}: {cfg.n} examples x {len(res.per_position)} positions, engine {res.config['engine']}")
    typer.echo(format_table(res.per_position, res.summary))
    typer.echo(f"wrote {out}/sweep.json, examples.jsonl, curve.png")


@app.command()
def compare(
    methods: str = typer.Option("none", help="comma list of method specs, e.g. none,pi:1.1,mspoe,buckets,lpes:DIR/factors.json"),
    model: str = typer.Option("smollm2-135m", help="registered name, HF model dir or hub id, or a .gguf file"),
    models: Optional[str] = typer.Option(None, help="comma list of models (e.g. smollm2-135m,runs/p2d/model): "
                                                   "every model with every method; overrides --model"),
    task: str = typer.Option("kv-lookup", help="kv-lookup | kv-uuid | nq | jsonl:PATH"),
    positions: str = typer.Option("all", help="all | 0,4,9 | 0%,50%,100%"),
    n: int = typer.Option(100, help="examples per position"),
    seed: int = typer.Option(0, help="example selection / generation seed"),
    skip: int = typer.Option(0, help="skip the first SKIP examples (keep them disjoint from a search split)"),
    out: Path = typer.Option(Path("runs/compare"), help="output directory"),
    engine: Optional[str] = typer.Option(None, help="teacher-forced | generate (default: the task's)"),
    facts: Optional[int] = typer.Option(None, help="kv-lookup: number of facts (default 10)"),
    docs: Optional[int] = typer.Option(None, help="nq: 10 or 20 documents (default 10)"),
    pairs: Optional[int] = typer.Option(None, help="kv-uuid: key-value pairs"),
    answers: Optional[str] = typer.Option(None, help="nq/jsonl: all | first (only the 1st gold answer counts)"),
    chat: str = typer.Option("auto", help="use the chat template: auto | on | off"),
    dtype: str = typer.Option("bf16", help="bf16 | fp32"),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    data_dir: Optional[Path] = typer.Option(None, help="benchmark data dir (default ../shared/data)"),
    resume: bool = typer.Option(False, "--resume", help="continue a killed comparison in OUT"),
    overwrite: bool = typer.Option(False, "--overwrite", help="discard what OUT holds and start again"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bars"),
) -> None:
    """Run several methods (and models) on the same examples; one table (per position, average, gap) and one plot."""
    from .eval.compare import format_compare, run_compare
    from .eval.sweep import SweepConfig

    opts = {"facts": facts, "docs": docs, "pairs": pairs, "answers": answers}
    cfg = SweepConfig(model=model, task=task, task_options={k: v for k, v in opts.items() if v is not None},
                      positions=positions, n=n, seed=seed, skip=skip, engine=engine, chat=chat, dtype=dtype,
                      device=device, data_dir=str(data_dir) if data_dir else None)
    model_list = [m.strip() for m in models.split(",") if m.strip()] if models else None
    if model_list:
        cfg.model = model_list[0]
    rec = run_compare(cfg, [m.strip() for m in methods.split(",") if m.strip()], out, resume=resume,
                      overwrite=overwrite, progress=not quiet, models=model_list)
    typer.echo(format_compare(rec))
    typer.echo(f"wrote {out}/compare.json, compare.png and one sweep directory per method")


@app.command()
def theory(
    out: Path = typer.Option(Path("runs/theory"), help="output directory"),
    seed: int = typer.Option(0, help="seed of the random instances"),
    tokens: int = typer.Option(64, help="sequence length N of the synthetic instances"),
    depth: int = typer.Option(16, help="layers of the synthetic instances"),
    real: bool = typer.Option(True, "--real/--no-real", help="also roll out a real model on kv-lookup prompts"),
    model: str = typer.Option("smollm2-135m", help="the real model"),
    n: int = typer.Option(8, help="real model: kv-lookup examples per gold position"),
    facts: int = typer.Option(10, help="real model: facts per prompt"),
    dtype: str = typer.Option("bf16", help="real model: bf16 | fp32"),
) -> None:
    """Attention rollout over masks, decay masks and RoPE: figures, theorem checks, real-model rollout."""
    from .analysis.theory import format_summary, run_theory

    data = run_theory(out, seed=seed, n_tokens=tokens, depth=depth)
    typer.echo(format_summary(data["summary"]))
    if real:
        from .analysis.rollout_real import run_real_rollout
        from .models.load import load_model
        from .report.rollout_plots import gold_share

        typer.echo(f"loading {model} ...", err=True)
        res = run_real_rollout(load_model(model, dtype, "cpu"), out, facts=facts, n=n, seed=seed,
                               positions=[0, facts // 4, facts // 2, 3 * facts // 4, facts - 1])
        for key in (k for k in res if k.startswith("residual=")):
            for p, m in res[key].items():
                typer.echo(f"{model} {key} gold@{p}: first-token mass after 1/{len(m['first'])} layers "
                           f"{m['first'][0]:.3f}/{m['first'][-1]:.3f}; gold share of facts {gold_share(m, 0):.3f}"
                           f"/{gold_share(m, len(m['first']) - 1):.3f}")
    typer.echo(f"wrote {out}/theory.json and figures")


@app.command()
def tasks() -> None:
    """List the tasks and the JSONL schema for your own data."""
    from .tasks import JSONL_SCHEMA, TASKS

    for name, desc in TASKS.items():
        typer.echo(f"{name:12s} {desc}")
    typer.echo("\njsonl:PATH schema\n" + JSONL_SCHEMA)


@app.command()
def models() -> None:
    """List the registered model names."""
    from .models.load import REGISTRY

    for name, (_, desc) in REGISTRY.items():
        typer.echo(f"{name:14s} {desc}")
    typer.echo("Also: a Hugging Face model directory or hub id, or a path to a .gguf file.")


def main() -> None:
    from .models.load import set_threads

    set_threads()
    try:
        app()
    except PosbiasError as e:
        typer.echo(f"posbias: error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
