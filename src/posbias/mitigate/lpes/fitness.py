"""The LPES fitness (Sec. 3.2): lambda_B acc_B + lambda_M acc_M + lambda_E acc_E on a search split
with the gold item at the beginning, middle and end (weights 0.2 / 0.3 / 0.5, Sec. 4.1).

An individual's per-layer factors are applied through the `lpes` Method (LayerScaling) and the
rows are scored by the same Scorer a sweep uses. Every result is kept in memory and appended to
evals.jsonl, so a killed search re-scores nothing it finished. Under `accelerate launch` with
several processes the new individuals of a batch are split across ranks
(split_between_processes / gather_object); every rank gets every result, rank 0 writes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Sequence

from ...errors import PosbiasError
from ...methods import LayerScaling
from ...models.load import Loaded
from ...runs import JsonlLog, is_main_process, num_processes
from ...scoring.scorer import Scorer
from ...tasks import Task
from .config import SearchConfig

LOG_KEYS = ("key", "individual", "factors", "acc", "fitness", "fit_key")


def weighted_fitness(acc: Sequence[float], weights: Sequence[float]) -> float:
    """Sec. 3.2: lambda_B acc_B + lambda_M acc_M + lambda_E acc_E."""
    return sum(w * a for w, a in zip(weights, acc))


def search_positions(cfg: SearchConfig, task: Task) -> list[int]:
    """Beginning, middle and end slots: cfg.positions or 0, n_slots // 2, n_slots - 1."""
    if task.n_gold != 1:
        raise PosbiasError(f"the LPES fitness places one gold item at the beginning, middle and end; {task.name} places "
                           "two", "search on a one-gold task (kv-lookup, kv-uuid, nq, jsonl)")
    positions = list(cfg.positions or (0, task.n_slots // 2, task.n_slots - 1))
    if any(not 0 <= p < task.n_slots for p in positions):
        raise PosbiasError(f"`positions` must be three slots in 0..{task.n_slots - 1}, got {positions}",
                           f"e.g. `positions=0,{task.n_slots // 2},{task.n_slots - 1}`")
    return positions


def fitness_key(cfg: SearchConfig, model_info: dict) -> str:
    """What an individual's fitness depends on: model, data split, weights, scoring and the genes -> factors
    map (curve, points, y grid), but not the GA's budget, so evals.jsonl stays valid when only that changes."""
    d = cfg.to_dict()
    ga = {k: d["ga"][k] for k in ("curve", "n_points", "y_min", "y_max", "y_step")}
    keep = {k: v for k, v in d.items() if k not in ("ga", "budget")}
    blob = json.dumps({"cfg": keep, "ga": ga, "model": model_info}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


class Fitness:
    """Callable for the GA: a list of individuals -> their fitness values (cached, logged)."""

    def __init__(self, scorer: Scorer, rows: list, positions: list[int], weights: Sequence[float], space, fit_key: str):
        self.scorer, self.rows, self.positions, self.weights = scorer, rows, positions, tuple(weights)
        self.space, self.fit_key = space, fit_key
        self.seen: dict[str, dict] = {}
        self.log: JsonlLog | None = None
        # told of every scored batch: (this call's individual, its fresh ones, rows scored, rows per individual);
        # the search's progress bar shows it, so a generation of long prompts is not minutes of silence
        self.on_rows: Callable[[int, int, int, int], None] = lambda i, n, done, total: None

    def attach(self, path: Path | None) -> "Fitness":
        """Append results to `path` (evals.jsonl) and reuse the ones it holds for the same fit_key."""
        self.log = JsonlLog(path) if path is not None else None
        for rec in self.log.read(LOG_KEYS) if self.log is not None else []:
            if rec["fit_key"] == self.fit_key:  # scored under the same data, model and curve
                self.seen[rec["key"]] = rec
        return self

    def accuracies(self, factors: list[float], which: tuple[int, int] = (1, 1)) -> list[float]:
        """Accuracy at the beginning, middle and end positions under these per-layer factors (which: the individual's
        place among those being scored, for `on_rows`)."""
        done = 0

        def counted(new: list[dict]) -> None:
            nonlocal done
            done += len(new)
            self.on_rows(*which, done, len(self.rows))

        acc = self.scorer.accuracy(self.rows, LayerScaling(factors), counted)
        return [acc[p] for p in self.positions]

    def record(self, ind, which: tuple[int, int] = (1, 1)) -> dict:
        key = json.dumps(list(ind))
        if key not in self.seen:
            factors = [float(f) for f in self.space.factors(ind)]
            acc = self.accuracies(factors, which)
            self.seen[key] = {"key": key, "individual": list(ind), "factors": factors, "acc": acc,
                              "fitness": weighted_fitness(acc, self.weights), "fit_key": self.fit_key}
        return self.seen[key]

    def __call__(self, inds: list) -> list[float]:
        fresh = [i for i in inds if json.dumps(list(i)) not in self.seen]
        if num_processes() == 1:
            for k, i in enumerate(fresh):  # one line per individual as soon as it is scored: a kill loses at most one
                self._append(self.record(i, (k + 1, len(fresh))))
        else:  # split across accelerate processes; every rank gets every result
            from accelerate import PartialState
            from accelerate.utils import gather_object

            with PartialState().split_between_processes(fresh) as mine:
                local = [self.record(i) for i in mine]
            for rec in gather_object(local):
                self.seen[rec["key"]] = rec
                self._append(rec)
        return [self.seen[json.dumps(list(i))]["fitness"] for i in inds]

    def _append(self, rec: dict) -> None:
        if self.log is not None and is_main_process():
            self.log.append([rec])


def build_fitness(cfg: SearchConfig, loaded: Loaded, task: Task, space) -> Fitness:
    """The search rows of `cfg` (its split, `skip` or where split_start puts it, at the three positions), scored
    through one Scorer."""
    positions = search_positions(cfg, task)
    scorer = Scorer(loaded, task, cfg.engine, cfg.max_new_tokens, cfg.chat, cfg.batch_tokens, cfg.max_batch,
                    cfg.prefix())
    rows = scorer.rows(task.examples(cfg.n, cfg.seed, cfg.split_start(task.pool_size)), positions)
    return Fitness(scorer, rows, positions, cfg.weights, space, fitness_key(cfg, loaded.info))
