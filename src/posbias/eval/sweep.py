"""Position sweep: every example at every requested gold position, scored, summarised, saved.

Files in the output directory:
  examples.jsonl  one row per example x position, appended batch by batch (resume reads it)
  sweep.partial.json  the run's fingerprint while it is unfinished
  sweep.json      written atomically once every row is scored
  curve.png       accuracy against position with a 95% CI band
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..core.metrics import summarize_curve, wilson_ci
from ..errors import PosbiasError
from ..io import write_json_atomic
from ..models.load import Loaded, load_model
from ..tasks import get_task, resolve_positions
from .runner import build_rows, check_window, score_rows, use_chat


@dataclass
class SweepConfig:
    model: str = "smollm2-135m"
    task: str = "kv-lookup"
    task_options: dict = field(default_factory=dict)  # facts, digits, docs, pairs
    positions: str = "all"
    n: int = 100
    seed: int = 0
    skip: int = 0  # start offset in the example order (disjoint splits)
    engine: str | None = None  # None: the task's default
    max_new_tokens: int | None = None  # None: the task's default (generate engine)
    chat: str = "auto"
    dtype: str = "bf16"
    device: str = "cpu"
    batch_tokens: int = 16384
    max_batch: int = 32
    data_dir: str | None = None
    method: str = "none"  # a methods.get_method spec: none | pi:1.2 | lpes:DIR/factors.json | mspoe | buckets


@dataclass
class SweepResult:
    config: dict
    per_position: list[dict]
    summary: dict
    rows: list[dict]
    record: dict  # the content of sweep.json


def _versions() -> dict:
    import torch
    import transformers

    from .. import __version__

    return {"posbias": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__}


def _read_rows(path: Path) -> list[dict]:
    """Rows of examples.jsonl; a torn last line (a kill mid-write) is dropped from the file."""
    if not path.exists():
        return []
    good, keep = [], 0
    with path.open("rb") as f:
        for line in f:
            try:
                good.append(json.loads(line))
                keep += len(line)
            except json.JSONDecodeError:
                break
    with path.open("r+b") as f:
        f.truncate(keep)
    return good


def per_position_stats(rows: list[dict], positions: list[int], example_ids: list[str]) -> tuple[list[dict], dict]:
    by_key = {(r["example_id"], r["position"]): bool(r["correct"]) for r in rows}
    m = np.array([[by_key[(e, p)] for p in positions] for e in example_ids], dtype=bool)
    per = []
    for j, p in enumerate(positions):
        k, n = int(m[:, j].sum()), m.shape[0]
        lo, hi = wilson_ci(k, n)
        per.append({"position": p, "n": n, "correct": k, "accuracy": k / n, "ci_low": lo, "ci_high": hi})
    return per, summarize_curve(positions, m).as_dict()


def run_sweep(
    cfg: SweepConfig,
    out_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    loaded: Loaded | None = None,
    progress: bool = True,
) -> SweepResult:
    """Run (or resume) a sweep. With out_dir=None nothing is written (API use)."""
    from ..methods import get_method

    method = get_method(cfg.method)  # parse (and read factor files) before loading anything
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    positions = resolve_positions(cfg.positions, task.n_slots)
    if cfg.n < 1:
        raise PosbiasError(f"--n must be at least 1, got {cfg.n}", "use --n 1 or more")
    engine = cfg.engine or task.default_engine
    max_new = cfg.max_new_tokens or task.max_new_tokens
    examples = task.examples(cfg.n, cfg.seed, cfg.skip)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        _check_out_dir(out, resume, overwrite)
    if loaded is None:
        loaded = load_model(cfg.model, cfg.dtype, cfg.device)
    chat = use_chat(loaded, cfg.chat)
    rows = build_rows(loaded, task, examples, positions, chat)
    check_window(rows, loaded.context_window, engine, max_new)

    resolved = {**asdict(cfg), "engine": engine, "max_new_tokens": max_new, "chat_used": chat,
                "positions_resolved": positions}
    fingerprint = {"config": resolved, "task": task.config(), "model": loaded.info, "method": method.config()}
    done_rows: list[dict] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        partial, final = out / "sweep.partial.json", out / "sweep.json"
        if resume:
            old = json.loads((partial if partial.exists() else final).read_text())
            if {k: old.get(k) for k in fingerprint} != json.loads(json.dumps(fingerprint)):
                raise PosbiasError(
                    f"{out} holds a sweep with a different configuration", "rerun it with the same options, or use --overwrite"
                )
            done_rows = _read_rows(out / "examples.jsonl")
        else:
            (out / "examples.jsonl").unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        write_json_atomic(partial, fingerprint, indent=2)
    done = {(r["example_id"], r["position"]) for r in done_rows}

    bar = _progress(len(rows), len(done), progress, f"{cfg.task} on {cfg.model}")
    t0 = time.perf_counter()
    log = (out / "examples.jsonl").open("a", encoding="utf-8") if out is not None else None

    def on_batch(new: list[dict]) -> None:
        if log is not None:
            log.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new))
            log.flush()
        if bar is not None:
            bar.update(len(new))

    try:
        with method.apply(loaded) as handle:
            new_rows = score_rows(loaded, rows, engine, task.metric, max_new, cfg.batch_tokens, cfg.max_batch,
                                  done, on_batch, prompt_end=getattr(handle, "set_prompt_end", None))
    finally:
        if log is not None:
            log.close()
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - t0

    all_rows = done_rows + new_rows
    per, summary = per_position_stats(all_rows, positions, [e.id for e in examples])
    record = {**fingerprint, "versions": _versions(), "per_position": per, "summary": summary}
    if out is not None:
        from ..report.plots import plot_curve

        label = "" if method.name == "none" else f", {method.label}"
        plot_curve(per, f"{task.name} on {cfg.model}{label} (n={cfg.n}, {engine})", out / "curve.png")
        write_json_atomic(out / "timing.json", {"seconds_this_run": elapsed, "rows_this_run": len(new_rows)}, indent=2)
        write_json_atomic(out / "sweep.json", record, indent=2)  # last: its presence means "complete"
        (out / "sweep.partial.json").unlink(missing_ok=True)
    return SweepResult(resolved, per, summary, all_rows, record)


def _check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise PosbiasError("--resume and --overwrite contradict each other", "pass one of them")
    if out.exists() and not out.is_dir():
        raise PosbiasError(f"--out {out} is a file", "pass a directory path")
    started = (out / "examples.jsonl").exists() or (out / "sweep.json").exists()
    if started and not (resume or overwrite):
        raise PosbiasError(f"{out} already holds a sweep", "pass --resume to continue it or --overwrite to start again")
    if resume and not (out / "sweep.partial.json").exists() and not (out / "sweep.json").exists():
        raise PosbiasError(f"nothing to resume in {out}", "drop --resume to start a new sweep")


def _progress(total: int, initial: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="row", dynamic_ncols=True)


def format_table(per: list[dict], summary: dict) -> str:
    lines = [f"{'position':>8}  {'accuracy':>8}  {'95% CI':>15}  {'n':>5}"]
    for r in per:
        lines.append(f"{r['position']:>8}  {r['accuracy']:>8.3f}  [{r['ci_low']:.3f}, {r['ci_high']:.3f}]  {r['n']:>5}")
    s = summary
    lines.append(
        f"average {s['average']:.3f} | best {s['best']:.3f} (pos {s['best_position']}) | worst {s['worst']:.3f} "
        f"(pos {s['worst_position']}) | gap {s['gap']:.3f} [{s['gap_ci'][0]:.3f}, {s['gap_ci'][1]:.3f}] | std {s['std']:.3f}"
    )
    return "\n".join(lines)
