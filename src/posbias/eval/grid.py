"""Depth x length grid: the gold at each relative depth for each context size, one sweep per size.

The grid of needle-in-a-haystack, RULER and NeedleBench (accuracy over context length x needle
depth), here with an exact (Clopper-Pearson) 95% CI per cell. The size is the task's own count option (facts,
pairs or documents) and is reported in the model's own tokens; depth d% puts the gold at slot
round(d/100 * (size - 1)) (tasks/placement.py, as `positions=d%`). `run_grid` is `GridRun.plan(...).run(loaded)`;
the config and what it checks before a model loads: eval/grid_config.py.

Files in the output folder (runs.RunFolder protocol):
  run.json       the grid's fingerprint (resume compares it)
  size-<S>/      one normal sweep folder per size (each resumable; a finished one is reused)
  grid.json      written atomically once every size is scored: its presence means complete
  heatmap.png    accuracy per (size, depth) with the numbers in the cells; timing.json
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..backends import Backend
from ..errors import PosbiasError
from ..methods import Method, get_method
from ..models.load import Loaded
from ..runs import RunFolder, is_main_process, versions, write_json_atomic
from ..scoring.encode import encode
from ..scoring.engines import engine_kind
from ..scoring.scorer import Scorer
from ..tasks import Haystack, Task, get_task
from ..tasks.depths import apart, shared_problem
from .config import jsonable
from .grid_config import GridConfig, size_option
from .grid_text import format_grid
from .longctx import THRESHOLD, fill_sizes, long_record, ruler_share
from .opening import opened
from .sweep import SweepConfig, SweepResult, run_sweep


@dataclass
class GridResult:
    """A depth x length grid: `record` is grid.json; `rows` has one flat dict per size x depth x example (the size's
    sweep row at the depth's slot, with `size` and `depth` added); `format()` is what `posbias grid` prints."""

    cells: list[dict]  # one per (size, depth): size, depth, position, n, correct, accuracy, ci_low, ci_high, tokens_mean
    sizes: list[dict]  # per size: size, dir, positions, tokens (mean/min/max), summary (the sweep's), merged_depths
    config: dict
    record: dict = field(repr=False)  # the content of grid.json
    out: Path | None = None
    rows: list[dict] = field(default_factory=list, repr=False)  # one per size x depth x example

    def format(self) -> str:
        """A header (task, model, sizes x depths, examples per cell, engine), then accuracy per cell (`format_grid`)."""
        c, r = self.config, self.record
        head = (f"{r['task']} on {r['model'].get('name', c['model'])}: {len(self.sizes)} sizes x {len(r['depths'])} depths, "
                f"{c['n']} examples per cell, engine {c['engine']}")
        return head + "\n" + format_grid(r)


def depth_slots(depths: list[float], task: Task) -> list[int]:
    """The slot of each depth: as `positions=d%` resolves it on the task (round(d/100 * (size-1)) for a count of
    items; niah: d x 10 of its 0.1% slots)."""
    return [task.placements(f"{d}%")[0] for d in depths]


def _answer_room(cfg: GridConfig, task: Task, loaded: Backend) -> int:
    """Tokens a full window keeps free for the answer, and a margin of 8 for token merges: a generated answer's
    limit (a needle file's derived from its answers); a teacher-forced one's longest answer, at least 12 tokens."""
    scorer = Scorer(loaded, task, cfg.engine, cfg.max_new_tokens, cfg.chat)
    if scorer.engine.kind == "generate" or cfg.max_new_tokens:
        return scorer.max_new_tokens + 8
    answers = [a for ex in task.examples(cfg.n, cfg.seed, cfg.skip) for a in ex.answers]
    return max(12, *(scorer.count_tokens(a) for a in answers)) + 8


def _sweep_config(cfg: GridConfig, size: int, slots: list[int], method: Method, **extra) -> SweepConfig:
    option, _ = size_option(cfg.task)
    return SweepConfig(model=cfg.model, dtype=cfg.dtype, device=cfg.device, device_map=cfg.device_map, chat=cfg.chat,
                       task=cfg.task, task_options={**cfg.task_options, option: size, **extra}, data_dir=cfg.data_dir,
                       engine=cfg.engine, max_new_tokens=cfg.max_new_tokens, batch_tokens=cfg.batch_tokens,
                       max_batch=cfg.max_batch, prefix_sharing=cfg.prefix_sharing, prefix_attention=cfg.prefix_attention,
                       positions=",".join(map(str, sorted(set(slots)))), n=cfg.n, seed=cfg.seed, skip=cfg.skip,
                       method=method)


def check_window(loaded: Backend, cfg: GridConfig, tasks: dict[int, Task]) -> None:
    """Build every size's prompts and refuse the grid, before anything runs, if one would not fit the window (a
    chat-only server without a tokenizer: its own check, per request)."""
    if loaded.tokenizer is None:
        return
    window, option = loaded.context_window, size_option(cfg.task)[0]
    over = []
    for size, task in tasks.items():
        scorer = Scorer(loaded, task, cfg.engine, cfg.max_new_tokens, cfg.chat, cfg.batch_tokens, cfg.max_batch)
        slots = sorted(set(depth_slots(cfg.depth_list(), task)))
        examples = task.examples(cfg.n, cfg.seed, cfg.skip)
        rows = [encode(loaded.tokenizer, task.build(ex, p), scorer.chat) for ex in examples for p in slots]
        for ex in examples if isinstance(task, Haystack) and task.has_haystack else ():
            if info := task.depth_clash(ex, slots):  # two depths on one place: one prompt scored under both
                t = apart(size, info, lambda t: task.depth_clash(ex, slots, t))  # noqa: B023 (called at once)
                raise PosbiasError(shared_problem(ex.id, size, info), f"use a longer length than {size} tokens ({t} "
                                   "or more, in `sizes` or by `fill`), depths further apart, or a haystack of shorter "
                                   "sentences")
        need = max(scorer.engine.need(r, scorer.max_new_tokens) for r in rows)
        if need > window:
            over.append((size, need))
    if over:
        fits = [s for s in tasks if s not in dict(over)]
        what = "; ".join(f"{option} {s} needs up to {t} tokens" for s, t in over)
        raise PosbiasError(f"{what} (prompt + answer) but the model's context window is {window}",
                           f"drop {','.join(str(s) for s, _ in over)} from `sizes`"
                           + (f", e.g. `sizes={','.join(map(str, fits))}`" if fits else ", use fewer"))


def run_grid(cfg: GridConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | Backend | None = None,
             resume: bool = False, overwrite: bool = False, progress: bool = True) -> GridResult:
    """Run (or resume) a depth x length grid: one sweep per size (OUT/size-S/), grid.json written last; cfg.model is
    any model spec (in process or served: the backend opened once, for every size)."""
    return GridRun.plan(cfg, out, resume=resume, overwrite=overwrite, progress=progress).run(loaded)


@dataclass
class GridRun:
    """One grid's parts in one object: `plan` resolves and checks what needs no model (the config, the method, the
    size option, the depths, a task at the options given, the run folder); `run` opens the backend unless given one
    (`opened`), sizes the tasks (`fill`: by its window), checks every size against the window, then runs one sweep
    per size and the references (`run_sweep`) and writes grid.json last."""

    cfg: GridConfig
    method: Method
    option: str  # the task option the grid grows (`size_option`)
    depths: list[float]
    probe: Task  # the task at the options given: checked before loading, and what `fill` sizes the answer room by
    folder: RunFolder
    resume: bool = False
    overwrite: bool = False
    progress: bool = True

    @classmethod
    def plan(cls, cfg: GridConfig | None = None, out: str | Path | None = None, *, resume: bool = False,
             overwrite: bool = False, progress: bool = True) -> "GridRun":
        """Everything a grid checks before a model loads (a bad option, file or method is refused here)."""
        cfg = (cfg or GridConfig()).validate()
        method = get_method(cfg.method)  # parse (and read factor files) before loading anything
        option, _ = size_option(cfg.task)
        depths = cfg.depth_list()
        probe = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)  # its options checked before loading
        probe.check_engine(engine_kind(cfg.engine or probe.default_engine))  # e.g. teacher forcing a bare needle
        probe.examples(cfg.n, cfg.seed, cfg.skip)  # enough of them (a needle file of one line has one)
        method = method.for_task(probe)  # every size is the same kind of task; recorded resolved
        folder = RunFolder(out, "grid", "grid.json", ("size-*", "ref-*", "heatmap.png", "timing.json"))
        folder.check(resume, overwrite)
        return cls(cfg, method, option, depths, probe, folder, resume, overwrite, progress)

    def run(self, loaded: Loaded | Backend | None = None) -> GridResult:
        cfg, method = self.cfg, self.method
        with opened(cfg.spec if loaded is None else loaded, cfg, self.progress) as backend:
            tasks = self.tasks(backend)
            backend.check_method(method)
            check_window(backend, cfg, tasks)  # every size, before the first one runs
            slots = {s: depth_slots(self.depths, t) for s, t in tasks.items()}
            fingerprint = {"config": cfg.to_dict(), "size_option": self.option,
                           "slots": {str(s): v for s, v in slots.items()}, "model": backend.info, "method": method.config()}
            with self.folder.open(fingerprint, self.resume, self.overwrite):
                t0 = time.perf_counter()
                results = {s: self._sweep(f"size-{s}", _sweep_config(cfg, s, slots[s], method), backend) for s in tasks}
                engine = next(iter(results.values())).config["engine"]  # the references run on the cells' own engine
                refs = self.references(backend, tasks, engine)
                record = grid_record(cfg, self.option, self.depths, slots, results, backend, method)
                if refs:
                    long_record(record, results, refs, backend.context_window, cfg.threshold or THRESHOLD)
                if self.folder.path is not None and is_main_process():  # several processes: rank 0 writes
                    _write(self.folder, record, time.perf_counter() - t0)
        rows = [{**row, "size": s, "depth": d, **_partial(row)} for s, res in results.items()
                for d, p in zip(self.depths, slots[s]) for row in res.rows if row["position"] == p]
        return GridResult(record["cells"], record["sizes"], record["config"], record, self.folder.path, rows)

    def tasks(self, backend: Backend) -> dict[int, Task]:
        """The task at each size, in the order of `sizes` (`fill`: the lengths that fill those shares of the window)."""
        cfg, window = self.cfg, backend.context_window
        sizes = cfg.size_list() if not cfg.fill else fill_sizes(cfg.fill, window, _answer_room(cfg, self.probe, backend))
        return {s: get_task(cfg.task, data_dir=cfg.data_dir, **{**cfg.task_options, self.option: s}) for s in sizes}

    def references(self, backend: Backend, tasks: dict[int, Task], engine: str) -> dict[str, SweepResult]:
        """niah with a haystack: the closed-book and needle-alone sweeps on the first size's examples and the cells'
        resolved engine (eval/longctx.py)."""
        size = next(iter(tasks))
        task = tasks[size]
        if not (isinstance(task, Haystack) and task.has_haystack):
            return {}
        cfg = replace(self.cfg, engine=engine)
        return {name: self._sweep(f"ref-{name}", _sweep_config(cfg, size, [0], self.method, context=context), backend)
                for name, context in task.references.items()}

    def _sweep(self, name: str, sweep: SweepConfig, backend: Backend) -> SweepResult:
        """One sweep in the grid's folder (OUT/name), resumed where a resumed grid had started it."""
        sub = self.folder.file(name) if self.folder.path is not None else None
        started = sub is not None and RunFolder(sub, "sweep", "sweep.json").started()
        return run_sweep(sweep, sub, loaded=backend, resume=self.folder.resuming and started, progress=self.progress)


