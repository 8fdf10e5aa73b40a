"""Several methods (and models) on the same examples: one sweep per entry (each resumable), one table, one plot.

An entry is a method applied to a model; `models` (e.g. the base model and the model directories
a distillation writes) gives one entry per model and method. Files in OUT: <slug>/ per entry (a
normal sweep folder), compare.json (atomic, last), compare.png (accuracy against position, one
line per entry).
"""

from __future__ import annotations

import json
import re
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..backends import Backend, check_method, parse_spec
from ..core.metrics import paired_difference
from ..errors import PosbiasError
from ..methods import Method, get_method
from ..models.load import Loaded
from ..runs import JsonlLog, RunFolder, is_main_process
from ..tasks import Task, label, placement_key
from .compare_text import format_compare
from .config import jsonable, spec_identity, spec_label
from .cost import spent_usd
from .opening import opened
from .sweep import ROW_KEYS, SweepConfig, preflight, run_sweep, with_resume_hint

PATH_KEYS = ("scoring_path", "scoring_note")  # which scoring path each entry ran (Scorer.settings), and why
COLLAPSE_MARGIN = 0.10  # the collapse guard: a larger loss at any one position flags an entry


@dataclass
class CompareResult:
    """A comparison: `record` is compare.json; `rows` has one flat dict per model x method x example x placement (a
    sweep row with its entry's model, method and label); `format()` is what `posbias compare` prints."""

    entries: list[dict]  # per (model, method): model, method, label, dir, method_config, per_position, summary, vs_first
    config: dict
    record: dict = field(repr=False)  # the content of compare.json
    rows: list[dict] = field(default_factory=list, repr=False)  # every entry's rows, each with its model, method, label

    def format(self) -> str:
        """One row per entry (accuracy per placement, average, gap, paired difference from the first entry, collapse
        flags), then each entry's scoring note."""
        notes = [f"note: {e['scoring_note']}" for e in self.entries if e.get("scoring_note")]
        return "\n".join([format_compare(self.record), *notes])


def slug(spec: str) -> str:
    """A directory name for a method spec (`lpes:runs/x/factors.json` -> `lpes-runs-x-factors.json`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-") or "none"


def refuse_overlap(cfg: SweepConfig, split: dict | None, what: str) -> None:
    """Raise if `split` (task, seed, skip, n: examples a search or training used) overlaps cfg's examples."""
    if not split or split.get("task") != jsonable(cfg.task) or split.get("seed") != cfg.seed:
        return
    lo, hi = split["skip"], split["skip"] + split["n"]
    if lo < cfg.skip + cfg.n and cfg.skip < hi:
        raise PosbiasError(
            f"{what} on examples {lo}..{hi - 1} of {split['task']}, which overlap the {cfg.skip}..{cfg.skip + cfg.n - 1}"
            " asked for here", f"report on held-out examples, e.g. `skip={hi}`"
            + (f", or `n={lo - cfg.skip}`" if lo > cfg.skip else ""))


def distill_record(model: str | Loaded) -> dict | None:
    """posbias_distill.json inside a model directory a distillation wrote (it travels with the model)."""
    where = model.info.get("source", "") if isinstance(model, (Loaded, Backend)) else model
    p = Path(str(where)) / "posbias_distill.json"
    return json.loads(p.read_text()) if p.is_file() else None


def model_name(model: str | Loaded) -> str:
    return model.info.get("name", "model") if isinstance(model, (Loaded, Backend)) else model


def model_label(model: str | Loaded) -> str:
    """`runs/p2d/full/model` (a distillation output) -> `full`; a served spec its short name (`openai:smollm2`);
    anything else its name."""
    name = model_name(model)
    return Path(name).parent.name if distill_record(model) else spec_label(name)


def model_key(model: str | Loaded) -> str:
    """What names a model's entries and their folders: a distillation output's folder name; a served spec less its
    transport keys (timeout=, concurrency=, ...: a resume may change them); anything else its name."""
    name = model_name(model)
    return Path(name).parent.name if distill_record(model) else spec_identity(name)


def entry_dir(model, method: Method, named: bool) -> str:
    """The folder of one (model, method) entry inside the comparison's."""
    return slug(f"{model_key(model)}@{method.key}") if named else slug(method.key)


