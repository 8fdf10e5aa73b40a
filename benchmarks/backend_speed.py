"""The same rows through every backend, both protocols, in one run: hf plain, hf prefix-shared, vLLM's offline
engine and vLLM's OpenAI-compatible server (posbias's openai backend on 127.0.0.1).

Run it from the vLLM venv (make vllm-env), which holds posbias too; it exports SmolLM2 to a model directory first:

    .venv-vllm/bin/python benchmarks/backend_speed.py [--n 10] [--cores 1] [--skip hf,vllm,server]

Rows: kv-lookup (10 facts) x every slot x `--n` examples, the same token ids on every path. Per path and protocol:
engine start (load / spawn until the first request can go), wall time of the scoring, rows/s and prompt tokens/s
(each row's prompt + answer tokens, counted once, over the wall time), and the verdict agreement with hf plain.

Cores. vLLM's CPU build binds its worker to the compute cores and, by default, reserves one core for its front
end (`VLLM_CPU_NUM_OF_RESERVED_CPU`, "reserve_cpu_num" in its log). `--cores 1`: vLLM computes on one core (one
reserved), hf runs with one torch thread: equal compute cores. `--cores 2`: VLLM_CPU_NUM_OF_RESERVED_CPU=0 (both
cores compute; the front end shares them), hf with two threads. The server path sends `--batch` token prompts per
request (default 8), `--concurrency` requests in flight (64). Targets: openai server >= 0.9 x vLLM offline
throughput; hf >= 1.0 x vLLM offline on equal cores, both protocols.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def score(name: str, backend, task, n: int, engine: str, prefix: bool = True) -> dict:
    from posbias.measure import Scorer

    scorer = Scorer(backend, task, engine, prefix_sharing=prefix)
    rows = scorer.rows(task.examples(n, 0, 0), task.placements("all"))
    tokens = sum(len(r.prompt_ids) + len(r.answer_ids[0]) for r in rows)
    t0 = time.perf_counter()
    res = scorer.score(rows)
    wall = time.perf_counter() - t0
    return {"path": name, "engine": engine, "rows": len(rows), "wall_s": wall, "rows_per_s": len(rows) / wall,
            "tokens_per_s": tokens / wall, "verdicts": {(r["example_id"], r["position"]): r["correct"] for r in res}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--cores", type=int, default=1, choices=(1, 2))
    ap.add_argument("--skip", default="")
    ap.add_argument("--concurrency", type=int, default=64, help="the server path's requests in flight")
    ap.add_argument("--batch", type=int, default=8, help="the server path's prompts per request")
    ap.add_argument("--model-dir", default=None, help="an exported model directory (default: export SmolLM2 now)")
    a = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # vLLM's worker processes must not inherit (and repeat) buffered lines
    skip = set(filter(None, a.skip.split(",")))
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "1" if a.cores == 1 else "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch

    from posbias import get_task, load_model, open_backend
    from posbias.measure import export_model

    torch.set_num_threads(a.cores)
    task = get_task("kv-lookup")
    model_dir = Path(a.model_dir) if a.model_dir else export_model("smollm2-135m", Path(tempfile.mkdtemp()) / "smollm2")
    results, starts = [], {}
    engines = ("teacher-forced", "generate")
    if "hf" not in skip:
        t0 = time.perf_counter()
        loaded = load_model(str(model_dir), "bf16", progress=False)
        starts["hf"] = time.perf_counter() - t0
        for e in engines:
            results.append(score("hf plain", loaded, task, a.n, e, prefix=False))
            results.append(score("hf prefix-shared", loaded, task, a.n, e))
        del loaded
    if "vllm" not in skip:
        t0 = time.perf_counter()
        be = open_backend(f"vllm:{model_dir},max_model_len=2048", "bf16")
        starts["vllm offline"] = time.perf_counter() - t0
        for e in engines:
            results.append(score("vllm offline", be, task, a.n, e))
        be.close()
        del be
    if "server" not in skip:
        from served import NAME, start_server, stop

        t0 = time.perf_counter()
        proc, url = start_server(model_dir, Path(tempfile.mkdtemp()) / "vllm.log")
        be = open_backend(f"openai:model={NAME},base_url={url},tokenizer={model_dir},concurrency={a.concurrency},"
                          f"batch={a.batch}")
        starts["vllm server"] = time.perf_counter() - t0
        try:
            for e in engines:
                results.append(score("vllm server", be, task, a.n, e))
            # request order and batching: the same rows one request at a time, against `concurrency` in flight
            one = open_backend(f"openai:model={NAME},base_url={url},tokenizer={model_dir},concurrency=1")
            for e in engines:
                results.append(score("vllm server, 1 in flight", one, task, a.n, e))
        finally:
            stop(proc)
    report(results, starts, a)


def report(results: list[dict], starts: dict, a) -> None:
    print(f"kv-lookup, 10 facts, every slot x {a.n} examples; compute cores {a.cores} "
          f"(VLLM_CPU_NUM_OF_RESERVED_CPU={os.environ['VLLM_CPU_NUM_OF_RESERVED_CPU']}, hf torch threads {a.cores})")
    print(f"{'path':26s} {'protocol':15s} {'start s':>8s} {'wall s':>8s} {'rows/s':>8s} {'tok/s':>8s} {'agree':>7s}")
    ref = {r["engine"]: r["verdicts"] for r in results if r["path"] == "hf plain"}
    for r in results:
        base = ref.get(r["engine"])
        agree = (sum(r["verdicts"][k] == v for k, v in base.items()) / len(base)) if base else float("nan")
        start = starts.get(r["path"].split(" prefix")[0].replace(" plain", ""), float("nan"))
        print(f"{r['path']:26s} {r['engine']:15s} {start:8.1f} {r['wall_s']:8.1f} {r['rows_per_s']:8.2f} "
              f"{r['tokens_per_s']:8.0f} {agree:7.3f}")
    for e in ("teacher-forced", "generate"):
        x = next((r for r in results if r["path"] == "vllm server" and r["engine"] == e), None)
        y = next((r for r in results if r["path"] == "vllm server, 1 in flight" and r["engine"] == e), None)
        if x and y:
            flips = sum(x["verdicts"][k] != y["verdicts"][k] for k in x["verdicts"])
            print(f"{e}: {a.concurrency} requests of {a.batch} vs 1 request of 1 in flight: {flips} of "
                  f"{len(x['verdicts'])} verdicts differ")
    by = {(r["path"], r["engine"]): r["tokens_per_s"] for r in results}
    for e in ("teacher-forced", "generate"):
        off = by.get(("vllm offline", e))
        if not off:
            continue
        for path, target in (("vllm server", 0.9), ("hf plain", 1.0), ("hf prefix-shared", 1.0)):
            if (path, e) in by:
                ratio = by[(path, e)] / off
                print(f"{e}: {path} / vllm offline = {ratio:.2f}x (target >= {target}x) "
                      f"{'met' if ratio >= target else 'NOT met'}")


if __name__ == "__main__":  # vLLM spawns its workers: the guard is required
    main()
