"""Training speed of the synthetic-experiment networks and the time of the grids of each preset.

    python benchmarks/synth_speed.py [--steps 150] [--threads 1] [--workers 2] [--parallel-check]
                                     [--presets quick,medium] [--measured runs/synth-medium]
                                     [--device cpu|cuda|auto] [--groups 1,4,8,16] [--group-steps 60] [--only-groups]

Measured (wall clock, after a warm-up of 10 steps, on the paper's data: K = 2048, L = 32, B = 4,
n = 8, d = 64, batch 128, AdamW):
  steps/s      training steps per second (data generation included) at depth 2 and 6 with the
               default options (causal mask, no PE, residuals) and for every PE the quick grids use
  eval s       one final `evaluate` with the quick preset's sizes, and one learning-curve point
Estimated: the wall time of each grid of each preset (--presets) = sum over its runs of (iters / steps/s + curve points
+ final eval), divided by --workers (runs are independent processes with 1 thread each; the
estimate assumes the workers do not slow each other down; --parallel-check measures that by
timing two training processes at once, which occupies both cores for a few seconds). With
--measured DIR the core-minutes the finished grids in DIR actually took (training + final evaluation,
summed over their per-run JSONs) are printed next to the estimate.
Several runs at once (synth.multi, --groups): for depth 2 and 6, PE none and RoPE, and each group
size R: steps/s of the group, run-steps/s (R x steps/s) and their ratio to one run trained alone
(the train.train loop) on the same --device; also the CPU time of one run's batch generation,
which every grouped step still pays R times (the batches are the single-run CPU streams).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.nn.functional as F

from posbias.synth.data import generator
from posbias.synth.evaluate import evaluate
from posbias.synth.experiments import PRESETS, grid_runs
from posbias.synth.model import ModelConfig
from posbias.synth.multi import _Group, resolve_device
from posbias.synth.train import RunConfig, build, curve_point


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def steps_per_second(model_cfg: ModelConfig, steps: int, threads: int, device: str = "cpu") -> float:
    torch.set_num_threads(threads)
    cfg = RunConfig(model=model_cfg)
    task, model = build(cfg)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    t0 = 0.0
    for step in range(steps + 10):
        if step == 10:
            _sync(device)
            t0 = time.perf_counter()
        b = task.train_batch(128, generator("train", 0, step))
        loss = F.cross_entropy(model(b.x.to(device)), b.y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(device)
    return steps / (time.perf_counter() - t0)


def group_steps_per_second(model_cfg: ModelConfig, r: int, steps: int, device: str) -> float:
    """Steps/s of a group of r runs (seeds 0..r-1) trained at once by synth.multi, after 5 warm-up steps."""
    g = _Group([RunConfig(model=model_cfg, seed=s) for s in range(r)], device)
    t0 = 0.0
    for step in range(steps + 5):
        if step == 5:
            _sync(device)
            t0 = time.perf_counter()
        g.train_step(step)
    _sync(device)
    return steps / (time.perf_counter() - t0)


def batch_seconds(n: int = 50) -> float:
    """CPU seconds to generate one run's training batch (paper data, batch 128)."""
    task, _ = build(RunConfig())
    t0 = time.perf_counter()
    for step in range(n):
        task.train_batch(128, generator("train", 0, step))
    return (time.perf_counter() - t0) / n


def group_table(groups: list[int], steps: int, device: str) -> None:
    """Print the several-runs-at-once table: depth 2 and 6, PE none and RoPE, each group size."""
    print(f"\nseveral runs at once on {device} ({torch.get_num_threads()} thread(s)), {steps} timed steps; "
          f"one run's batch generation: {batch_seconds() * 1e3:.2f} ms (CPU)")
    print("depth  pe    |    R | group steps/s | run-steps/s | vs one run alone")
    for depth in (2, 6):
        for pe in ("none", "rope"):
            cfg = ModelConfig(depth=depth, pe=pe)
            alone = steps_per_second(cfg, steps, torch.get_num_threads(), device)
            print(f"{depth:5d}  {pe:5s} | alone| {alone:13.1f} | {alone:11.1f} | 1.00x")
            for r in groups:
                rate = group_steps_per_second(cfg, r, steps, device)
                print(f"{depth:5d}  {pe:5s} | {r:4d} | {rate:13.1f} | {r * rate:11.1f} | {r * rate / alone:.2f}x")


def eval_seconds(depth: int, threads: int) -> tuple[float, float]:
    """(final evaluate, one learning-curve point) in seconds with the quick preset's sizes."""
    torch.set_num_threads(threads)
    run = grid_runs("depth", "quick", depths=[depth], pes=["none"], residuals=[True], seeds=1)[0]
    task, model = build(run.cfg)
    t0 = time.perf_counter()
    evaluate(model, task, run.cfg.eval, 0)
    t1 = time.perf_counter()
    curve_point(model, task, run.cfg, 0, {"loss": 1.0, "correct": 0, "count": 1})
    return t1 - t0, time.perf_counter() - t1


def run_cost(depth: int, pe: str, iters: int, log_points: int, per_step, evals) -> float:
    """Estimated seconds of one run: its steps at the measured rate, its curve points, its final evaluation."""
    e, c = evals[2] if depth <= 2 else evals[6] if depth >= 6 else tuple((x + y) / 2 for x, y in zip(evals[2], evals[6]))
    return iters * per_step(depth, pe) + log_points * c + e


