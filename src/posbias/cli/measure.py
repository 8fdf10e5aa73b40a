"""`posbias sweep | compare | show | tasks | models`: measure a model's position bias."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from types import UnionType
from typing import Optional

import typer

from .. import BACKENDS, METHODS, MODELS, TASKS, SweepConfig, run_compare, run_sweep
from ..measure import (
    COLLAPSE_MARGIN,
    DIALECTS,
    JSONL_SCHEMA,
    ORDER_SCHEMAS,
    export_model,
    show_prompts,
    split_models,
    split_specs,
)
from .options import (
    MODEL,
    RUN,
    SCORING,
    SPLIT,
    TASK,
    Args,
    Group,
    Opt,
    announce,
    engine_values,
    field_option,
    method_values,
    model_fields,
    run_kwargs,
    task_fields,
    task_flag,
    uses,
)

POSITIONS = field_option(SweepConfig, "positions")


@uses(SweepConfig, MODEL, TASK, SPLIT, SCORING, RUN.defaults(out=Path("runs/sweep")))
def sweep(model: Args, task: Args, split: Args, scoring: Args, run: Args, positions: Optional[str] = POSITIONS,
          method: str = field_option(SweepConfig, "method", values=method_values)
          ) -> None:
    """Put the gold item at each position in turn, score the model, report the curve."""
    cfg = SweepConfig(**model_fields(model), **task_fields(task), **vars(split), **vars(scoring),
                      positions=positions, method=method)
    if not run.quiet:
        typer.echo(announce(model, cfg), err=True)
    res = run_sweep(cfg, run.out, **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/sweep.json, examples.jsonl, curve.png")


@uses(SweepConfig, MODEL, TASK, SPLIT, SCORING, RUN.defaults(out=Path("runs/compare")))
def compare(model: Args, task: Args, split: Args, scoring: Args, run: Args, positions: Optional[str] = POSITIONS,
            methods: str = typer.Option("none", help="comma list of method specs, e.g. "
                                                     "none,pi:1.1,mspoe,buckets,lpes:DIR/factors.json"),
            models: Optional[str] = typer.Option(None, help="comma list of models (e.g. smollm2-135m,runs/p2d/model,"
                                                           "openai:model=M,base_url=URL,tokenizer=DIR): "
                                                           "every model with every method; overrides --model"),
            collapse_margin: float = typer.Option(COLLAPSE_MARGIN, help="flag a method as COLLAPSED when it loses more "
                                                  "than this at any position (or its average is at chance)")) -> None:
    """Run several methods (and models) on the same examples; one table (per position, average, gap) and one plot."""
    model_list = split_models(models) if models else None
    fields = {**model_fields(model), "model": model_list[0] if model_list else model.model}
    cfg = SweepConfig(**fields, **task_fields(task), **vars(split), **vars(scoring), positions=positions)
    res = run_compare(cfg, split_specs(methods), run.out, models=model_list, collapse_margin=collapse_margin,
                      **run_kwargs(run))
    typer.echo(res.format())
    typer.echo(f"wrote {run.out}/compare.json, compare.png and one sweep directory per method")


# what `show` takes of the sweep's groups: it loads only the tokenizer and scores nothing
SHOW_MODEL = Group("model", "Model", model=Opt(), chat=Opt())
SHOW_SPLIT = Group("split", "Examples", seed=Opt(type=int), skip=Opt(type=int))
SHOW_SCORING = Group("scoring", "Scoring", engine=Opt(type=Optional[str], values=engine_values),
                     max_new_tokens=Opt(type=Optional[int]))


@uses(SweepConfig, SHOW_MODEL, TASK, SHOW_SPLIT, SHOW_SCORING)
def show(model: Args, task: Args, split: Args, scoring: Args,
         position: Optional[str] = typer.Option(None, help="the placements to show, as --positions names them: a "
                                                "slot (5), a list (0,4,9), percents of the last slot (50%), all, or "
                                                "first:second hop slots (0:1, connected); each prompt in turn; "
                                                "default: the task's first default placement"),
         example: int = typer.Option(0, help="which example: its row number in the order --seed and --skip give, "
                                             "as a sweep with them numbers its examples"),
         as_json: bool = typer.Option(False, "--json", help="print the whole record as JSON instead (several "
                                                            "placements: a list of records)")) -> None:
    """Print the exact prompt one row is scored on: chat template, system turn, answer prefix, where the gold sits."""
    t = task_fields(task, placements="position")
    shown = show_prompts(t["task"], position, example, model=model.model, chat=model.chat, data_dir=t["data_dir"],
                         task_options=t["task_options"], **vars(split), **vars(scoring))
    if as_json:
        records = [s.record for s in shown]
        typer.echo(json.dumps(records[0] if len(records) == 1 else records, indent=2, ensure_ascii=False))
    else:
        n = len(shown)  # several: each numbered, so a long listing can be searched
        typer.echo("\n\n".join((f"[{k} of {n}] " if n > 1 else "") + s.format() for k, s in enumerate(shown, 1)))


def _origin(registry, name: str) -> str:
    """` [plugin NAME (DIST VERSION)]` for an entry that did not come with posbias (posbias/registry.py)."""
    origin = registry.origins.get(name, "posbias")
    return "" if origin == "posbias" else f" [{origin}]"


def _type_name(annotation) -> str:
    """An option's type as `posbias tasks` shows it: `int`, `str` (None left out of a union; untyped: any)."""
    if annotation is None:
        return "any"
    choices = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, UnionType) else (annotation,)
    return " | ".join(getattr(c, "__name__", str(c)) for c in choices if c is not type(None))


