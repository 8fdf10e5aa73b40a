"""The LPES search on a real model: fitness = lambda_B acc_B + lambda_M acc_M + lambda_E acc_E
(Sec. 3.2, weights 0.2/0.3/0.5 of Sec. 4.1) on a search split with the gold item at the
beginning, middle and end; Algorithm 1 over Bezier control points (core/ga.py).

Files in OUT:
  search.state.json    GA state after the last finished generation (resume point)
  evals.jsonl          one line per evaluated individual (appended; a kill loses nothing)
  log/generation_NNN.json   one JSON per generation
  factors.json         the result (atomic, written last): control points, per-layer factors,
                       fitness history, the search split (so compare can refuse overlapping data)
  factors.png          the curve, its control points and the per-layer factors; fitness by generation

Resume: `--resume` reloads search.state.json (the configuration must match) and continues;
individuals already in evals.jsonl are not re-scored. The result equals an uninterrupted run.
Scale-out: under `accelerate launch` with several processes the individuals of a batch are split
across ranks (accelerate's split_between_processes / gather_object); rank 0 writes the files.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...core.ga import CurveSpace, GAConfig, GeneticSearch, LayerSpace, RandomSearch
from ...errors import PosbiasError
from ...io import write_json_atomic
from ...models.load import Loaded, load_model
from ...tasks import get_task

SPACES = ("curve", "layers", "random")  # GA over control points | GA over per-layer factors (brute force) | random search
REGIONS = ("begin", "middle", "end")


@dataclass
class SearchConfig:
    model: str = "smollm2-135m"
    task: str = "kv-lookup"
    task_options: dict = field(default_factory=dict)
    n: int = 32  # search examples (paper: 200); each is scored at 3 positions per individual
    seed: int = 0
    skip: int = 1000  # the search split starts here: sweeps and compare default to examples 0.. (held out)
    positions: tuple[int, int, int] | None = None  # beginning, middle, end slots; None: 0, n_slots // 2, n_slots - 1
    weights: tuple[float, float, float] = (0.2, 0.3, 0.5)  # lambda_B, lambda_M, lambda_E (Sec. 4.1)
    space: str = "curve"
    budget: int | None = None  # random search: individuals to draw (default: what the GA evaluates at most)
    ga: GAConfig = field(default_factory=GAConfig)
    engine: str | None = None
    chat: str = "auto"
    dtype: str = "bf16"
    device: str = "cpu"
    batch_tokens: int = 16384
    max_batch: int = 32
    data_dir: str | None = None

    def validate(self) -> "SearchConfig":
        if self.space not in SPACES:
            raise PosbiasError(f"unknown search space {self.space!r}", f"use one of {', '.join(SPACES)}")
        if self.n < 1:
            raise PosbiasError(f"--n must be >= 1, got {self.n}", "use at least a few dozen search examples")
        w = self.weights
        if len(w) != 3 or min(w) < 0 or abs(sum(w) - 1) > 1e-9:
            raise PosbiasError(f"weights must be three non-negative numbers summing to 1, got {w}", "e.g. --weights 0.2,0.3,0.5")
        self.ga.validate()
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ga"] = self.ga.to_dict()
        return d


class Fitness:
    """Scores individuals on the search rows; remembers every result (in memory and in evals.jsonl)."""

    def __init__(self, cfg: SearchConfig, loaded: Loaded, space, out: Path | None):
        from ...eval.runner import build_rows, check_window, use_chat

        self.cfg, self.loaded, self.space = cfg, loaded, space
        task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
        self.positions = list(cfg.positions or (0, task.n_slots // 2, task.n_slots - 1))
        if len(self.positions) != 3 or any(not 0 <= p < task.n_slots for p in self.positions):
            raise PosbiasError(f"positions must be three slots in 0..{task.n_slots - 1}, got {self.positions}",
                               "e.g. --positions 0,5,9")
        self.engine = cfg.engine or task.default_engine
        self.metric, self.max_new = task.metric, task.max_new_tokens
        examples = task.examples(cfg.n, cfg.seed, cfg.skip)
        self.rows = build_rows(loaded, task, examples, self.positions, use_chat(loaded, cfg.chat))
        check_window(self.rows, loaded.context_window, self.engine, self.max_new)
        self.fit_key = fitness_key(cfg, loaded)
        self.seen: dict[str, dict] = {}
        self.log = out / "evals.jsonl" if out is not None else None
        if self.log is not None and self.log.exists():
            for line in self.log.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    break  # a torn last line from a kill
                if rec.get("fit_key") == self.fit_key:  # scored under the same data, model and curve
                    self.seen[rec["key"]] = rec

    def accuracies(self, factors: list[float]) -> list[float]:
        """Accuracy at the beginning, middle and end positions under these per-layer factors."""
        from ...eval.runner import score_rows
        from ...models.rope import layer_rope_scaling

        with layer_rope_scaling(self.loaded.model, factors):
            res = score_rows(self.loaded, self.rows, self.engine, self.metric, self.max_new,
                             self.cfg.batch_tokens, self.cfg.max_batch)
        hits = {p: [] for p in self.positions}
        for r in res:
            hits[r["position"]].append(bool(r["correct"]))
        return [sum(hits[p]) / len(hits[p]) for p in self.positions]

    def record(self, ind) -> dict:
        key = json.dumps(list(ind))
        if key not in self.seen:
            factors = [float(f) for f in self.space.factors(ind)]
            acc = self.accuracies(factors)
            fit = sum(w * a for w, a in zip(self.cfg.weights, acc))  # Sec. 3.2
            self.seen[key] = {"key": key, "individual": list(ind), "factors": factors, "acc": acc, "fitness": fit,
                              "fit_key": self.fit_key}
        return self.seen[key]

    def __call__(self, inds: list) -> list[float]:
        fresh = [i for i in inds if json.dumps(list(i)) not in self.seen]
        st = _state()
        if st is None or st.num_processes == 1:
            for i in fresh:  # one line per individual as soon as it is scored: a kill loses at most one
                self._append(self.record(i))
        else:  # split across accelerate processes; every rank gets every result
            from accelerate.utils import gather_object

            with st.split_between_processes(fresh) as mine:
                local = [self.record(i) for i in mine]
            for rec in gather_object(local):
                self.seen[rec["key"]] = rec
                self._append(rec)
        return [self.seen[json.dumps(list(i))]["fitness"] for i in inds]

    def _append(self, rec: dict) -> None:
        if self.log is not None and _is_main():
            with self.log.open("a") as f:
                f.write(json.dumps(rec) + "\n")


def _state():
    try:
        from accelerate import PartialState
    except ImportError:  # accelerate is a dependency; keep the search usable without it
        return None
    return PartialState()


def _is_main() -> bool:
    st = _state()
    return st is None or st.is_main_process


def fitness_key(cfg: SearchConfig, loaded: Loaded) -> str:
    """What an individual's fitness depends on: model, data split, weights, scoring and the genes -> factors
    map (curve, points, y grid), but not the GA's budget, so evals.jsonl stays valid when only that changes."""
    import hashlib

    d = cfg.to_dict()
    ga = {k: d["ga"][k] for k in ("curve", "n_points", "y_min", "y_max", "y_step")}
    keep = {k: v for k, v in d.items() if k not in ("ga", "budget")}
    blob = json.dumps({"cfg": keep, "ga": ga, "model": loaded.info}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def make_space(cfg: SearchConfig, n_layers: int):
    return LayerSpace(n_layers, cfg.ga) if cfg.space == "layers" else CurveSpace(n_layers, cfg.ga)


def _searcher(cfg: SearchConfig, space, fitness):
    if cfg.space == "random":
        g = cfg.ga
        budget = cfg.budget or g.pop_size + g.generations * (2 * g.n_crossover + g.n_mutation)
        return RandomSearch(space, cfg.ga, fitness, budget)
    return GeneticSearch(space, cfg.ga, fitness)


def run_search(cfg: SearchConfig, out: str | Path, resume: bool = False, overwrite: bool = False,
               progress: bool = True, loaded: Loaded | None = None) -> dict:
    """Search per-layer factors; write OUT/factors.json last and return its content."""
    cfg.validate()
    out = Path(out)
    state_path, final = out / "search.state.json", out / "factors.json"
    _check_out(out, state_path, final, resume, overwrite)
    loaded = loaded or load_model(cfg.model, cfg.dtype, cfg.device)
    n_layers = loaded.model.config.num_hidden_layers
    space = make_space(cfg, n_layers)
    out.mkdir(parents=True, exist_ok=True)
    fitness = Fitness(cfg, loaded, space, out)
    search = _searcher(cfg, space, fitness)
    fingerprint = {"config": cfg.to_dict(), "model": loaded.info, "positions": fitness.positions}
    if resume and state_path.exists():
        old = json.loads(state_path.read_text())
        if old["fingerprint"] != json.loads(json.dumps(fingerprint)):
            raise PosbiasError(f"{out} holds a search with another configuration", "rerun with the same options or --overwrite")
        search.load_state_dict(old["search"])
    final.unlink(missing_ok=True)
    t0 = time.perf_counter()
    base_acc = fitness.accuracies([1.0] * n_layers)  # the unmodified model on the same split, for the record
    bar = _bar(progress, search)

    def on_generation(entry: dict) -> None:
        if _is_main():
            write_json_atomic(out / "log" / f"generation_{entry['generation']:03d}.json", entry, indent=1)
            write_json_atomic(state_path, {"fingerprint": fingerprint, "search": search.state_dict()})
        if bar is not None:
            bar.update(1)
            bar.set_postfix(best=f"{entry['best_fitness']:.3f}", evals=entry.get("evaluations"))

    (out / "log").mkdir(exist_ok=True)
    try:
        best = search.run(on_generation=on_generation)
    finally:
        if bar is not None:
            bar.close()
    rec = fitness.record(best)
    result = {
        "model": cfg.model, "task": cfg.task, "n_layers": n_layers, "space": cfg.space, "curve": cfg.ga.curve,
        "factors": rec["factors"], "fitness": rec["fitness"], "accuracy": dict(zip(REGIONS, rec["acc"])),
        "baseline": {"factors": [1.0] * n_layers, "accuracy": dict(zip(REGIONS, base_acc)),
                     "fitness": sum(w * a for w, a in zip(cfg.weights, base_acc))},
        **space.describe(best),
        "search_split": {"task": cfg.task, "seed": cfg.seed, "skip": cfg.skip, "n": cfg.n, "positions": fitness.positions},
        "history": search.history, "evaluations": len(fitness.seen),
        "seconds_this_call": time.perf_counter() - t0, "config": cfg.to_dict(), "model_info": loaded.info,
    }
    if _is_main():
        from .plots import plot_search

        plot_search(result, out / "factors.png")
        write_json_atomic(final, result, indent=1)  # last: its presence means "complete"
    return result


def _check_out(out: Path, state: Path, final: Path, resume: bool, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise PosbiasError(f"--out {out} is a file", "pass a directory path")
    if resume and overwrite:
        raise PosbiasError("--resume and --overwrite contradict each other", "pass one of them")
    started = state.exists() or final.exists() or (out / "evals.jsonl").exists()
    if started and not (resume or overwrite):
        raise PosbiasError(f"{out} already holds a search", "pass --resume to continue it or --overwrite to start again")
    if overwrite:
        for p in (state, final, out / "evals.jsonl"):
            p.unlink(missing_ok=True)
        for p in (out / "log").glob("*.json") if (out / "log").exists() else []:
            p.unlink()


def _bar(enabled: bool, search):
    if not enabled or not _is_main():
        return None
    from tqdm.auto import tqdm

    total = getattr(search, "total_steps", None)
    return tqdm(total=total, initial=getattr(search, "steps_done", 0), desc="lpes search", unit="gen", dynamic_ncols=True)
