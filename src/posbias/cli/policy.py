"""`posbias policy export RUN`: a finished sweep's slot ranking as a policy file a RAG pipeline applies (docs/rag.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import PosbiasError
from ..measure import ranking_note, read_policy, write_policy

policy_app = typer.Typer(no_args_is_help=True)  # help: the callback's docstring


@policy_app.callback()
def _policy_group() -> None:
    """Slot policies: where a model reads best, measured, for LangChain / LlamaIndex pipelines (docs/rag.md)."""


@policy_app.command("export")
def export(
    run: Path = typer.Argument(..., help="a finished sweep folder of the unmodified model (every slot), or its sweep.json "
                                         "(its run.json: the folder; a comparison: its entry folder COMPARE/none)"),
    out: Optional[Path] = typer.Option(None, help="the policy file to write (default: RUN/policy.json)"),
) -> None:
    """Write a finished sweep's slot policy: its slots ranked by accuracy (best first), each slot's accuracy and 95%
    interval, and how it was measured. PolicyReorder (LangChain), PolicyNodePostprocessor (LlamaIndex) and
    --method curve:RUN apply it."""
    policy = read_policy(run)  # refuses, in one line, a folder with no finished sweep, naming what to pass instead
    target = out if out is not None else (run if run.is_dir() else run.parent) / "policy.json"
    if target.is_dir():
        raise PosbiasError(f"--out {target} is a folder", "pass --out the path of the policy file to write")
    try:
        written = write_policy(policy, target)
    except OSError as e:
        raise PosbiasError(f"cannot write {target} ({e.strerror or type(e).__name__})",
                           "pass --out a file in a folder you can write") from None
    typer.echo(policy_table(policy))
    note = ranking_note(policy)
    if note:
        typer.echo(note)
    typer.echo(f"wrote {written}; apply it with PolicyReorder / PolicyNodePostprocessor (docs/rag.md) or "
               f"--method curve:{written}")


def policy_table(policy: dict) -> str:
    """The policy as a short table in slot order: slot, accuracy, 95% CI, rank (1: the best-read slot)."""
    rank = {s: r + 1 for r, s in enumerate(policy["ranking"])}
    task = policy["task"].get("name", "?")
    lines = [f"slot policy of {policy['model']} on {task} ({policy['n_slots']} slots)",
             f"{'slot':>4}  {'accuracy':>8}  {'95% CI':<14}  {'rank':>4}"]
    for s in policy["slots"]:
        lo, hi = s["ci"]
        lines.append(f"{s['slot']:>4}  {s['accuracy']:>8.3f}  [{lo:.3f}, {hi:.3f}]  {rank[s['slot']]:>4}")
    lines.append("ranking, best first: " + " ".join(map(str, policy["ranking"])))
    return "\n".join(lines)
