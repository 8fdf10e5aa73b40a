"""Training speed of the synthetic-experiment networks and the wall time of the quick grids.

    python benchmarks/synth_speed.py [--steps 150] [--threads 1] [--workers 2] [--parallel-check]

Measured (wall clock, after a warm-up of 10 steps, on the paper's data: K = 2048, L = 32, B = 4,
n = 8, d = 64, batch 128, AdamW):
  steps/s      training steps per second (data generation included) at depth 2 and 6 with the
               default options (causal mask, no PE, residuals) and for every PE the quick grids use
  eval s       one final `evaluate` with the quick preset's sizes, and one learning-curve point
Estimated: the wall time of each quick grid = sum over its runs of (iters / steps/s + curve points
+ final eval), divided by --workers (runs are independent processes with 1 thread each; the
estimate assumes the workers do not slow each other down; --parallel-check measures that by
timing two training processes at once, which occupies both cores for a few seconds).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch
import torch.nn.functional as F

from posbias.synth.data import generator
from posbias.synth.evaluate import evaluate
from posbias.synth.experiments import PRESETS, grid_runs
from posbias.synth.model import ModelConfig
from posbias.synth.train import RunConfig, build, curve_point


def steps_per_second(model_cfg: ModelConfig, steps: int, threads: int) -> float:
    torch.set_num_threads(threads)
    cfg = RunConfig(model=model_cfg)
    task, model = build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    t0 = 0.0
    for step in range(steps + 10):
        if step == 10:
            t0 = time.perf_counter()
        b = task.train_batch(128, generator("train", 0, step))
        loss = F.cross_entropy(model(b.x), b.y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps / (time.perf_counter() - t0)


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


def _rate_job(args) -> float:
    return steps_per_second(ModelConfig(depth=args[0]), args[1], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="timed steps per measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of one run (grid workers use 1)")
    ap.add_argument("--workers", type=int, default=2, help="parallel runs assumed for the grid estimate")
    ap.add_argument("--parallel-check", action="store_true", help="time two depth-2 trainings at once")
    a = ap.parse_args()

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

    total = 0.0
    q = PRESETS["quick"]
    print(f"\nquick preset: {q['iters']} iterations, {q['seeds']} seeds, {q['eval_seqs']} sequences per swap set, "
          f"{q['log_points']} curve points; {a.workers} workers")
    for grid in ("depth", "bias", "sinks"):
        runs = grid_runs(grid, "quick")
        sec = 0.0
        for r in runs:
            d = r.cfg.model.depth
            e, c = evals[2] if d <= 2 else evals[6] if d >= 6 else tuple((x + y) / 2 for x, y in zip(evals[2], evals[6]))
            sec += r.cfg.train.iters * per_step(d, r.cfg.model.pe) + r.cfg.train.log_points * c + e
        total += sec / a.workers
        print(f"synth {grid:5s}: {len(runs):3d} runs, {sec / 60:5.1f} core-min -> ~{sec / a.workers / 60:5.1f} min wall")
    print(f"all three quick grids: ~{total / 60:.1f} min wall with {a.workers} workers")


if __name__ == "__main__":
    main()