def _partial(row: dict) -> dict:
    """A row that asks several values keeps RULER's partial credit beside its all-or-nothing `correct`."""
    answers = row.get("answers") or ()
    return {"partial": ruler_share(row.get("prediction") or "", answers)} if len(answers) > 1 else {}


def grid_record(cfg: GridConfig, option: str, depths: list[float], slots: dict[int, list[int]],
                results: dict[int, SweepResult], loaded: Backend, method: Method) -> dict:
    """The content of grid.json: config, model, versions, per-size token counts and summaries, tidy cells."""
    first = next(iter(results.values()))
    resolved = {**cfg.to_dict(), **{k: first.config[k] for k in ("engine", "max_new_tokens", "chat_used", "decoding")},
                "size_option": option}
    sizes, cells = [], []
    for s, res in results.items():
        merged = _merged(depths, slots[s])
        sizes.append({"size": s, "dir": f"size-{s}", "positions": slots[s], "tokens": _tokens(res.rows),
                      "task": res.record["task"], "summary": res.summary, "merged_depths": merged})
        cells += _cells(s, depths, slots[s], res)
    return {"config": resolved, "model": loaded.info, "method": method.config(), "versions": versions(),
            "task": jsonable(cfg.task), "size_option": option, "sizes": sizes, "depths": depths, "cells": cells}


