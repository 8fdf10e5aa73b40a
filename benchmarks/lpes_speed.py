"""LPES benchmarks: (a) per-example inference time of every method on the same prompts, as ratios
to the unmodified model (LPES paper, Table 5: LPES 1.00x, Ms-PoE 1.45x, MoICE 2.42x, Buckets 4.8x;
target here LPES <= 1.02x); (b) the search's cost: fitness evaluations per minute, cache hit rate
and wall time of a finished search (read from its factors.json), and one fitness evaluation timed beside the
raw-forward floor of its rows (benchmarks/floor.py: one forward over their unique tokens, teacher-forced tasks).

    python benchmarks/lpes_speed.py [--factors runs/lpes/factors.json] [--search-dir runs/lpes]
                                    [--moice runs/moice] [--n 16] [--rounds 3] [--max-new-tokens 8]

Per-example time = greedy generation of one prompt at a time (batch 1, KV cache, up to
--max-new-tokens tokens; no early stop so every method decodes the same number of tokens), the
setting of the paper's Table 5. Methods run interleaved round by round (none, lpes, pi, mspoe,
buckets, moice, none, ...) so machine noise hits all alike; the median over rounds is reported.
Entering a method (precomputing its cos/sin tables) happens once per sweep and is timed apart.
MoICE uses trained routers with --moice DIR; without it, seeded untrained routers of the same shape
(its cost does not depend on the router values; the script says so when it does this).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from posbias import get_method, get_task, load_model
from posbias.measure import Scorer, dtype_note


def generate_each(model, rows, max_new: int) -> float:
    """Seconds per example: batch-1 greedy generation of exactly max_new tokens."""
    t0 = time.perf_counter()
    for r in rows:
        ids = torch.tensor([r.prompt_ids])
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                       min_new_tokens=max_new, do_sample=False, pad_token_id=0)
    return (time.perf_counter() - t0) / len(rows)


def seeded_routers(loaded) -> str:
    """A folder with seeded, untrained MoICE routers for the model (latency does not depend on their values)."""
    from posbias.models.moice import Routers

    d = tempfile.mkdtemp(prefix="moice-seeded-")
    Routers.for_model(loaded.model, seed=0).save(f"{d}/routers.safetensors")
    print(f"moice: no --moice DIR given, so seeded untrained routers ({d}); latency does not depend on router values")
    return d


def inference(a, loaded) -> None:
    task = get_task(a.task)
    rows = Scorer(loaded, task).rows(task.examples(a.n, 0, 5000), [task.n_slots // 2])
    n_layers = loaded.model.config.num_hidden_layers
    ramp = ",".join(f"{1 + 0.3 * h / (n_layers - 1):.4f}" for h in range(n_layers))
    lpes = f"lpes:{a.factors}" if a.factors else f"layers:{ramp}"
    specs = {"none": "none", "lpes": lpes, "pi": f"pi:{a.factors}" if a.factors else "pi:1.15", "mspoe": "mspoe",
             "buckets": "buckets", "moice": f"moice:{a.moice or seeded_routers(loaded)}"}
    methods = {k: get_method(v) for k, v in specs.items()}
    times: dict[str, list[float]] = {k: [] for k in specs}
    enter: dict[str, float] = {}
    with torch.inference_mode():
        generate_each(loaded.model, rows[:2], a.max_new_tokens)  # warm-up
        for _ in range(a.rounds):
            for k, m in methods.items():
                t0 = time.perf_counter()
                with m.apply(loaded):
                    enter[k] = time.perf_counter() - t0
                    times[k].append(generate_each(loaded.model, rows, a.max_new_tokens))
    base = statistics.median(times["none"])
    mean_len = sum(len(r.prompt_ids) for r in rows) / len(rows)
    print(f"(a) per-example inference, {a.n} {a.task} prompts (~{mean_len:.0f} tokens), batch 1, "
          f"{a.max_new_tokens} new tokens, median of {a.rounds} interleaved rounds, {torch.get_num_threads()} threads")
    print(f"    {'method':<9} {'s/example':>10} {'ratio':>7} {'enter s':>8}   spec")
    for k in specs:
        med = statistics.median(times[k])
        print(f"    {k:<9} {med:>10.4f} {med / base:>6.3f}x {enter[k]:>8.4f}   {specs[k][:60]}")
    print("    paper (Table 5, Vicuna-7B, H100): LPES 1.00x, Ms-PoE 1.45x, MoICE 2.42x, Buckets 4.76x; target LPES <= 1.02x")


def search_cost(a, loaded) -> None:
    from floor import raw_forward, unique_tokens

    from posbias.lpes import SearchConfig
    from posbias.mitigate.lpes import build_fitness, make_space

    cfg = SearchConfig.from_preset("cpu", task=a.task)
    space = make_space(cfg, loaded.model.config.num_hidden_layers)
    fit = build_fitness(cfg, loaded, get_task(a.task), space)
    t0, c0 = time.perf_counter(), time.process_time()
    fit([space.initial()])
    one, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"(b) one fitness evaluation (cpu preset: {cfg.n} examples x 3 positions = {len(fit.rows)} rows): {one:.1f} s "
          f"wall, {cpu:.1f} CPU s")
    if fit.scorer.engine.name == "teacher-forced":  # a generation floor would need the generated tokens
        # the raw-forward floor of the same rows (benchmarks/floor.py): what any engine on this torch build must spend
        tree, read, length = unique_tokens(fit.rows, "teacher-forced")
        c0 = time.process_time()
        raw_forward(loaded.model, tree, length)
        floor_cpu = time.process_time() - c0
        print(f"    floor: {len(tree):,} unique tokens of {read:,} read, one raw forward over them in "
              f"sequences of {length}: {floor_cpu:.1f} CPU s; the evaluation costs {cpu / floor_cpu:.2f}x that")
    if a.search_dir:
        rec = json.loads((Path(a.search_dir) / "factors.json").read_text())
        h = rec["history"][-1]
        asked = h["evaluations"] + h["cache_hits"]
        wall = sum(e["wall_s"] for e in rec["history"])
        print(f"    finished search {a.search_dir}: {rec['evaluations']} evaluations, {h['cache_hits']} cache hits "
              f"({h['cache_hits'] / max(asked, 1):.1%} of {asked} asked), wall {wall / 60:.1f} min in the GA "
              f"({rec['seconds_this_call'] / 60:.1f} min this call), {rec['evaluations'] / (wall / 60):.1f} evaluations/min")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="kv-lookup")
    ap.add_argument("--factors", help="a factors.json for LPES and PI (default: a synthetic 1.0 -> 1.3 ramp)")
    ap.add_argument("--search-dir", help="a finished `posbias lpes search` directory to report the cost of")
    ap.add_argument("--moice", help="a `posbias moice train` folder (default: seeded untrained routers)")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--skip-search", action="store_true")
    a = ap.parse_args()
    loaded = load_model(a.model, "auto", "cpu")  # bf16 on a CPU with native bf16, else fp32
    print(f"dtype {dtype_note('auto', 'cpu')}")
    inference(a, loaded)
    if not a.skip_search:
        search_cost(a, loaded)


if __name__ == "__main__":
    main()
