"""The three experiment grids of Sec. 5 and App. K as lists of runs (config x seed), with a
disk cache of one JSON per finished run (a killed grid resumes; a killed run resumes from its
checkpoint), mean +- std over seeds, one aggregate JSON written atomically last, and figures.

  depth  causal mask, unbiased data; depth x PE (none, decay, RoPE) x residual off/on  (Fig. 2, 4, 5)
  bias   depth 2 with residuals; mask (none, causal) x PE (none, sin, RoPE) x training-data
         bias (first-last, first, middle, last)                                        (Fig. 3, 6)
  sinks  depth 2, no PE, unbiased data; causal, sliding windows w = 5, 9, 13 and prefixes
         k = 2, 4, 6 (tokens)                                                          (Fig. 7, 8)

Presets: "paper" has the paper's sizes (100k iterations, 5 seeds, 10,000 test sequences per set);
"quick" is sized so that the three grids together take about 30 minutes on 2 cores with
--workers 2 (see benchmarks/synth_speed.py). Every number can be overridden.

Choices the paper leaves open (see the module docstrings for the rest): the PE set of Fig. 2/4/5
is taken as {none, decay, RoPE}, the three encodings its theory treats; the sink runs have no
residual connections (pure attention, as the theory and the public code's default), which
--residual changes.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from ..errors import PosbiasError
from ..outdir import check_out_dir
from ..runs import RunFolder, cached_record, write_json_atomic
from ..runs import progress as progress_bar
from .data import DataConfig
from .evaluate import EvalConfig
from .model import ModelConfig
from .results import GridResult, RunResult, run_rows
from .train import Run, RunConfig, TrainConfig, versions

GRIDS = ("depth", "bias", "sinks")

PRESETS = {
    # quick: lr 3e-3 instead of 1e-3 (measured: in-context learning with sinusoidal PE then emerges
    # after ~6k steps instead of 10k-20k; see docs/synth.md), depth 4 instead of 6 (3x cheaper per step)
    "quick": {"iters": 4000, "lr": 3e-3, "seeds": 2, "eval_seqs": 5000, "sink_seqs": 2000, "position_seqs": 1000,
              "curve_seqs": 256, "log_points": 8, "depths": [2, 4]},
    # medium: 8k steps, lr 3e-3 (the bias grid's positional tasks are learned within 1k steps; sin PE
    # networks died at 1e-2: loss stuck at ln 32); the depth grid's residual networks use 1e-2 (GRID_PRESETS)
    "medium": {"iters": 8000, "lr": 3e-3, "lr_no_residual": 3e-3, "seeds": 2, "eval_seqs": 5000, "sink_seqs": 2000, "position_seqs": 1000,
               "curve_seqs": 256, "log_points": 16, "depths": [2, 4]},
    "paper": {"iters": 100_000, "lr": 1e-3, "seeds": 5, "eval_seqs": 10_000, "sink_seqs": 10_000, "position_seqs": 2000,
              "curve_seqs": 1000, "log_points": 20, "depths": [2, 4, 6]},
}

GRID_PRESETS = {  # preset -> grid -> values that replace the preset's for that grid
    # RoPE, depth 2, residual: in-context accuracy 0.81 after 6k steps at lr 1e-2, 0.52 at 3e-3 (17k to
    # learn); the depth grid's residual networks did not die at 1e-2 (pure-attention ones did: lr_no_residual)
    "medium": {"depth": {"lr": 1e-2}},
}

FACTORS = {  # grid -> default factor lists (overridable); depths come from the preset
    "depth": {"pes": ["none", "decay", "rope"], "residuals": [False, True], "masks": ["causal"], "biases": ["none"]},
    "bias": {"pes": ["none", "sin", "rope"], "residuals": [True], "masks": ["none", "causal"],
             "biases": ["first-last", "first", "middle", "last"], "depths": [2]},
    "sinks": {"pes": ["none"], "residuals": [False], "biases": ["none"], "depths": [2],
              "masks": ["causal", "window5", "window9", "window13", "prefix2", "prefix4", "prefix6"]},
}


def parse_mask(spec: str) -> dict:
    """'causal' | 'none' | 'window5' | 'prefix2' -> ModelConfig fields."""
    for kind in ("window", "prefix"):
        if spec.startswith(kind):
            try:
                return {"mask": kind, kind: int(spec[len(kind):])}
            except ValueError:
                raise PosbiasError(f"bad mask {spec!r}", f"write it as {kind}N, e.g. {kind}5") from None
    return {"mask": spec}


def grid_runs(grid: str, preset: str = "quick", **over) -> list[Run]:
    """The runs of a grid. `over` replaces preset/factor values: iters, lr (every network; without it
    networks without residuals use the preset's lr_no_residual where it sets one), seeds, eval_seqs, sink_seqs,
    position_seqs, curve_seqs, log_points, depths, pes, residuals, masks, biases, twin, and data
    fields (n_classes, n_labels, burstiness, eps, n_items, dim, kind, lam)."""
    if grid not in GRIDS:
        raise PosbiasError(f"unknown grid {grid!r}", f"use one of {', '.join(GRIDS)}")
    if preset not in PRESETS:
        raise PosbiasError(f"unknown preset {preset!r}", f"use one of {', '.join(PRESETS)}")
    p = {**PRESETS[preset], **GRID_PRESETS.get(preset, {}).get(grid, {}), **FACTORS[grid],
         **{k: v for k, v in over.items() if v is not None}}
    data_keys = set(DataConfig.__dataclass_fields__) - {"bias"}
    data = {k: p[k] for k in data_keys if k in p}
    if over.get("lr") is not None:  # an explicit --lr applies to every network
        p["lr_no_residual"] = over["lr"]
    train = TrainConfig(iters=p["iters"], lr=p["lr"], log_points=p["log_points"], curve_seqs=p["curve_seqs"])
    pure = replace(train, lr=p.get("lr_no_residual", p["lr"]))  # networks without residual connections
    ecfg = EvalConfig(n_seqs=p["eval_seqs"], sink_seqs=p["sink_seqs"], position_seqs=p["position_seqs"],
                      twin=p.get("twin", "other"))
    runs = []
    for depth in p["depths"]:
        for mask in p["masks"]:
            for pe in p["pes"]:
                for res in p["residuals"]:
                    for bias in p["biases"]:
                        model = ModelConfig(depth=depth, pe=pe, residual=res, **parse_mask(mask))
                        fac = {"depth": depth, "mask": mask, "pe": pe, "residual": res, "bias": bias}
                        for seed in range(p["seeds"]):
                            cfg = RunConfig(DataConfig(bias=bias, **data), model, train if res else pure, ecfg,
                                            seed).validate()
                            runs.append(Run(fac, cfg))
    return runs


def run_one(cfg: RunConfig, out_json: str | Path, ckpt: str | Path | None = None, progress: bool = True,
            threads: int | None = 1) -> dict:
    """Train, evaluate, write `out_json` atomically (its presence = done) and drop the checkpoint.

    An existing out_json with the same configuration is returned as is; a checkpoint is resumed.
    One torch thread by default: these networks are too small to gain from more, and a fixed
    thread count keeps a rerun bit-identical; use grid workers for more cores."""
    import torch

    from .evaluate import evaluate
    from .train import train

    out_json = Path(out_json)
    old = cached_record(out_json, cfg.to_dict())
    if old is not None:
        return old
    cfg.validate()
    out_json.parent.mkdir(parents=True, exist_ok=True)
    ckpt = Path(ckpt) if ckpt else out_json.with_suffix(".ckpt")
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        res = train(cfg, ckpt, progress=progress)
        t0 = time.perf_counter()
        metrics = evaluate(res.model, res.task, cfg.eval, ("test", cfg.seed))
        record = {"config": cfg.to_dict(), "metrics": metrics, "history": res.history,
                  "seconds": {"train": res.seconds, "eval": time.perf_counter() - t0}, "versions": versions(),
                  "trained_with": {"device": "cpu", "group": 1}}
    finally:
        torch.set_num_threads(before)
    write_json_atomic(out_json, record, indent=1)
    ckpt.unlink(missing_ok=True)
    return record


def _worker(cfg_dict: dict, out_json: str) -> dict:
    return run_one(RunConfig.from_dict(cfg_dict), out_json, progress=False)


def run_grid(grid: str, runs: list[Run], out: str | Path, workers: int = 1, progress: bool = True,
             overwrite: bool = False, device: str = "cpu", group: int = 1) -> GridResult:
    """Run (or continue) every run; aggregate over seeds into OUT/<grid>.json (last) and figures.

    A rerun into the same folder continues: runs/ caches one JSON per finished run, named by its
    configuration's hash, so only missing runs are trained. group > 1 (or a device other than cpu)
    trains runs of one architecture `group` at a time on `device` (synth.multi); workers take groups."""
    from .multi import resolve_device

    if workers < 1:
        raise PosbiasError(f"`workers` must be >= 1, got {workers}", "pass `workers=1` or more")
    if group < 1:
        raise PosbiasError(f"`group` must be >= 1, got {group}", "pass `group=1` or more")
    device = resolve_device(device)
    folder = RunFolder(out, f"synth {grid} grid", f"{grid}.json", ("runs",))
    resume = folder.started() and not overwrite
    with folder.open({"grid": grid}, resume, overwrite):
        folder.file(f"{grid}.json").unlink(missing_ok=True)  # this call's runs may differ from the last one's
        rundir = folder.file("runs")
        rundir.mkdir(parents=True, exist_ok=True)
        records = {r.name: run_one(r.cfg, rundir / f"{r.name}.json") for r in runs if (rundir / f"{r.name}.json").exists()}
        todo = [r for r in runs if r.name not in records]
        bar = progress_bar(len(runs), f"synth {grid}", "run", initial=len(records), enabled=progress, position=0)
        t0 = time.perf_counter()
        try:
            if group == 1 and device == "cpu":
                _train_all(todo, rundir, workers, progress, records, bar)
            else:
                from .multi import train_groups

                train_groups(runs, records, rundir, (device, group, workers), progress, bar)
        finally:
            bar.close()
        result = aggregate(grid, runs, records)
        result["wall_seconds_this_call"] = time.perf_counter() - t0
        from ..report.synth_plots import plot_grid

        result["figures"] = plot_grid(grid, result, folder.path)
        folder.finish(result, indent=1)  # last: its presence means "complete"
    return GridResult(result["configs"], result["figures"], result, run_rows(runs, records))


def run_single(cfg: RunConfig, out: str | Path, progress: bool = True, device: str = "cpu") -> RunResult:
    """One configuration into OUT (`posbias synth train`): a rerun returns the finished run or resumes its checkpoint.
    A device other than cpu trains it through synth.multi (a group of one)."""
    from .multi import resolve_device, run_group

    device = resolve_device(device)
    check_out_dir(Path(out))
    if device == "cpu":
        rec = run_one(cfg, one_run_path(out, cfg), progress=progress)
    else:
        rec = run_group([cfg], [one_run_path(out, cfg)], device, progress)[0]
    return RunResult(rec["metrics"], rec["history"], rec)


def _train_all(todo: list[Run], rundir: Path, workers: int, progress: bool, records: dict, bar) -> None:
    if workers == 1:
        for r in todo:
            records[r.name] = run_one(r.cfg, rundir / f"{r.name}.json", progress=progress)
            bar.update(1)
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as ex:
        futs = {ex.submit(_worker, r.cfg.to_dict(), str(rundir / f"{r.name}.json")): r for r in todo}
        for f in as_completed(futs):
            records[futs[f].name] = f.result()
            bar.update(1)


def _stats(values: list) -> dict:
    a = np.asarray(values, dtype=float)
    std = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros_like(a[0])
    return {"mean": a.mean(axis=0).tolist(), "std": std.tolist(), "n": len(a)}


def summarize(records: list[dict]) -> dict:
    """Mean and sample std (ddof=1) over the seeds of one configuration."""
    m = [r["metrics"] for r in records]
    pairs = list(m[0]["swap"])
    out = {f"gap/{p}": _stats([x["swap"][p]["gap"] for x in m]) for p in pairs}
    out.update({f"acc_ab/{p}": _stats([x["swap"][p]["acc_ab"] for x in m]) for p in pairs})
    out.update({f"acc_ba/{p}": _stats([x["swap"][p]["acc_ba"] for x in m]) for p in pairs})
    for k in ("novel_accuracy", "train_accuracy", "accuracy_by_position"):
        out[k] = _stats([x[k] for x in m])
    if all("icl_accuracy" in x for x in m):  # runs cached before the in-context verdict existed lack it
        out["icl_accuracy"] = _stats([x["icl_accuracy"] for x in m])
        out["learned"] = {"seeds": sum(bool(x["learned"]) for x in m), "of": len(m),
                          "all": all(x["learned"] for x in m), "threshold": m[0]["icl_threshold"]}
    out["sink"] = _stats([x["sinks"]["per_token"] for x in m])
    out["train_seconds"] = _stats([r["seconds"]["train"] for r in records])
    hist = [r["history"] for r in records if r["history"]]
    if hist and all(len(h) == len(hist[0]) for h in hist):
        out["curve"] = {"step": [p["step"] for p in hist[0]],
                        "novel_acc": _stats([[p["novel_acc"] for p in h] for h in hist]),
                        "train_loss": _stats([[p["train_loss"] for p in h] for h in hist]),
                        **{f"gap/{k}": _stats([[p["gaps"][k] for p in h] for h in hist]) for k in pairs}}
        if all("icl_acc" in p for h in hist for p in h):
            out["curve"]["icl_acc"] = _stats([[p["icl_acc"] for p in h] for h in hist])
    return out


def aggregate(grid: str, runs: list[Run], records: dict[str, dict]) -> dict:
    groups: dict[str, dict] = {}
    for r in runs:
        key = json.dumps(r.factors, sort_keys=True)
        g = groups.setdefault(key, {"factors": r.factors, "seeds": [], "runs": []})
        g["seeds"].append(r.cfg.seed)
        g["runs"].append(r.name)
    configs = []
    for g in groups.values():
        configs.append({**g, "summary": summarize([records[n] for n in g["runs"]])})
    first = runs[0].cfg.to_dict()
    return {"grid": grid, "n_runs": len(runs), "template": {k: first[k] for k in ("data", "train", "eval")},
            "configs": configs, "total_train_seconds": sum(r["seconds"]["train"] for r in records.values()),
            "versions": versions()}


def one_run_config(*, mask: str = "causal", seed: int = 0, iters: int = 4000, lr: float = 1e-3, eval_seqs: int = 5000,
                   data: dict | None = None, **model) -> RunConfig:
    """One configuration (`posbias synth train`): the paper's data (DataConfig fields in `data`), model
    (ModelConfig fields in `model`, mask as 'causal' | 'windowN' | 'prefixN' | 'none') and lr (App. J),
    with a short default run: 4,000 steps (the paper: 100,000) and 5,000 test sequences per swap-test set."""
    model_cfg = ModelConfig(**{**model, **parse_mask(mask)})
    ecfg = EvalConfig(n_seqs=eval_seqs, sink_seqs=eval_seqs, position_seqs=max(1, eval_seqs // 4))
    return RunConfig(DataConfig(**(data or {})), model_cfg, TrainConfig(iters=iters, lr=lr), ecfg, seed).validate()


def one_run_path(out: str | Path, cfg: RunConfig) -> Path:
    """Where `posbias synth train` keeps a configuration's result in OUT (a rerun resumes or returns it)."""
    return Path(out) / f"{cfg.model.label}-{cfg.data.bias}-seed{cfg.seed}-{cfg.key()}.json"


def with_overrides(cfg: RunConfig, **kw) -> RunConfig:
    """Replace fields of the nested configs by name (e.g. iters=..., depth=..., eps=...)."""
    parts = {"data": cfg.data, "model": cfg.model, "train": cfg.train, "eval": cfg.eval}
    for name, obj in parts.items():
        fields = {k: v for k, v in kw.items() if v is not None and k in type(obj).__dataclass_fields__}
        parts[name] = replace(obj, **fields)
    return RunConfig(**parts, seed=kw.get("seed", cfg.seed) if kw.get("seed") is not None else cfg.seed).validate()
