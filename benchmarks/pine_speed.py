"""PINE's cost against plain inference, per row, at 2 items (judge-kv), 10 and 20 documents (NQ): CPU seconds (every
thread of the process) and wall seconds per row, and the ratio, with the CPU kind. Each (task, method) is its own cold
process (the de-quantized model cache on disk is warm; the model load is not timed). Both on the plain path (no
prefix sharing: PINE cannot share a prefix), teacher-forced, the same rows. The goal (issue 68): PINE at most 1.5x
plain at 2 items and 3x at 20 documents (the paper's implementation: about 2x and 8x).

The paper's loop as written (`models/pine_reference.py`, one query at a time) is for the tests only: one 20-document
row would take hours; it is not timed here.

    python benchmarks/pine_speed.py [--n 2] [--model smollm2-135m] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = (("2 items (judge-kv)", "judge-kv", {}), ("10 documents (nq)", "nq", {"docs": 10}),
         ("20 documents (nq)", "nq", {"docs": 20}))


def child(task: str, options: dict, method: str, n: int, model: str, dtype: str) -> dict:
    from posbias import SweepConfig, load_model, run_sweep

    lo = load_model(model, dtype, "cpu", progress=False)
    cfg = SweepConfig(task=task, task_options=options, positions="0" if task == "nq" else None, n=n, method=method,
                      prefix_sharing=False)
    usage0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    res = run_sweep(cfg, loaded=lo, progress=False)
    usage1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {"rows": len(res.rows), "cpu": cpu, "wall": wall, "average": res.summary["average"],
            "dtype": lo.info["dtype"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        task, options, method = a.child
        print(json.dumps(child(task, json.loads(options), method, a.n, a.model, a.dtype)))
        return
    from posbias.measure import cpu_kind

    print(f"PINE against plain, {a.model} ({a.dtype}), {a.n} examples per case, teacher-forced, plain path; "
          f"CPU: {cpu_kind().describe()}")
    print(f"{'case':<22}{'method':<8}{'rows':>5}{'CPU s/row':>11}{'wall s/row':>12}{'CPU ratio':>11}{'average':>9}")
    for label, task, options in CASES:
        plain = None
        for method in ("none", "pine"):
            out = subprocess.run([sys.executable, __file__, "--n", str(a.n), "--model", a.model, "--dtype", a.dtype,
                                  "--child", task, json.dumps(options), method], capture_output=True, text=True)
            if out.returncode:
                print(f"{label:<22}{method:<8} failed: {out.stderr.strip().splitlines()[-1]}")
                break
            r = json.loads(out.stdout.strip().splitlines()[-1])
            per = r["cpu"] / r["rows"]
            plain = per if method == "none" else plain
            print(f"{label:<22}{method:<8}{r['rows']:>5}{per:>11.2f}{r['wall'] / r['rows']:>12.2f}"
                  f"{per / plain:>10.1f}x{r['average']:>9.3f}")


if __name__ == "__main__":
    main()
