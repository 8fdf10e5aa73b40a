"""bf16 against fp32 by CPU kind: what `--dtype auto` (the default) decides, measured.

Two CPU kinds from one machine: this CPU as it is ("native"), and an AVX2-class CPU ("avx2"), made by capping oneDNN
and ATen at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2): the bf16 instructions are then not used, as on
a CPU without them, and fp32 runs the same AVX2 kernels such a CPU runs. On a machine without native bf16 both kinds
are the same. Every row is its own cold process (the de-quantized model cache on disk is warm: load seconds apart).

Prints, per kind: an F.linear micro-benchmark (one thread), then the default sweep's scoring (kv-lookup, every slot,
`--n` examples, prefix-shared, teacher-forced: `make sweep`'s rows) in bf16, fp32 and auto: CPU seconds (every thread
of the process) and wall seconds per row, the time to the first progress tick, the longest gap between ticks, the
ratio to fp32 and the verdicts equal to fp32's.

    python benchmarks/dtype_speed.py [--n 100] [--kinds native,avx2] [--dtypes bf16,fp32,auto] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def child(dtype: str, n: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    from posbias import get_task, load_model
    from posbias.measure import Scorer, cpu_kind

    torch.set_num_threads(1)
    mm = {}
    for m in (256, 512):
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            x, w = torch.randn(m, 576, dtype=dt), torch.randn(1536, 576, dtype=dt)
            for _ in range(3):
                F.linear(x, w)
            t = time.process_time()
            for _ in range(20):
                F.linear(x, w)
            mm[f"{name}_{m}"] = (time.process_time() - t) / 20 * 1000
    torch.set_num_threads(threads)
    t = time.perf_counter()
    lo = load_model("smollm2-135m", dtype=dtype, progress=False)
    load_s = time.perf_counter() - t
    task = get_task("kv-lookup")
    sc = Scorer(lo, task)
    rows = sc.rows(task.examples(n, 0, 0), task.placements("all"))
    ticks: list[tuple[float, float]] = []
    t0, c0 = time.perf_counter(), time.process_time()
    out = sc.score(rows, None, set(), lambda new: ticks.append((time.perf_counter() - t0, time.process_time() - c0)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    gaps = [b[0] - a[0] for a, b in zip([(0.0, 0.0)] + ticks, ticks)]
    verdicts = {f"{r['example_id']}@{r['position']}": bool(r["correct"]) for r in out}
    return {"cpu": cpu_kind().describe(), "dtype": lo.info["dtype"], "reason": lo.info["dtype_reason"], "load_s": load_s,
            "rows": len(rows), "wall": wall, "cpu_s": cpu, "first_tick": ticks[0][0], "max_gap": max(gaps),
            "ticks": len(ticks), "accuracy": sum(verdicts.values()) / len(verdicts), "verdicts": verdicts, "matmul_ms": mm}


def run(kind: str, dtype: str, n: int, threads: int) -> dict:
    env = {**os.environ, **(AVX2_ENV if kind == "avx2" else {})}
    for k in AVX2_ENV if kind == "native" else ():
        env.pop(k, None)
    p = subprocess.run([sys.executable, __file__, "--child", dtype, "--n", str(n), "--threads", str(threads)], env=env,
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{kind} {dtype} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--kinds", default="native,avx2")
    ap.add_argument("--dtypes", default="bf16,fp32,auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.n, a.threads)))
        return
    print(f"default sweep rows: kv-lookup, every slot x {a.n} examples, prefix-shared, teacher-forced; {a.threads} threads")
    for kind in a.kinds.split(","):
        res = {d: run(kind, d, a.n, a.threads) for d in a.dtypes.split(",")}
        first = next(iter(res.values()))
        mm = first["matmul_ms"]
        print(f"\n[{kind}] {first['cpu']}")
        print("  F.linear (x576 @ 576x1536, 1 thread): " + ", ".join(
            f"{m} rows fp32 {mm[f'fp32_{m}']:.2f} ms, bf16 {mm[f'bf16_{m}']:.2f} ms ({mm[f'bf16_{m}'] / mm[f'fp32_{m}']:.2f}x)"
            for m in (256, 512)))
        base = res.get("fp32")
        print(f"  {'dtype':<16} {'CPU s/row':>9} {'wall s/row':>10} {'CPU s':>7} {'wall s':>7} {'1st tick s':>10} "
              f"{'max gap s':>9} {'ticks':>5} {'vs fp32':>7} {'=fp32':>9} {'acc':>6}  load s")
        for d, r in res.items():
            ratio = f"{r['cpu_s'] / base['cpu_s']:.2f}x" if base else "-"
            same = (f"{sum(r['verdicts'][k] == v for k, v in base['verdicts'].items())}/{len(base['verdicts'])}"
                    if base else "-")
            label = f"{d} -> {r['dtype']}" if d == "auto" else d
            print(f"  {label:<16} {r['cpu_s'] / r['rows']:>9.3f} {r['wall'] / r['rows']:>10.3f} {r['cpu_s']:>7.1f} "
                  f"{r['wall']:>7.1f} {r['first_tick']:>10.1f} {r['max_gap']:>9.1f} {r['ticks']:>5} {ratio:>7} {same:>9} "
                  f"{r['accuracy']:>6.3f}  {r['load_s']:.1f}")
        if "auto" in res:
            print(f"  auto: {res['auto']['reason']}")


if __name__ == "__main__":
    main()