def _check_entries(cfg: SweepConfig, methods: list[Method], models: list):
    """Refuse a comparison that cannot run, before any work; -> the task (built once here)."""
    if not methods:
        raise PosbiasError("no methods given", "pass `methods` such as none,pi:1.1,mspoe,buckets,lpes:DIR/factors.json")
    keys = [m.key for m in methods]
    if len(set(keys)) != len(keys):
        raise PosbiasError(f"a method is listed twice in {','.join(keys)}", "list each method once")
    names = [model_key(m) for m in models]  # two specs that differ only in how requests travel are one model
    if not names or len(set(names)) != len(names):
        raise PosbiasError(f"`models` must list distinct models, got {','.join(names)}", "list each model once")
    task = _task(cfg)
    for m in methods:  # never report a method on the examples it was fitted on
        refuse_overlap(cfg, m.fitted_on, f"{m.key} was searched")
        preflight(cfg, m.for_task(task), task, task.placements(cfg.positions))  # before the first entry runs
    for mo in models:  # nor a distilled model on its training examples
        refuse_overlap(cfg, (distill_record(mo) or {}).get("train_split"), f"{model_name(mo)} was trained")
    return task


def run_compare(cfg: SweepConfig | None = None, methods: Sequence[str | Method] = ("none",), out: str | Path | None = None,
                *, models: Sequence[str | Loaded | Backend] | None = None, loaded: Loaded | Backend | None = None,
                resume: bool = False, overwrite: bool = False, progress: bool = True,
                collapse_margin: float = COLLAPSE_MARGIN) -> CompareResult:
    """Run `cfg` once per (model, method) entry, each model loaded once; compare.json is written last.

    models: None = cfg.model only (or `loaded`), entries named by method; several (names, directories or
    loaded models) = every model with every method, entries named by model.
    loaded: a model already in memory (`load_model`, `wrap_model`) used instead of cfg.model; the run records its
    name, dtype and device (a non-default cfg.dtype / cfg.device it contradicts is refused).
    collapse_margin: on a free-answer task, an entry that loses more than this at any position against the first
    entry is flagged as collapsed; on every task, one whose average falls to the task's chance level while the first
    entry's is above it (`collapse` in each entry; `_flag_collapse`)."""
    cfg = (cfg or SweepConfig()).validate()
    if not 0 < collapse_margin <= 1:
        raise PosbiasError(f"`collapse_margin` must be in (0, 1], got {collapse_margin}", "pass `collapse_margin=0.1`")
    return CompareRun.plan(cfg, methods, out, models=models, loaded=loaded, resume=resume, overwrite=overwrite,
                           progress=progress).run(collapse_margin)


