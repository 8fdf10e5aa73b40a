"""Depth x length grid: the gold at each relative depth for each context size, one sweep per size.

The grid of needle-in-a-haystack, RULER and NeedleBench (accuracy over context length x needle
depth), here with an exact (Clopper-Pearson) 95% CI per cell. The size is the task's own count option (facts,
pairs or documents) and is reported in the model's own tokens; depth d% puts the gold at slot
round(d/100 * (size - 1)) (tasks/placement.py, as `positions=d%`).

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

from ..backends import Backend, as_backend, open_backend
from ..errors import PosbiasError
from ..methods import Method, get_method
from ..models.load import Loaded
from ..runs import RunFolder, is_main_process, versions, write_json_atomic
from ..scoring.encode import encode
from ..scoring.scaleout import start_processes
from ..scoring.scorer import Scorer
from ..tasks import TASKS, Haystack, Task, get_task
from ..tasks.depths import apart, shared_problem
from .config import ModelChoice, Scoring, TaskChoice, check_split, config_dict, plain
from .grid_text import format_grid
from .longctx import REFERENCES, THRESHOLD, depth_spacing, fill_list, fill_sizes, long_record, parse_size, ruler_share
from .sweep import SweepConfig, SweepResult, run_sweep

DEFAULT_DEPTHS = ",".join(f"{d}%" for d in range(0, 101, 10))
SIZES = "5,10,20,40,80"  # the default `sizes`; with `fill` any other is refused (fill sets the lengths)


@dataclass
class GridConfig(Scoring, TaskChoice, ModelChoice):
    """A depth x length grid: sweeps at several context sizes, the gold item at relative depths, one heatmap.

    sizes: context sizes, comma-separated, in the task's size option: kv-lookup facts, kv-uuid pairs, nq docs
        (10,20), niah tokens (1k = 1024: 1k,2k,4k).
    depths: depths of the gold item, comma-separated percents of the context: 0%,50%,100% (slot = round(d/100 *
        (size - 1)); niah: the sentence boundary nearest that share of the haystack's tokens); linear:N or
        sigmoid:N spaces N depths from 0% to 100% evenly or denser at both ends (NIAH's sigmoid).
    fill: niah: lengths as shares of the model's context window instead of `sizes`, comma-separated percents
        (25%,50%,100%; 100% leaves room for the answer).
    threshold: niah: the effective length is the longest length up to which every length's accuracy stays at least
        this share of the base (NoLiMa's 0.85), under two bases: NoLiMa's (the grid's own accuracy at its lengths
        <= 1k) and the needle alone (no haystack).
    n: examples per cell.
    seed: example selection / generation seed.
    skip: start offset in the seeded example order (disjoint splits).
    method: a training-free method: a spec (`posbias.METHODS`; docs/mitigations.md) or a Method object.
    engine, max_new_tokens, batch_tokens, max_batch, prefix_sharing, prefix_attention: see `Scoring`.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    sizes: str = SIZES
    depths: str = DEFAULT_DEPTHS
    n: int = 20
    seed: int = 0
    skip: int = 0
    method: str | Method = "none"
    fill: str | None = field(default=None, metadata={"record": "if set"})
    threshold: float | None = field(default=None, metadata={"record": "if set"})

    def validate(self) -> "GridConfig":
        self._validate_task()
        self._validate_model()
        self._validate_scoring()
        check_split(self.n, self.skip)
        option, allowed = size_option(self.task)
        if option in self.task_options:
            raise PosbiasError(f"the grid sets `{option}` itself (from `sizes`)", f"drop `{option}`, list the sizes in `sizes`")
        if (self.fill or self.threshold is not None) and option != "tokens":
            raise PosbiasError("`fill` and `threshold` are for lengths in tokens (task niah)", "drop them, or use `task=niah`")
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise PosbiasError(f"`threshold` must be in (0, 1], got {self.threshold}", "use e.g. `threshold=0.85`")
        if self.fill and self.sizes != SIZES:  # one of them sets the lengths: the other would be ignored in silence
            raise PosbiasError(f"`fill` ({self.fill} of the model's window) and `sizes` ({self.sizes}) both set the "
                               "lengths", f"drop `sizes` to size them by the window, or drop `fill` to run "
                               f"`sizes={self.sizes}`")
        if self.fill:
            fill_list(self.fill)
            self.depth_list()
            return self
        sizes = self.size_list()
        if allowed is not None and any(s not in allowed for s in sizes):
            bad = ",".join(str(s) for s in sizes if s not in allowed)
            raise PosbiasError(f"{plain(self.task)} has no size {bad} (the shared data has {option} "
                               f"{' or '.join(map(str, allowed))})", f"use `sizes={','.join(map(str, allowed))}`")
        self.depth_list()
        return self

    def size_list(self) -> list[int]:
        """`sizes` as a list of distinct whole numbers >= 2, in the order given."""
        try:
            sizes = [parse_size(s.strip()) for s in self.sizes.split(",") if s.strip()]
        except ValueError:
            raise PosbiasError(f"bad `sizes` {self.sizes!r}",
                               "write comma-separated whole numbers, e.g. `sizes=5,10,20` (tokens: `sizes=1k,2k`)") from None
        if not sizes or min(sizes) < 2:
            raise PosbiasError(f"`sizes` must be whole numbers of at least 2, got {self.sizes!r}", "e.g. `sizes=5,10,20`")
        if len(set(sizes)) != len(sizes):
            raise PosbiasError(f"a size is listed twice in `sizes` {self.sizes}", "list each size once")
        return sizes

    def depth_list(self) -> list[float]:
        """`depths` as percents in 0..100 ('50%' or '50'), each once, in the order given."""
        out: list[float] = []
        spaced = depth_spacing(self.depths)
        for part in (p.strip() for p in (spaced or self.depths.split(",")) if p.strip()):
            try:
                d = float(part.removesuffix("%"))
            except ValueError:
                raise PosbiasError(f"bad depth {part!r} in `depths` {self.depths}",
                                   "write percents of the context, e.g. `depths=0%,50%,100%`") from None
            if not 0 <= d <= 100:
                raise PosbiasError(f"depth {part} is outside 0%..100%", "use depths between 0% and 100%")
            out.append(int(d) if d == int(d) else d)
        if not out:
            raise PosbiasError("no depths in `depths`", "e.g. `depths=0%,50%,100%`")
        if len(set(out)) != len(out):
            raise PosbiasError(f"a depth is listed twice in `depths` {self.depths}", "list each depth once")
        return out

    def to_dict(self) -> dict:
        return config_dict(self)


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


def size_option(task: str | Task) -> tuple[str, tuple[int, ...] | None]:
    """The task option that is the grid's size, and the sizes it allows (None: any), as the task's registration
    declares it (tasks/registry.py `size`); a clear error if none."""
    name = plain(task).partition(":")[0] if isinstance(task, str) else getattr(task, "name", str(task))
    entry = TASKS.get(name)
    if isinstance(task, Task) or entry is None or entry.size is None:
        has = ", ".join(f"{t} ({e.size[0]})" for t, e in TASKS.items() if e.size)
        why = "a depth grid grows the context of one gold item"
        if _kind(task) == "two-hop":
            raise PosbiasError(f"{name} is a two-hop task: {why}", f"use a task with a size: {has}")
        raise PosbiasError(f"task {name} has no size option to grow ({why})", f"use a task with a size: {has}")
    return entry.size


def _kind(task: str | Task) -> str | None:
    """The task's kind (Task.kind), for the refusal's reason; None where it cannot be built as it is written."""
    try:
        return (task if isinstance(task, Task) else get_task(plain(task))).kind
    except PosbiasError:
        return None


def depth_slots(depths: list[float], task: Task) -> list[int]:
    """The slot of each depth: as `positions=d%` resolves it on the task (round(d/100 * (size-1)) for a count of
    items; niah: d x 10 of its 0.1% slots)."""
    return [task.placements(f"{d}%")[0] for d in depths]


def _answer_room(cfg: GridConfig, task: Task, loaded: Backend) -> int:
    """Tokens a full window keeps free for the answer, and a margin of 8 for token merges: a generated answer's
    limit (a needle file's derived from its answers); a teacher-forced one's longest answer, at least 12 tokens."""
    scorer = Scorer(loaded, task, cfg.engine, cfg.max_new_tokens, cfg.chat)
    if scorer.engine.name == "generate" or cfg.max_new_tokens:
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
        for ex in examples if isinstance(task, Haystack) and task.context == "full" else ():
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
    cfg = (cfg or GridConfig()).validate()
    method = get_method(cfg.method)  # parse (and read factor files) before loading anything
    option, _ = size_option(cfg.task)
    depths = cfg.depth_list()
    probe = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)  # its options checked before loading
    probe.check_engine(cfg.engine or probe.default_engine)  # e.g. teacher forcing a needle without an answer prefix
    probe.examples(cfg.n, cfg.seed, cfg.skip)  # enough of them (a needle file of one line has one)
    method = method.for_task(probe)  # every size is the same kind of task; recorded resolved
    folder = RunFolder(out, "grid", "grid.json", ("size-*", "ref-*", "heatmap.png", "timing.json"))
    folder.check(resume, overwrite)
    start_processes()  # several processes: join their group first (each rank's own GPU)
    opened = loaded is None
    loaded = as_backend(loaded) if loaded is not None else open_backend(cfg.spec, cfg.dtype, cfg.device, progress,
                                                                        cfg.device_map)
    try:
        window = loaded.context_window
        sizes = cfg.size_list() if not cfg.fill else fill_sizes(cfg.fill, window, _answer_room(cfg, probe, loaded))
        tasks = {s: get_task(cfg.task, data_dir=cfg.data_dir, **{**cfg.task_options, option: s}) for s in sizes}
        return _grid(cfg, out, loaded, method, tasks, folder, option, sizes, depths, resume, overwrite, progress)
    finally:
        if opened:
            loaded.close()


def _grid(cfg, out, loaded: Backend, method, tasks, folder, option, sizes, depths, resume, overwrite, progress):
    loaded.check_method(method)
    check_window(loaded, cfg, tasks)  # every size, before the first one runs
    slots = {s: depth_slots(depths, t) for s, t in tasks.items()}
    fingerprint = {"config": cfg.to_dict(), "size_option": option, "slots": {str(s): v for s, v in slots.items()},
                   "model": loaded.info, "method": method.config()}
    with folder.open(fingerprint, resume, overwrite):
        t0 = time.perf_counter()
        results = {}
        for s in sizes:
            results[s] = _sub_sweep(folder, f"size-{s}", _sweep_config(cfg, s, slots[s], method), loaded, progress)
        engine = results[sizes[0]].config["engine"]  # the references run on the cells' own (resolved) engine
        refs = _references(replace(cfg, engine=engine), folder, loaded, method, tasks, sizes[0], progress)
        record = grid_record(cfg, option, depths, slots, results, loaded, method)
        if refs:
            long_record(record, results, refs, loaded.context_window, cfg.threshold or THRESHOLD)
        if folder.path is not None and is_main_process():  # several processes: rank 0 writes
            _write(folder, record, time.perf_counter() - t0)
    rows = [{**row, "size": s, "depth": d, **_partial(row)} for s, res in results.items()
            for d, p in zip(depths, slots[s]) for row in res.rows if row["position"] == p]
    return GridResult(record["cells"], record["sizes"], record["config"], record, folder.path, rows)


def _partial(row: dict) -> dict:
    """A row that asks several values keeps RULER's partial credit beside its all-or-nothing `correct`."""
    answers = row.get("answers") or ()
    return {"partial": ruler_share(row.get("prediction") or "", answers)} if len(answers) > 1 else {}


def _references(cfg, folder, loaded, method, tasks, size, progress) -> dict[str, SweepResult]:
    """niah with a haystack: the closed-book and needle-alone sweeps on the same examples and engine (cfg.engine, the
    cells' resolved one; eval/longctx.py)."""
    if getattr(tasks[size], "context", None) != "full":
        return {}
    out = {}
    for name, context in REFERENCES.items():
        out[name] = _sub_sweep(folder, f"ref-{name}", _sweep_config(cfg, size, [0], method, context=context), loaded,
                               progress)
    return out


def _sub_sweep(folder: RunFolder, name: str, sweep: SweepConfig, loaded: Backend, progress: bool) -> SweepResult:
    """One sweep in the grid's folder (OUT/name), resumed where a resumed grid had started it."""
    sub = folder.file(name) if folder.path is not None else None
    started = sub is not None and RunFolder(sub, "sweep", "sweep.json").started()
    return run_sweep(sweep, sub, loaded=loaded, resume=folder.resuming and started, progress=progress)


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
            "task": plain(cfg.task), "size_option": option, "sizes": sizes, "depths": depths, "cells": cells}


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
