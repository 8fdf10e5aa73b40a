"""Per-example cost of every training-free mitigation, as a ratio to the unmodified model, on the same rows.

    python benchmarks/mitigation_speed.py [--prior runs/prior] [--hidden runs/hidden] [--n 8] [--rounds 2]

Each method scores the same rows through the Scorer one row at a time (teacher forcing, the plain path: no prefix
sharing, batch 1), so what is timed is what a sweep pays per example: a reordering method's relevance signal and
re-encoding, the calibration's measurement forwards, a RoPE method's hook. Methods run interleaved round by round
(none, pi, ..., none, ...) so machine noise hits all alike; the median over rounds is reported. benchmarks/lpes_speed.py
times the RoPE methods under generation (the LPES paper's Table 5 setting).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from posbias import get_method, get_task, load_model
from posbias.measure import Scorer, dtype_note


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--facts", type=int, default=10)
    ap.add_argument("--prior", help="a `posbias analyze prior` folder for calib:DIR (else only calib:prompt runs)")
    ap.add_argument("--hidden", help="a hidden-channel search folder for hidden:DIR")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    loaded = load_model(a.model, "auto", "cpu")  # bf16 on a CPU with native bf16, else fp32
    print(f"dtype {dtype_note('auto', 'cpu')}")
    task = get_task("kv-lookup", facts=a.facts)
    scorer = Scorer(loaded, task, prefix_sharing=False, max_batch=1)
    rows = scorer.rows(task.examples(a.n, 0, 5000), [task.n_slots // 2])
    specs = ["none", "pi:1.1", "mspoe", "buckets", "reorder:bm25", "reorder:oracle:first", "attnsort", "calib:prompt"]
    specs += [f"calib:{a.prior}"] if a.prior else []
    specs += [f"hidden:{a.hidden}"] if a.hidden else []
    methods = {s: get_method(s) for s in specs}
    for m in methods.values():
        m.check(loaded)
    times: dict[str, list[float]] = {s: [] for s in specs}
    scorer.score(rows[:1], "none")  # warm-up
    for _ in range(a.rounds):
        for s, m in methods.items():
            t0 = time.perf_counter()
            scorer.score(rows, m)
            times[s].append((time.perf_counter() - t0) / len(rows))
    base = statistics.median(times["none"])
    mean_len = sum(len(r.prompt_ids) for r in rows) / len(rows)
    print(f"per-example scoring, {a.n} kv-lookup prompts ({a.facts} facts, ~{mean_len:.0f} tokens), teacher forcing, "
          f"batch 1, plain path, median of {a.rounds} interleaved rounds, {torch.get_num_threads()} threads, {a.model}")
    print(f"  {'method':<34} {'s/example':>10} {'ratio':>7}")
    for s in specs:
        med = statistics.median(times[s])
        print(f"  {s[:34]:<34} {med:>10.4f} {med / base:>6.2f}x")


if __name__ == "__main__":
    main()
