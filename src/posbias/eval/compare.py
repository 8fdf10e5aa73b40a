"""Several methods (and models) on the same examples: one sweep per entry (each resumable), one table, one plot.

An entry is a method spec applied to a model; `models` (e.g. the base model and the model
directories `posbias distill` writes) gives one entry per model and method. Files in OUT:
<slug>/ per entry (a normal sweep directory), compare.json (atomic, last), compare.png
(accuracy against position, one line per entry).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from ..errors import PosbiasError
from ..io import write_json_atomic
from ..models.load import load_model
from .sweep import SweepConfig, run_sweep


def slug(spec: str) -> str:
    """A directory name for a method spec (`lpes:runs/x/factors.json` -> `lpes-runs-x-factors.json`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-") or "none"


def _refuse_overlap(cfg: SweepConfig, split: dict | None, what: str) -> None:
    """Raise if `split` (task, seed, skip, n: examples a search or training used) overlaps cfg's examples."""
    if not split or split.get("task") != cfg.task or split.get("seed") != cfg.seed:
        return
    lo, hi = split["skip"], split["skip"] + split["n"]
    if lo < cfg.skip + cfg.n and cfg.skip < hi:
        raise PosbiasError(
            f"{what} on examples {lo}..{hi - 1} of {cfg.task}, which overlap the {cfg.skip}..{cfg.skip + cfg.n - 1}"
            " asked for here", f"report on held-out examples, e.g. --skip {hi}, or --n {max(lo - cfg.skip, 0)}")


def check_disjoint(cfg: SweepConfig, methods: list[str]) -> None:
    """Refuse to report LPES on the examples its factors were searched on."""
    from ..methods.scaling import read_factors

    for m in methods:
        name, _, arg = m.partition(":")
        if name in ("lpes", "pi") and arg and Path(arg).exists():
            _refuse_overlap(cfg, read_factors(arg).get("search_split"), f"{m} was searched")


def _distill_record(model: str) -> dict | None:
    """posbias_distill.json inside a model directory that `posbias distill` wrote (it travels with the model)."""
    p = Path(model) / "posbias_distill.json"
    return json.loads(p.read_text()) if p.exists() else None


def model_label(model: str) -> str:
    """`runs/p2d/full/model` (a distill output) -> `full`; anything else unchanged."""
    return Path(model).parent.name if _distill_record(model) else model


def check_disjoint_training(cfg: SweepConfig, models: list[str]) -> None:
    """Refuse to report a distilled model on the examples it was trained on."""
    for mo in models:
        _refuse_overlap(cfg, (_distill_record(mo) or {}).get("train_split"), f"{mo} was trained")


def run_compare(cfg: SweepConfig, methods: list[str], out: str | Path, resume: bool = False,
                overwrite: bool = False, progress: bool = True, models: list[str] | None = None) -> dict:
    """Run `cfg` once per (model, method) entry (each model loaded once); write compare.json last.

    models: None = cfg.model only (entries are named by method); several = every model with every method."""
    from ..methods import get_method

    if not methods:
        raise PosbiasError("no methods given", "pass --methods none,pi:1.1,mspoe,buckets,lpes:DIR/factors.json")
    if len(set(methods)) != len(methods):
        raise PosbiasError(f"a method is listed twice in {','.join(methods)}", "list each method once")
    if models is not None and (not models or len(set(models)) != len(models)):
        raise PosbiasError(f"--models must list distinct models, got {','.join(models)}", "list each model once")
    for m in methods:
        get_method(m)  # fail on a bad spec before any work
    check_disjoint(cfg, methods)
    check_disjoint_training(cfg, models or [cfg.model])
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PosbiasError(f"--out {out} is a file", "pass a directory path")
    (out / "compare.json").unlink(missing_ok=True)
    named = models is not None
    results, infos = [], {}
    names = {mo: model_label(mo) for mo in models or [cfg.model]}
    for mo, name in names.items():
        loaded = load_model(mo, cfg.dtype, cfg.device)
        infos[mo] = loaded.info
        for m in methods:
            label = get_method(m).label
            if named:
                label = name if m == "none" else f"{name} + {label}"
            d = out / (slug(f"{name}@{m}") if named else slug(m))
            started = (d / "sweep.json").exists() or (d / "sweep.partial.json").exists()
            res = run_sweep(replace(cfg, model=mo, method=m), d, resume=resume and started, overwrite=overwrite,
                            loaded=loaded, progress=progress)
            results.append({"model": mo, "method": m, "label": label, "dir": d.name,
                            "method_config": res.record["method"], "per_position": res.per_position,
                            "summary": res.summary})
        del loaded
    _add_paired_differences(results, out)
    record = {"config": {**res.config, "method": None, "model": None if named else cfg.model},
              "model": infos[cfg.model] if not named else None, "models": infos, "methods": results}
    from ..report.plots import plot_compare

    what = ", ".join(names.values()) if named else cfg.model
    plot_compare(results, f"{cfg.task} on {what} (n={cfg.n}, {res.config['engine']})", out / "compare.png")
    write_json_atomic(out / "compare.json", record, indent=2)  # last: its presence means "complete"
    return record


def _matrix(path: Path) -> dict:
    return {(r["example_id"], r["position"]): bool(r["correct"]) for r in map(json.loads, path.read_text().splitlines())}


def _add_paired_differences(results: list[dict], out: Path) -> None:
    """Each method's average minus the first method's, paired over the same examples (bootstrap CI)."""
    import numpy as np

    from ..core.metrics import paired_difference

    base = _matrix(out / results[0]["dir"] / "examples.jsonl")
    examples = sorted({k[0] for k in base})
    positions = [p["position"] for p in results[0]["per_position"]]
    grid = lambda m: np.array([[m[(e, p)] for p in positions] for e in examples])  # noqa: E731
    a = grid(base)
    for r in results:
        r["vs_first"] = paired_difference(a, grid(_matrix(out / r["dir"] / "examples.jsonl")))


def format_compare(record: dict) -> str:
    """Accuracy per position, one row per method, then average and gap (paired-bootstrap 95% CI)."""
    rows = record["methods"]
    positions = [p["position"] for p in rows[0]["per_position"]]
    w = max(12, *(len(r["label"]) for r in rows))
    first = rows[0]["label"]
    what = "method" if record["config"].get("model") else "model"  # compare --models: entries are models
    head = (f"{what:<{w}} " + " ".join(f"{p:>6}" for p in positions) + f" {'avg':>6} {'gap':>6}  gap 95% CI"
            + f"        avg - {first} (paired 95% CI)")
    lines = [head]
    for r in rows:
        s = r["summary"]
        accs = " ".join(f"{p['accuracy']:>6.3f}" for p in r["per_position"])
        ci = f"[{s['gap_ci'][0]:.3f}, {s['gap_ci'][1]:.3f}]"
        v = r.get("vs_first")
        vs = f"{v['difference']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]" if v else ""
        lines.append(f"{r['label']:<{w}} {accs} {s['average']:>6.3f} {s['gap']:>6.3f}  {ci:<16}  {vs}")
    return "\n".join(lines)