@dataclass
class CompareRun:
    """One comparison's parts in one object: `plan` resolves and checks every entry before any model loads (methods,
    models, the examples they were fitted or trained on, what a served model cannot run, the run folder); `run` opens
    the models one at a time (`_backends`), runs each entry's sweep (`run_sweep`, eval/sweep.py) and writes
    compare.json last."""

    cfg: SweepConfig  # validated (`run_compare`)
    methods: list[Method]
    models: list  # the entries' models: `models`, or the one model (`loaded` or cfg.model)
    named: bool  # entries named by model (`models` given) or by method
    task: Task
    folder: RunFolder
    resume: bool = False
    overwrite: bool = False
    progress: bool = True

    @classmethod
    def plan(cls, cfg: SweepConfig, methods: Sequence[str | Method], out: str | Path | None = None, *,
             models: Sequence[str | Loaded | Backend] | None = None, loaded: Loaded | Backend | None = None,
             resume: bool = False, overwrite: bool = False, progress: bool = True) -> "CompareRun":
        methods = [get_method(m) for m in methods]  # fail on a bad spec before any work
        named = models is not None
        model_list = list(models) if named else [loaded or cfg.model]
        task = _check_entries(cfg, methods, model_list)
        for mo in model_list:  # a method on a served model is refused before any engine starts
            if isinstance(mo, str):
                spec = parse_spec(mo)
                for m in methods:
                    check_method(spec.caps, spec.backend, m)
        folder = RunFolder(out, "comparison", "compare.json", ("compare.png",))
        folder.check(resume, overwrite)
        return cls(cfg, methods, model_list, named, task, folder, resume, overwrite, progress)

    def fingerprint(self) -> dict:
        return {"config": {**self.cfg.to_dict(), "model": None, "method": None}, "methods": [m.key for m in self.methods],
                "models": [spec_identity(model_name(m)) for m in self.models]}

    def run(self, collapse_margin: float = COLLAPSE_MARGIN) -> CompareResult:
        cfg, folder, methods, models, named = self.cfg, self.folder, self.methods, self.models, self.named
        with closing(self._backends()) as backends:
            held = [next(backends)]  # the first model, which _entries takes from the list: one in memory at a time
            for m in methods:  # a method that cannot apply to the model fails before the folder is written
                held[0].check_method(m)
            with folder.open(self.fingerprint(), self.resume, self.overwrite):
                try:
                    results, infos, res = self._entries(held, backends)
                except PosbiasError as e:  # the entries' folders keep their rows: say so, with how many
                    dirs = [entry_dir(mo, m, named) for mo in models for m in methods] if folder.path is not None else []
                    logs = [folder.file(d) / "examples.jsonl" for d in dirs]
                    raise with_resume_hint(e, sum(len(JsonlLog(p).read(ROW_KEYS)) for p in logs if p.is_file())) from None
                _add_paired_differences(results)
                # a judge file without "preferred" has no right answer: no chance level to fall to (eval/judging.py)
                task = self.task
                _flag_collapse(results, collapse_margin, task.chance if task.score_name == "accuracy" else None, task.order)
                shared = {k: v for k, v in res.config.items() if k not in PATH_KEYS}  # the path is per entry
                record = {"config": {**shared, "method": None, "model": None if named else model_name(models[0])},
                          "model": None if named else infos[model_name(models[0])], "models": infos,
                          "methods": [{k: v for k, v in r.items() if k != "rows"} for r in results]}
                if folder.path is not None and is_main_process():  # several processes: rank 0 writes
                    _plot(record, cfg, [model_label(m) for m in models] if named else [spec_label(model_name(models[0]))],
                          res.config["engine"], folder)
                folder.finish(record)  # last: its presence means "complete"
        rows = [{"model": r["model"], "method": r["method"], "label": r["label"], **row} for r in results for row in r["rows"]]
        return CompareResult(record["methods"], record["config"], record, rows)

    def _backends(self) -> Iterator[Backend]:
        """Each model's backend in turn (`opened`: a model given is left open, one opened here is closed), the one
        before closed and dropped before the next opens: one model in memory at a time."""
        for mo in self.models:
            with opened(mo, self.cfg, self.progress) as lo:
                yield lo
            del lo

    def _entries(self, held: list[Backend], backends: Iterator[Backend]):
        """Every (model, method) entry, each model loaded once (the first is `held`'s) -> (entries, {model: info}, the
        last SweepResult)."""
        results, infos, res, spent = [], {}, None, 0.0  # spent: USD of the entries so far (the budget is the comparison's)
        for i, mo in enumerate(self.models):
            lo = held.pop() if i == 0 else next(backends)
            infos[model_name(mo)] = lo.info
            unmodified = None  # the unmodified model's rows: the order decision rules (swap, pride) reuse them
            for m in self.methods:
                res, entry = self._entry(lo, mo, m, unmodified, spent)
                spent += spent_usd(res.record)
                results.append(entry)
                unmodified = res.rows if m.name == "none" else unmodified
            del lo  # one model in memory at a time
        next(backends, None)  # the last model closed (if opened here)
        return results, infos, res

    def _entry(self, lo: Backend, mo, m: Method, unmodified: list[dict] | None, spent: float):
        """One sweep of the comparison -> (SweepResult, entry dict with the rows for the paired differences)."""
        name = model_label(mo)
        label = (name if m.name == "none" else f"{name} + {m.label}") if self.named else m.label
        d = entry_dir(mo, m, self.named)
        sub = self.folder.file(d) if self.folder.path is not None else None
        started = sub is not None and RunFolder(sub, "sweep", "sweep.json").started()
        res = run_sweep(replace(self.cfg, model=model_name(mo), method=m), sub, loaded=lo, resume=self.resume and started,
                        overwrite=self.overwrite, progress=self.progress, handed=unmodified, spent=spent)
        return res, {"model": model_name(mo), "method": m.key, "label": label, "dir": d, "method_config": res.record["method"],
                     **{k: res.config[k] for k in PATH_KEYS if k in res.config},
                     "per_position": res.per_position, "summary": res.summary, "rows": res.rows}


