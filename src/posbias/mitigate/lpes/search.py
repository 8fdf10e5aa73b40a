"""The LPES search on a real model (Sec. 3, Algorithm 1): per-layer RoPE factors on a Bezier curve
whose control points a constrained genetic algorithm searches (core/ga.py), scored by fitness.py.

Files in OUT (runs.RunFolder protocol):
  run.json             the search's fingerprint (resume compares it)
  search.state.json    GA state after the last finished generation (resume point)
  evals.jsonl          one line per evaluated individual (appended; a kill loses nothing)
  log/generation_NNN.json   one JSON per generation
  factors.json         the result (atomic, written last): control points, per-layer factors, fitness
                       history, the search split (so compare can refuse overlapping data)
  factors.png          the curve, its control points and the per-layer factors; fitness by generation

Resume: `resume=True` continues from search.state.json; individuals already in evals.jsonl are not
re-scored. The result equals an uninterrupted run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...backends import open_model
from ...core.ga import STATE_VERSION, CurveSpace, GeneticSearch, LayerSpace
from ...core.ga_random import RandomSearch
from ...errors import PosbiasError
from ...models.load import Loaded
from ...runs import RunFolder, is_main_process, read_json, write_json_atomic
from ...runs import progress as progress_bar
from ...scoring.scaleout import start_processes
from ...tasks import get_task
from .config import SearchConfig
from .fitness import build_fitness, search_positions, weighted_fitness

REGIONS = ("begin", "middle", "end")
STATE = "search.state.json"


@dataclass
class LPESResult:
    """An LPES search: `record` is factors.json; `rows` has one flat dict per generation (random search: per batch):
    generation, best and mean fitness, evaluations and cache hits so far, seconds; `format()` is what
    `posbias lpes search` prints."""

    factors: list[float]  # one per layer: use them with the method lpes:OUT/factors.json
    fitness: float
    accuracy: dict  # begin / middle / end on the search split
    baseline: dict  # the unmodified model on the same split: factors, accuracy, fitness
    evaluations: int
    record: dict = field(repr=False)  # the content of factors.json

    @property
    def rows(self) -> list[dict]:
        return [{k: v for k, v in h.items() if not isinstance(v, (list, dict))} for h in self.record["history"]]

    def format(self) -> str:
        """Best fitness against the unmodified model's, accuracy per region on the search split, the per-layer factors,
        and a note when nothing beat the unmodified model."""
        rec, base = self.record, self.baseline
        lines = [f"best fitness {self.fitness:.3f} (unmodified {base['fitness']:.3f}) after {self.evaluations} evaluations;"
                 f" reached at generation {rec['converged_at']} of {len(rec['history']) - 1}",
                 f"search split accuracy  begin/middle/end: {_slash(self.accuracy)}   unmodified: {_slash(base['accuracy'])}",
                 "per-layer factors: " + " ".join(f"{f:.3f}" for f in self.factors)]
        if not rec["beats_unmodified"]:
            lines.append(f"note: no individual beat the unmodified model on the search split ({self.fitness:.3f} <= "
                         f"{base['fitness']:.3f}); these factors are expected to cost accuracy (see docs/lpes.md)")
        return "\n".join(lines)


def _slash(values: dict) -> str:
    return " / ".join(f"{v:.3f}" for v in values.values())


def make_space(cfg: SearchConfig, n_layers: int):
    return LayerSpace(n_layers, cfg.ga) if cfg.space == "layers" else CurveSpace(n_layers, cfg.ga)


def _searcher(cfg: SearchConfig, space, fitness):
    if cfg.space == "random":
        g = cfg.ga
        budget = cfg.budget or g.pop_size + g.generations * (2 * g.n_crossover + g.n_mutation)
        return RandomSearch(space, cfg.ga, fitness, budget)
    return GeneticSearch(space, cfg.ga, fitness)


def run_search(cfg: SearchConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | None = None,
               resume: bool = False, overwrite: bool = False, progress: bool = True) -> LPESResult:
    """Search per-layer factors; write OUT/factors.json last. out=None: search without files."""
    cfg = (cfg or SearchConfig()).validate()
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    cfg = replace(cfg, skip=cfg.split_start(task.pool_size))
    task.examples(cfg.n, cfg.seed, cfg.skip)  # enough examples? (a clear error before anything loads)
    search_positions(cfg, task)  # slots in range: refused before the model loads
    folder = RunFolder(out, "search", "factors.json", (STATE, "evals.jsonl", "log", "factors.png"))
    folder.check(resume, overwrite)
    if resume and folder.path is not None and folder.file(STATE).exists():
        _precheck_state(folder.file(STATE))
    start_processes()  # several processes: join their group before loading (each rank's `cuda` is its own GPU)
    loaded = loaded or open_model(cfg.model, cfg.dtype, cfg.device, progress, cfg.device_map, needs="the LPES search")
    n_layers = loaded.model.config.num_hidden_layers
    space = make_space(cfg, n_layers)
    fitness = build_fitness(cfg, loaded, task, space)
    search = _searcher(cfg, space, fitness)
    with folder.open(_fingerprint(cfg, loaded, fitness.positions), resume, overwrite):
        if folder.path is not None:
            fitness.attach(folder.file("evals.jsonl"))
            if is_main_process():  # under accelerate launch rank 0 owns the folder (it may not exist on the others yet)
                folder.file("log").mkdir(exist_ok=True)
            if folder.resuming and folder.file(STATE).exists():
                _load_state(search, folder.file(STATE))
        t0 = time.perf_counter()
        bar = progress_bar(getattr(search, "total_steps", None), "lpes search", "gen",
                           initial=getattr(search, "steps_done", 0), enabled=progress)
        fitness.on_rows = lambda i, n, done, total: bar.set_postfix_str(
            f"individual {i}/{n}: {done}/{total} rows" if n > 1 or i > 1 else f"{done}/{total} rows")
        try:
            base_acc = fitness.accuracies([1.0] * n_layers)  # the unmodified model on the same split, for the record
            best = _run(search, folder, bar)
        finally:
            bar.close()
        rec = fitness.record(best)
        result = {
            "model": cfg.model, "task": task.name, "n_layers": n_layers, "space": cfg.space, "curve": cfg.ga.curve,
            "factors": rec["factors"], "fitness": rec["fitness"], "accuracy": dict(zip(REGIONS, rec["acc"])),
            "baseline": {"factors": [1.0] * n_layers, "accuracy": dict(zip(REGIONS, base_acc)),
                         "fitness": weighted_fitness(base_acc, cfg.weights)},
            **space.describe(best),
            "search_split": {"task": task.name, "seed": cfg.seed, "skip": cfg.skip, "n": cfg.n, "positions": fitness.positions},
            "history": search.history, "converged_at": converged_at(search.history), "evaluations": len(fitness.seen),
            # the GA tries the identity only if a mutation reaches it (docs/lpes.md): say when nothing it found beat it
            "beats_unmodified": rec["fitness"] > weighted_fitness(base_acc, cfg.weights),
            "seconds_this_call": time.perf_counter() - t0, "config": cfg.to_dict(), "model_info": loaded.info,
        }
        if folder.path is not None and is_main_process():
            from ...report.lpes_plots import plot_search

            plot_search(result, folder.file("factors.png"))
        folder.finish(result, indent=1)  # last: its presence means "complete"
    return LPESResult(result["factors"], result["fitness"], result["accuracy"], result["baseline"],
                      result["evaluations"], result)


def _fingerprint(cfg: SearchConfig, loaded: Loaded, positions: list[int]) -> dict:
    """What a resumed search must share: everything but its length (generations, random-search budget), so a
    finished search can be resumed with more generations and continues exactly."""
    d = cfg.to_dict()
    d["ga"] = {k: v for k, v in d["ga"].items() if k != "generations"}
    d.pop("budget")
    return {"config": d, "model": loaded.info, "positions": positions}


def _precheck_state(path: Path) -> None:
    """What a saved search state shows without the model (its version): refused before the model loads."""
    saved = read_json(path, "search state").get("search")
    version = saved.get("version") if isinstance(saved, dict) else None
    if version != STATE_VERSION:
        raise PosbiasError(f"{path} is not a search state this configuration can resume (saved search state has "
                           f"version = {version!r}, this search has {STATE_VERSION})", "pass `overwrite=True` to start again")


def _load_state(search, path: Path) -> None:
    state = read_json(path, "search state")
    try:
        search.load_state_dict(state["search"])
    except (KeyError, TypeError, ValueError, PosbiasError) as e:
        detail = e.problem if isinstance(e, PosbiasError) else f"{type(e).__name__}: {e}"
        raise PosbiasError(f"{path} is not a search state this configuration can resume ({detail})"[:300],
                           "pass `overwrite=True` to start again") from None
    if search.steps_done > search.total_steps:
        raise PosbiasError(f"{path.parent} already ran {search.steps_done - 1} generations",
                           f"resume with `generations={search.steps_done - 1}` or more")


def _run(search, folder: RunFolder, bar):
    """Run the search to the end, saving the GA state and a log entry after every generation. The bar ticks per
    generation and, inside one, shows the individual being scored and its rows (Fitness.on_rows)."""

    def on_generation(entry: dict) -> None:
        if folder.path is not None and is_main_process():
            write_json_atomic(folder.file("log") / f"generation_{entry['generation']:03d}.json", entry, indent=1)
            write_json_atomic(folder.file(STATE), {"search": search.state_dict()})
        bar.update(1)
        bar.set_postfix_str(f"best {entry['best_fitness']:.3f}, {entry.get('evaluations')} evals")

    return search.run(on_generation=on_generation)


def converged_at(history: list[dict], tol: float = 1e-12) -> int | None:
    """Table 7's convergence: the first generation whose best fitness already equals the search's final best (the
    generations after it found nothing better); None for an empty history."""
    if not history:
        return None
    final = history[-1]["best_fitness"]
    return next(h["generation"] for h in history if h["best_fitness"] >= final - tol)