def measured(folder: Path, grid: str, per_step, evals) -> tuple[int, float, float] | None:
    """(runs, seconds the runs took (train + final evaluation, each run's wall time, summed), the estimate for
    those very runs) of a finished grid folder; only the runs its GRID.json lists."""
    result = folder / grid / f"{grid}.json"
    if not result.exists():
        return None
    names = [n for c in json.loads(result.read_text())["configs"] for n in c["runs"]]  # not stale files beside them
    recs = [json.loads((folder / grid / "runs" / f"{n}.json").read_text()) for n in names]
    took = sum(r["seconds"]["train"] + r["seconds"]["eval"] for r in recs)
    est = sum(run_cost(r["config"]["model"]["depth"], r["config"]["model"]["pe"], r["config"]["train"]["iters"],
                       r["config"]["train"]["log_points"], per_step, evals) for r in recs)
    return len(recs), took, est


def estimate(preset: str, workers: int, per_step, evals) -> None:
    """Estimated core-minutes and wall minutes of each grid of `preset` on an otherwise idle machine."""
    q = PRESETS[preset]
    print(f"\n{preset} preset: {q['iters']} iterations, {q['seeds']} seeds, {q['eval_seqs']} "
          f"sequences per swap set, {q['log_points']} curve points; {workers} workers")
    total = 0.0
    for grid in ("depth", "bias", "sinks"):
        runs = grid_runs(grid, preset)
        sec = sum(run_cost(r.cfg.model.depth, r.cfg.model.pe, r.cfg.train.iters, r.cfg.train.log_points, per_step, evals)
                  for r in runs)
        total += sec / workers
        print(f"synth {grid:5s}: {len(runs):3d} runs, {sec / 60:5.1f} core-min -> ~{sec / workers / 60:5.1f} min wall")
    print(f"all three {preset} grids: ~{total / 60:.1f} min wall with {workers} workers")


def report_measured(folder: Path, per_step, evals) -> None:
    """The finished grids in `folder` (DIR/depth, DIR/bias, DIR/sinks): what their runs took against the estimate
    for the same runs (> 1x: the machine was shared, or slower than when the rates above were measured)."""
    print(f"\nmeasured grids in {folder}:")
    for grid in ("depth", "bias", "sinks"):
        got = measured(folder, grid, per_step, evals)
        if got:
            n, took, est = got
            print(f"synth {grid:5s}: {n:3d} runs took {took / 60:6.1f} run-min; estimate for these runs "
                  f"{est / 60:6.1f} core-min ({took / est:.2f}x)")


def _rate_job(args) -> float:
    return steps_per_second(ModelConfig(depth=args[0]), args[1], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="timed steps per measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of one run (grid workers use 1)")
    ap.add_argument("--workers", type=int, default=2, help="parallel runs assumed for the grid estimate")
    ap.add_argument("--parallel-check", action="store_true", help="time two depth-2 trainings at once")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto, for the several-runs-at-once table")
    ap.add_argument("--groups", default="1,4,8,16", help="group sizes R for that table ('' to skip it)")
    ap.add_argument("--group-steps", type=int, default=60, help="timed steps per group measurement")
    ap.add_argument("--only-groups", action="store_true", help="print only the several-runs-at-once table")
    ap.add_argument("--presets", default="quick,medium", help="presets whose grid time is estimated")
    ap.add_argument("--measured", type=Path, default=None,
                    help="a folder with finished grids (DIR/depth, DIR/bias, DIR/sinks): their measured core-minutes")
    a = ap.parse_args()
    device = resolve_device(a.device)
    groups = [int(x) for x in a.groups.split(",") if x]
    if a.only_groups:
        torch.set_num_threads(a.threads)
        group_table(groups, a.group_steps, device)
        return

    print(f"threads per run: {a.threads}; timed steps: {a.steps}")
    rates = {}
    for depth in (2, 6):
        for pe in ("none", "sin", "decay", "rope"):
            rates[(depth, pe)] = steps_per_second(ModelConfig(depth=depth, pe=pe), a.steps, a.threads)
            print(f"depth {depth}  pe {pe:5s}  {rates[(depth, pe)]:7.1f} steps/s")
    evals = {d: eval_seconds(d, a.threads) for d in (2, 6)}
    for d, (e, c) in evals.items():
        print(f"depth {d}  final eval (quick sizes) {e:.1f} s, one curve point {c:.2f} s")
    if a.parallel_check:
        with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as ex:
            both = list(ex.map(_rate_job, [(2, a.steps), (2, a.steps)]))
        print(f"two runs at once, depth 2: {both[0]:.1f} and {both[1]:.1f} steps/s "
              f"(alone {rates[(2, 'none')]:.1f}): parallel speed-up {sum(both) / rates[(2, 'none')]:.2f}x")

    def per_step(depth: int, pe: str) -> float:  # linear in depth between the measured 2 and 6
        s2, s6 = 1 / rates[(2, pe)], 1 / rates[(6, pe)]
        return s2 + (s6 - s2) * (depth - 2) / 4

    for preset in a.presets.split(","):
        estimate(preset, a.workers, per_step, evals)
    if a.measured:
        report_measured(a.measured, per_step, evals)
    if groups:
        group_table(groups, a.group_steps, device)


if __name__ == "__main__":
    main()