def _plot(record: dict, cfg: SweepConfig, names: list[str], engine: str, folder: RunFolder) -> None:
    from ..report.plots import plot_compare

    plot_compare(record["methods"], f"{jsonable(cfg.task)} on {', '.join(names)} (n={cfg.n}, {engine})",
                 folder.file("compare.png"))


def _correct_matrix(rows: list[dict], examples: list[str], positions: list) -> np.ndarray:
    by_key = {(r["example_id"], placement_key(r["position"])): bool(r["correct"]) for r in rows}
    return np.array([[by_key[(e, placement_key(p))] for p in positions] for e in examples])


def _add_paired_differences(results: list[dict]) -> None:
    """Each entry's average minus the first entry's, paired over the same examples (Agresti-Min 95% interval,
    core/stats.py); the first entry against itself is 0 by construction, not an estimate: exactly 0, no interval width."""
    examples = sorted({r["example_id"] for r in results[0]["rows"]})
    positions = [p["position"] for p in results[0]["per_position"]]
    a = _correct_matrix(results[0]["rows"], examples, positions)
    results[0]["vs_first"] = {"difference": 0.0, "ci": [0.0, 0.0], "se": 0.0, "mde80": 0.0}
    for r in results[1:]:
        r["vs_first"] = paired_difference(a, _correct_matrix(r["rows"], examples, positions))


def _task(cfg: SweepConfig):
    from ..tasks import get_task

    return get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)


def _average_ci(summary: dict) -> list[float]:
    """The average's 95% CI (an older summary without one: the average itself)."""
    return summary.get("average_ci") or [summary["average"]] * 2


def _at_chance(summary: dict, chance: float) -> bool:
    """Whether an average cannot be told from chance or lies below it: the low end of its 95% CI at or below chance."""
    return _average_ci(summary)[0] <= chance + 1e-9


def _flag_collapse(results: list[dict], margin: float, chance: float | None, order: bool = False) -> None:
    """The collapse guard, chance-aware. The first entry is the reference: never flagged (at chance it is a floor, noted
    as `at_chance`). Another entry is flagged when
      - its average falls to chance (the low end of its 95% CI at or below it) while the first entry's is above chance,
        or its whole CI lies below chance: a method that destroys what the model could do;
      - on a free-answer task, it loses more than `margin` at any one position against the first entry (Ms-PoE's paper
        ratios on SmolLM2). Not on an order task: a decision rule that gives up the favourite slot's inflated score for
        balance (swap, PriDe) trades accuracy between slots by design, and only falling to chance is a collapse there.
    chance None: nothing is right (a judge file without "preferred"), so no average is at chance."""
    base = {label(p["position"]): p["accuracy"] for p in results[0]["per_position"]}
    first_above = chance is not None and not _at_chance(results[0]["summary"], chance)
    for i, r in enumerate(results):
        s = r["summary"]
        drops = {label(p["position"]): base[label(p["position"])] - p["accuracy"] for p in r["per_position"]}
        worst = max(drops, key=drops.get)
        at = chance is not None and _at_chance(s, chance)
        below = chance is not None and _average_ci(s)[1] < chance - 1e-9
        reasons = []
        if i and not order and drops[worst] > margin + 1e-9:
            reasons.append(f"position {worst} loses {drops[worst]:.3f} (> {margin:g})")
        if i and (below or at and first_above):
            reasons.append(f"average {s['average']:.3f} is {'below' if below else 'at'} chance ({chance:.3f})"
                           f"{'' if below else ', where ' + results[0]['label'] + ' is above it'}")
        r["collapse"] = {"flagged": bool(reasons), "worst_position": worst, "worst_drop": round(drops[worst], 6),
                         "margin": None if order else margin, "chance": chance, "at_chance": at, "reasons": reasons}
