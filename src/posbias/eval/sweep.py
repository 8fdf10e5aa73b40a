"""Position sweep: every example at every requested gold position, scored, summarised, saved.

Files in the output folder (runs.RunFolder protocol):
  run.json        the run's fingerprint (resume compares it)
  examples.jsonl  one row per example x position, appended as scored (resume reads it), then rewritten in row order
  sweep.json      written atomically once every row is scored: its presence means complete
  curve.png       accuracy against position with a 95% CI band
  timing.json     seconds, rows, a served backend's counters: totals over every invocation, and "this_run"'s
  order.png       order tasks: the share of rows choosing each slot (and PriDe's prior), with the order figures
  flips.jsonl     order tasks: each item whose verdict differs between orders, with its causes (eval/judging.py)

Under `accelerate launch` with several processes the rows are split by example across them and gathered in
rounds; rank 0 alone reads and writes the folder, and the result is the one-process result (scoring/scaleout.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..backends import Backend, check_method
from ..data import provenance
from ..errors import PosbiasError
from ..methods import Method, get_method
from ..models.load import Loaded
from ..runs import JsonlLog, RunFolder, is_main_process, num_processes, versions, write_jsonl_atomic
from ..runs import progress as progress_bar
from ..scoring.engines import engine_kind, get_engine
from ..scoring.scaleout import broadcast_rows, score_split
from ..scoring.scorer import Scorer, in_row_order
from ..tasks import Task, as_json, get_task, placement_key, positions_spec
from .config import Cost, ModelChoice, Scoring, TaskChoice, check_split, config_dict, spec_identity, spec_label
from .cost import BudgetReached, Meter
from .curve import per_position_stats
from .judging import order_summary, unread_record, write_flips
from .opening import opened
from .rownotes import row_notes
from .sweep_text import format_table
from .timing import Timing

ROW_KEYS = ("example_id", "position", "correct")
SWEEP_FILES = ("examples.jsonl", "curve.png", "heatmap.png", "order.png", "flips.jsonl", "timing.json", "sweep.partial.json")


@dataclass
class SweepConfig(Cost, Scoring, TaskChoice, ModelChoice):
    """One sweep: every example at every requested gold position, scored by one model under one method.

    positions: where the gold item goes: a list of slots [0, 4, 9], one slot 5, or the CLI's string "all" |
        "0,4,9" | "0%,50%,100%" (percent of the last slot); two-hop tasks: pairs [(0, 1), (8, 9)] or
        "connected,disconnected,reversed" | "0:1,5:13" | "grid" | "all". None: the task's default (all slots, or
        the three modes).
    n: examples per position (the same examples at every position).
    seed: example selection / generation seed.
    skip: start offset in the seeded example order (disjoint splits).
    method: a training-free method: a spec (`posbias.METHODS`; docs/mitigations.md) or a Method object.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    task, task_options, data_dir: see `TaskChoice`.
    engine, max_new_tokens, batch_tokens, max_batch, prefix_sharing, prefix_attention: see `Scoring`.
    price_in, price_out, budget: see `Cost`.
    """

    positions: str | list | int | None = None  # validate() normalises it to the string form the run records
    n: int = 100
    seed: int = 0
    skip: int = 0
    method: str | Method = "none"

    def validate(self) -> "SweepConfig":
        self._validate_task()
        self._validate_model()
        self._validate_scoring()
        self._validate_cost()
        check_split(self.n, self.skip)
        self.positions = positions_spec(self.positions)  # [0, 5, 9] or 5 -> "0,5,9": the recorded config is a spec
        return self

    def to_dict(self) -> dict:
        return config_dict(self)


@dataclass
class SweepResult:
    """A sweep: `record` is sweep.json; `rows` (examples.jsonl) has one flat dict per example x placement (example_id,
    position, the prediction, correct and the task's further verdicts); `format()` is what `posbias sweep` prints."""

    config: dict  # the resolved configuration (engine, answer length, chat use, positions filled in)
    per_position: list[dict]  # position, n, correct, accuracy, ci_low, ci_high
    summary: dict  # average, best, worst, gap and their intervals, position_test, std, shape
    rows: list[dict] = field(repr=False)  # one per example x position
    record: dict = field(repr=False)  # the content of sweep.json
    out: Path | None = None

    def format(self) -> str:
        """A header (task, model, examples x placements, engine), accuracy per placement with its CI, the summary,
        and the scoring note when the run took another path than asked."""
        c = self.config
        head = (f"{c['task']} on {spec_label(c['model'])}: {c['n']} examples x {len(self.per_position)} positions, "
                f"engine {c['engine']}")
        note = [f"note: {c['scoring_note']}"] if c.get("scoring_note") else []
        return "\n".join([format_table(self.per_position, self.summary, head), *note])


def run_sweep(cfg: SweepConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | Backend | None = None,
              resume: bool = False, overwrite: bool = False, progress: bool = True,
              handed: list[dict] | None = None, spent: float = 0.0) -> SweepResult:
    """Run (or resume) a sweep. out=None writes nothing; `loaded` reuses an already loaded model (`load_model`,
    `wrap_model`) or an open backend, and the run records its name, dtype and device (a cfg.dtype / cfg.device set
    to a non-default value it contradicts is refused); else cfg.model is a model spec (backends/spec.py: in
    process, vllm:..., openai:...).
    handed: rows the unmodified model already gave on this configuration (compare hands the `none` entry's rows
    to the order decision rules, which leave the model as it is): they are logged, not scored again.
    spent: USD that runs sharing cfg.budget spent before this one (compare's earlier entries; eval/cost.py)."""
    return SweepRun.plan(cfg, out, resume=resume, overwrite=overwrite, progress=progress, handed=handed,
                         spent=spent).run(loaded)


def preflight(cfg: SweepConfig, method: Method, task, positions: list) -> list:
    """Refuse, before any model loads, a method that cannot run on this task, placements and engine, and a decision
    rule whose calibration items the task does not hold; -> the calibration items (the next ones after the evaluated
    ones in the seeded order, never evaluated; none for other methods)."""
    kind = engine_kind(cfg.engine or task.default_engine)
    task.check_engine(kind)  # e.g. a bare needle: no teacher forcing
    method.check_task(task, positions, kind)
    c = method.calibration(cfg.n)
    pool = task.pool_size
    if c and pool is not None and cfg.skip + cfg.n + c > pool:
        room, skipped = pool - cfg.skip - c, f" after skipping {cfg.skip}" if cfg.skip else ""
        fix = f"use `n={room}` or fewer" if room >= 1 else "use a larger file"
        raise PosbiasError(f"{method.key} calibrates on {c} item{'s' * (c != 1)} after the {cfg.n} evaluated ones{skipped}, and "
                           f"{task.name} holds {pool}", f"{fix}, or calibrate on fewer items ({method.name}:ITEMS)")
    return task.examples(c, cfg.seed, cfg.skip + cfg.n) if c else []


@dataclass
class SweepRun:
    """One sweep's parts in one object, its steps in the order `run` takes them: `plan` (the config, task, method,
    placements, examples and calibration items resolved and checked, the cost meter and the run folder: nothing is
    loaded), `open` (the backend and its scorer), `score` (the rows: resumed, handed over, scored, logged, priced and
    budgeted by the meter), `summarise` (the decision rule's verdicts, the curve, the record, its cost once) and
    `write` (plots, timing, sweep.json last). compare and grid run their entries through `run_sweep`."""

    cfg: SweepConfig
    task: Task
    method: Method
    positions: list
    examples: list
    calibration: list
    meter: Meter
    folder: RunFolder
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    handed: list[dict] | None = None  # the unmodified model's rows, handed over (`run_sweep`)
    backend: Backend | None = None
    scorer: Scorer | None = None
    label: str = ""  # the model's short name (titles, progress), set by `open`
    identity: object = None  # what run.json records for the model, set by `open`
    inputs: list[dict] | None = None  # the data files the task read, each with its SHA-256 (run.json, sweep.json)

    @classmethod
    def plan(cls, cfg: SweepConfig | None = None, out: str | Path | None = None, *, resume: bool = False,
             overwrite: bool = False, progress: bool = True, handed: list[dict] | None = None,
             spent: float = 0.0) -> "SweepRun":
        """Everything a sweep checks before a model loads (a bad option, file or method is refused here)."""
        cfg = (cfg or SweepConfig()).validate()
        method = get_method(cfg.method)  # parse (and read factor files) before loading anything
        task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
        method = method.for_task(task)  # a task-dependent default resolved once: the fingerprint records what runs
        positions = task.placements(cfg.positions)
        examples = task.examples(cfg.n, cfg.seed, cfg.skip)
        calibration = preflight(cfg, method, task, positions)
        handed = handed if method.reuses_unmodified else None
        meter = Meter.of(cfg, spent, handed, method.passes)  # cost estimate, budget, record (eval/cost.py)
        folder = RunFolder(out, "sweep", "sweep.json", SWEEP_FILES)
        folder.check(resume, overwrite)
        if resume and out is not None and is_main_process():  # a row log a resume cannot read: refused here
            JsonlLog(folder.file("examples.jsonl")).read(ROW_KEYS)
        return cls(cfg, task, method, positions, examples, calibration, meter, folder, resume, overwrite, progress, handed,
                   inputs=provenance(task.inputs))

    def run(self, loaded: Loaded | Backend | None = None) -> SweepResult:
        with self.open(loaded):
            rows = self.scorer.rows(self.examples, self.positions) + self.scorer.rows(self.calibration,
                                                                                       self.task.all_placements())
            fingerprint = self.fingerprint()
            with self.folder.open(fingerprint, self.resume, self.overwrite, self.inputs):
                all_rows, timing = self.score(rows)
                all_rows, record = self.summarise(all_rows, fingerprint, timing)
                if self.folder.path is not None and is_main_process():
                    self.write(record, timing, all_rows)
            return SweepResult(fingerprint["config"], record["per_position"], record["summary"], all_rows, record,
                               self.folder.path)

    @contextmanager
    def open(self, loaded: Loaded | Backend | None) -> Iterator[None]:
        """The backend (`loaded`, left open; or opened from the spec after what it cannot do is refused, and closed
        when the sweep is done: `opened`) and its scorer."""
        cfg = self.cfg
        if loaded is None:  # what a served backend cannot do is refused before it starts
            spec = cfg.spec  # parsed once, by the config
            self.label, self.identity = spec.label, spec.identity  # titles; what run.json records (less transport keys)
            check_method(spec.caps, spec.backend, self.method)
            get_engine(cfg.engine or self.task.default_engine).check(spec.caps, spec.backend, self.task)
        with opened(cfg.spec if loaded is None else loaded, cfg, self.progress) as self.backend:
            if loaded is not None:  # the run records (and titles) the model it ran, with its dtype and device
                self.cfg = cfg.bound_to(self.backend.info)
                self.label, self.identity = spec_label(self.cfg.model), spec_identity(self.cfg.model)  # a loaded name as it is
            self.backend.check_method(self.method)
            self.scorer = Scorer(self.backend, self.task, cfg.engine, cfg.max_new_tokens, cfg.chat, cfg.batch_tokens,
                                 cfg.max_batch, cfg.prefix())
            yield

    def fingerprint(self) -> dict:
        """run.json: the resolved config (what a resume compares), the task, the model and the method."""
        resolved = {**self.cfg.to_dict(), "model": self.identity, **self.scorer.settings(self.method),
                    "positions_resolved": [as_json(p) for p in self.positions]}  # the model less its transport keys
        return {"config": resolved, "task": self.task.config(), "model": self.backend.info, "method": self.method.config()}

    def score(self, rows: list) -> tuple[list[dict], Timing]:
        """Every row, in row order: those the folder's log holds (resume), those handed over, and the rest scored
        (logged as they come); counted in timing.json and priced by the meter (the estimate printed first, a budget
        checked before each piece); a PosbiasError says how to go on (`with_resume_hint`)."""
        log = JsonlLog(self.folder.file("examples.jsonl")) if self.folder.path is not None else None
        done_rows = self._logged(log, rows)
        timing = Timing(self.folder if log is not None else None, self.backend, self.folder.resuming)
        try:
            self.meter.begin(self.scorer.runner, rows, done_rows)
            new_rows = self._score(rows, done_rows, log, timing.tick)
        except BudgetReached:  # every scored row is logged and no sweep.json written: resume with a larger budget
            timing.save()
            raise
        except PosbiasError as e:
            timing.save()
            kept = len(log.read(ROW_KEYS)) if log is not None and is_main_process() else 0
            raise with_resume_hint(e, kept, folder=log is not None) from None
        except BaseException:  # an interrupt: what was spent is counted at the next resume
            timing.save()
            raise
        timing.stop(len(new_rows))
        self.meter.end(new_rows)
        all_rows = in_row_order(done_rows + new_rows, rows)
        if log is not None and is_main_process():  # served rows were logged as they completed: row order, atomically
            write_jsonl_atomic(log.path, all_rows)
        return all_rows, timing

    def _logged(self, log: JsonlLog | None, rows: list) -> list[dict]:
        """The rows already in the folder's log (resume), and the handed-over rows it lacks (logged here)."""
        done_rows = log.read(ROW_KEYS) if self.folder.resuming and log is not None and is_main_process() else []
        if num_processes() > 1:  # every rank skips what rank 0's examples.jsonl holds
            done_rows = broadcast_rows(done_rows)
        if self.handed:  # the unmodified model's rows, handed over: logged here as if scored
            have, want = {(r["example_id"], placement_key(r["position"])) for r in done_rows}, {r.key for r in rows}
            taken = [r for r in self.handed
                     if (k := (r["example_id"], placement_key(r["position"]))) in want and k not in have]
            if log is not None and is_main_process():
                log.append(taken)
            done_rows = done_rows + taken
        return done_rows

    def _score(self, rows: list, done_rows: list[dict], log: JsonlLog | None, counted) -> list[dict]:
        done = {(r["example_id"], placement_key(r["position"])) for r in done_rows}
        desc = f"{self.task.name} on {self.label}"
        bar = progress_bar(len(rows), desc, "row", initial=len(done), enabled=self.progress)

        def tick(n: int) -> None:
            bar.update(n)
            counted(n)

        def on_batch(new: list[dict]) -> None:
            if log is not None:
                log.append(new)
            tick(len(new))

        try:
            if num_processes() > 1:  # rows split by example across processes, gathered in rounds
                return score_split(self.scorer, rows, self.method, done, log, tick)
            out: list[dict] = []
            for piece in self.meter.pieces(rows, self.method, done, out):  # one piece without a budget
                out += self.scorer.score(piece, self.method, done, on_batch)
            return out
        finally:
            bar.close()

    def summarise(self, all_rows: list[dict], fingerprint: dict, timing: Timing) -> tuple[list[dict], dict]:
        """The evaluated rows (a decision rule's verdicts) and the record sweep.json holds."""
        task, ids = self.task, [e.id for e in self.examples]
        all_rows, decision = _decide(self.method, all_rows, set(ids), task.n_slots)
        per, summary = per_position_stats(all_rows, self.positions, ids, task.also)
        # what the curve measures, and what guessing scores (an order task: one over its options)
        summary.update(chance=task.chance, measure=task.score_name)
        # answers the generation limit cut short (and those that loop); niah needles away from their asked depth
        summary.update(row_notes(all_rows, self.scorer.max_new_tokens))
        if task.order:  # the order of candidates: consistency, fairness, RStd, choice shares; verdicts not read
            summary["order"] = order_summary(all_rows, self.positions, ids, task.n_slots, gold=task.score_name == "accuracy")
            if unread := unread_record(all_rows, self.positions, task):
                summary["unread"] = unread
        if decision:
            summary["decision"] = {k: v for k, v in decision.items() if k != "calibration_items"}
        record = {**fingerprint, "task_kind": task.kind, "versions": versions(), "per_position": per, "summary": summary,
                  **({"decision": decision} if decision else {}), **({"inputs": self.inputs} if self.inputs else {})}
        # how the backend ran (not compared on resume): in process its attention kernels; served, how requests went
        record["backend"] = {"settings": self.backend.settings(),
                             **timing.backend_record()}  # (in process: none)
        if self.meter.rec is not None:  # what it cost (given prices)
            record["cost"] = self.meter.rec
        return all_rows, record

    def write(self, record: dict, timing: Timing, rows: list[dict]) -> None:
        """Plots, flips, timing.json, then sweep.json (its presence means complete)."""
        from ..report.plots import plot_curve, plot_order, plot_pair_heatmap

        folder, method = self.folder, self.method
        label = "" if method.name == "none" else f", {method.label}"
        title = f"{self.task.name} on {self.label}{label} (n={self.cfg.n}, {record['config']['engine']})"
        plot_curve(record["per_position"], title, folder.file("curve.png"))
        if "modes" in record["summary"]:  # two hops: accuracy over (first, second)
            plot_pair_heatmap(record["per_position"], record["task"]["n_slots"], title, folder.file("heatmap.png"))
        if "order" in record["summary"]:  # the order of candidates: the share each slot is chosen (and PriDe's prior)
            plot_order(record["summary"], title, folder.file("order.png"))
            write_flips(folder, record, rows)  # each item whose verdict the order changes, with its causes
        timing.save()
        folder.finish(record)  # last: its presence means "complete"


def with_resume_hint(e: PosbiasError, kept: int, folder: bool | None = None) -> PosbiasError:
    """`e` with how to go on in the run folder (kept: its rows; folder: whether the run opened one, default: it keeps
    rows or an inner run's hint said so): "..., and rerun with `resume` (N rows are kept)" where the fix leaves the
    rows as they are (a server to start, a transport key such as timeout=: the error's `fix_resumes`, default yes),
    "..., and rerun with `overwrite`" where it changes them (prompts=, context_window=). A folder without a row still
    holds the run (run.json), so a plain rerun would be refused: it gets the hint too."""
    hinted_before = e.in_folder or e.fix_before_resume is not None  # an inner run's (compare entry's) hint is replaced
    base = e.fix_before_resume if hinted_before else e.fix
    if not (folder if folder is not None else (kept > 0 or e.in_folder)):
        return e
    resumes = e.fix_resumes
    rows = "no row is kept yet" if kept < 1 else "1 row is kept" if kept == 1 else f"{kept} rows are kept"
    lost = "nothing is lost" if kept < 1 else "the row kept is scored again" if kept == 1 else f"the {kept} rows kept are scored again"
    rerun = f"rerun with `resume` ({rows})" if resumes else f"rerun with `overwrite` ({lost})"
    hinted = PosbiasError(e.problem, f"{base}, and {rerun}" if base else rerun)
    hinted.fix_before_resume, hinted.fix_resumes, hinted.in_folder = base, resumes, True
    return hinted


def _decide(method: Method, rows: list[dict], evaluated: set, k: int) -> tuple[list[dict], dict | None]:
    """The evaluated rows (a decision rule's verdicts on them, from every order and its calibration rows)."""
    mine = [r for r in rows if r["example_id"] in evaluated]
    return method.decide(mine, [r for r in rows if r["example_id"] not in evaluated], k)