def _tokens(rows: list[dict]) -> dict:
    """Prompt length in the model's own tokens over a sweep's rows."""
    t = np.array([r["prompt_tokens"] for r in rows])
    return {"mean": float(t.mean()), "min": int(t.min()), "max": int(t.max())}


def _merged(depths: list[float], slots: list[int]) -> list[dict]:
    """Slots that several depths resolve to at this size (small sizes): said, not silently dropped."""
    by_slot: dict[int, list[float]] = {}
    for d, p in zip(depths, slots):
        by_slot.setdefault(p, []).append(d)
    return [{"position": p, "depths": ds} for p, ds in by_slot.items() if len(ds) > 1]


def _cells(size: int, depths: list[float], slots: list[int], res: SweepResult) -> list[dict]:
    """One tidy row per depth: the sweep's statistics at the depth's slot, the mean prompt tokens there."""
    per = {r["position"]: r for r in res.per_position}
    true = {t["position"]: t["mean"] for t in res.summary.get("true_depths", ())}  # niah: the needles' mean depth
    out = []
    for d, p in zip(depths, slots):
        r = per[p]
        toks = [row["prompt_tokens"] for row in res.rows if row["position"] == p]
        out.append({"size": size, "depth": d, "position": p, "n": r["n"], "correct": r["correct"],
                    "accuracy": r["accuracy"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                    "tokens_mean": float(np.mean(toks)), **({"true_depth": true[p]} if p in true else {}),
                    "same_slot_as": [o for o, q in zip(depths, slots) if q == p and o != d]})
    return out


def _write(folder: RunFolder, record: dict, seconds: float) -> None:
    from ..report.grid_plots import plot_grid_heatmap

    c = record["config"]
    m = "" if record["method"].get("name", "none") == "none" else f", {c['method']}"
    title = f"{record['task']} on {c['model']}{m} (n={c['n']} per cell, {c['engine']})"
    plot_grid_heatmap(record, title, folder.file("heatmap.png"))
    write_json_atomic(folder.file("timing.json"), {"seconds_this_run": seconds}, indent=2)
    folder.finish(record)  # last: its presence means "complete"