def tasks() -> None:
    """List the tasks (and where each came from) with their options (type, default, doc, from each task's builder),
    and the JSONL schema for your own data."""
    for name, entry in TASKS.items():
        typer.echo(f"{entry.usage(name):12s} {entry.description}{_origin(TASKS, name)}")
        sets = entry.data_sets({})
        if sets:  # at its defaults (docs/data.md)
            typer.echo(f"  reads data set {', '.join(sets)}: posbias data fetch {' '.join(sets)}")
        for o, opt in entry.options.items():
            flag = f"{task_flag(o)}, " if task_flag(o) != "--" + o.replace("_", "-") else ""
            default = f", default {opt.default}" if opt.default is not None else ""
            typer.echo(f"  {o} ({flag}{_type_name(opt.type)}{default}): {opt.doc}")
    typer.echo("\nThe options go as flags (--facts 20 --digits 4, --answer-prefix for answer_prefix) or in the spec as "
               "key=value pairs: --task kv-lookup:facts=20,digits=4, --task jsonl:PATH,answers=first")
    typer.echo("\njsonl:PATH schema\n" + JSONL_SCHEMA)
    typer.echo("\njudge:PATH and mc:PATH schemas (order tasks)\n" + ORDER_SCHEMAS)


def models() -> None:
    """List the registered model names (and where each came from)."""
    for name, entry in MODELS.items():
        typer.echo(f"{name:14s} {entry.description}{_origin(MODELS, name)}")
    typer.echo("Also: a Hugging Face model directory or hub id, or a path to a .gguf file.")


def methods() -> None:
    """List the methods (and where each came from) with the spec forms each takes."""
    for name, cls in METHODS.items():
        doc = (cls.__doc__ or "").strip().split("\n")[0]
        typer.echo(f"{name:10s} {doc}{_origin(METHODS, name)}\n  {cls.spec_forms()}")
    typer.echo("\nSeveral at once: --methods none,pi:1.2,swap (posbias compare); plugins add more (docs/architecture.md).")


def backends() -> None:
    """List the backends a model spec can name (and where each came from), with the keys each takes, and the
    dialects of OpenAI-compatible servers."""
    for name, cls in BACKENDS.items():
        typer.echo(f"{name:8s} {cls.description}{_origin(BACKENDS, name)}")
        for k, v in cls.ARGS.items():
            typer.echo(f"  {k:15s} {v}")
        if cls.PASS_THROUGH:
            typer.echo("  (every key goes to the engine as it is)")
    typer.echo("\nDialects (openai:...,dialect=NAME; default: the one whose owner GET /models lists, else openai):")
    for name, d in DIALECTS.items():
        owner = f", owner '{d.owner}'" if d.owner else ""
        typer.echo(f"  {name:13s} prompts {' | '.join(d.prompts)}{owner}{_origin(DIALECTS, name)}")
    typer.echo("\nA spec: smollm2-135m | hf:DIR | vllm:DIR,tensor_parallel_size=2 | vllm:smollm2-135m | "
               "openai:model=NAME,base_url=http://127.0.0.1:8000/v1,tokenizer=DIR")


def export(model: str = typer.Argument(..., help="a model posbias loads: registered name, .gguf file, HF directory"),
           out: Path = typer.Argument(..., help="a new directory for the plain model (weights, config, tokenizer)"),
           dtype: str = field_option(SweepConfig, "dtype")) -> None:
    """Write a model as a plain Hugging Face directory any engine serves (vLLM does not read our GGUF packages)."""
    export_model(model, out, dtype)
    typer.echo(f"wrote {out} (serve it, e.g. vllm serve {out})")
