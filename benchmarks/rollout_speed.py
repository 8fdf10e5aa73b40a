"""Query-row rollout vs the full matrix product of eq. (4), T layers of N x N causal attention.

    python benchmarks/rollout_speed.py [--sizes 1024,2048,4096,8192] [--max-n 8192] [--layers 32]
                                       [--rows 1] [--full-max-n 4096] [--threads 2]

Layers: causal attention from random bounded Q/K (d = 16, float32), built on the fly by
`rollout.iid_layer_fn` from a per-layer seed. Storing 32 dense 8192 x 8192 layers would take
8 GiB in float32 (16 GiB in float64); on the fly, a run holds one layer (plus P for the full
product). Both methods call the same layer source, the query-row rollout in descending order.

What is timed, per N (seconds, wall clock, one run after a small warm-up):
  gen        building the T layers (scores, mask, softmax); identical work for both methods
  rows       query-row rollout r <- r A^(t), t = T-1..0, for the last --rows query rows,
             products only (total time minus gen)
  rows+gen   the whole query-row rollout call, layers included
  full       full product P <- A^(t) P, t = 1..T-1, products only; skipped above --full-max-n
             (O(T N^3): ~35 TFLOP at N = 8192), then estimated as full(N0) (N/N0)^3 from the
             largest measured N0 and marked "~"
  ratio      full / rows (products only)
  err        max |rows - full[rows]| when both ran (float32)
Target (the issue): N = 8192, T = 32, query-row rollout (rows+gen) under 5 s on 2 cores.
"""

from __future__ import annotations

import argparse
import time

import torch

from posbias.core import rollout as R


class TimedSource:
    """Wrap a layer source; accumulate the seconds spent building layers."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, t: int) -> torch.Tensor:
        t0 = time.perf_counter()
        a = self.fn(t)
        self.seconds += time.perf_counter() - t0
        return a


def timed(call, source: TimedSource) -> tuple[float, float, torch.Tensor]:
    """(total seconds, generation seconds, result) of call(source)."""
    source.seconds = 0.0
    t0 = time.perf_counter()
    out = call(source)
    return time.perf_counter() - t0, source.seconds, out


def bench(n: int, n_layers: int, n_rows: int, run_full: bool) -> dict:
    source = TimedSource(R.iid_layer_fn(n, R.causal_mask(n), d=16, seed=0, dtype=torch.float32))
    rows = torch.arange(n - n_rows, n)
    total, gen, got = timed(lambda s: R.rollout_rows(s, rows, n_layers=n_layers), source)
    out = dict(n=n, gen=gen, rows=total - gen, rows_gen=total, full=None, err=None)
    if run_full:
        total_f, gen_f, p = timed(lambda s: R.rollout(s, n_layers=n_layers), source)
        out.update(full=total_f - gen_f, err=float((p[rows] - got).abs().max()))
    return out


def fmt(v, width=10, est=False) -> str:
    if v is None:
        return f"{'skipped':>{width}}"
    return f"{('~' if est else '') + f'{v:.3f}':>{width}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096,8192")
    ap.add_argument("--max-n", type=int, default=8192, help="skip sizes above this (e.g. 2048 on a shared box)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rows", type=int, default=1, help="number of query rows (the last ones)")
    ap.add_argument("--full-max-n", type=int, default=4096, help="skip the O(T N^3) full product above this")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sizes = [n for n in map(int, a.sizes.split(",")) if n <= a.max_n]
    bench(256, 2, a.rows, True)  # warm-up
    print(f"T = {a.layers} layers, {a.rows} query row(s), float32, causal mask, {torch.get_num_threads()} thread(s)")
    print(f"{'N':>6} {'gen':>10} {'rows':>10} {'rows+gen':>10} {'full':>10} {'full/rows':>10} {'err':>9}")
    ref = None
    for n in sizes:
        r = bench(n, a.layers, a.rows, n <= a.full_max_n)
        full, est = r["full"], False
        if full is not None:
            ref = (n, full)
        elif ref is not None:
            full, est = ref[1] * (n / ref[0]) ** 3, True
        ratio = None if full is None else full / r["rows"]
        err = "" if r["err"] is None else f"{r['err']:.1e}"
        print(f"{n:>6} {fmt(r['gen'])} {fmt(r['rows'])} {fmt(r['rows_gen'])} {fmt(full, est=est)} "
              f"{fmt(ratio, est=est)} {err:>9}", flush=True)
        if n == 8192:
            verdict = "meets" if r["rows_gen"] < 5 else "misses"
            print(f"target: N=8192 rows+gen {r['rows_gen']:.2f} s {verdict} the 5 s target")
    skipped = [n for n in map(int, a.sizes.split(",")) if n > a.max_n]
    if skipped:
        print(f"note: sizes {skipped} skipped (--max-n {a.max_n})")
    if any(n > a.full_max_n for n in sizes):
        print(f"note: full product skipped above N = {a.full_max_n}; '~' = N^3 extrapolation from the largest measured N")


if __name__ == "__main__":
    main()
