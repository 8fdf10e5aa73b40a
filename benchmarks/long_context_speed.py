"""Long-context sweep cost: task niah (a needle at depth percents of a haystack of `tokens` model tokens) scored on
the plain path (prefix_sharing=False) and the prefix-shared path, against the unique-token ideal, in CPU seconds.

    python benchmarks/long_context_speed.py [--lengths 2k,4k,8k] [--depths linear:5] [--n 2] [--threads 2]
                                            [--model smollm2-135m] [--paths plain,shared] [--tensor-peak]

Per length L (1k = 1024 tokens) and per path, one cold subprocess (this file with --child) loads the model, sets
`--threads` torch threads and runs `posbias.run_sweep(SweepConfig(task="niah", task_options={"tokens": L},
positions=<depths>, n=N, prefix_sharing=...), out=None, loaded=<the model>)` once, nothing warmed up. Rows: N
examples x every depth; all depths of an example share the haystack up to the needle.

  wall s, CPU s   the child's perf_counter and process_time around run_sweep only (the model already loaded)
  CPU s/row       that CPU over the rows
  child CPU       the whole child (interpreter start and model load included): this process's
                  getrusage(RUSAGE_CHILDREN) user + system, before and after it (with --tensor-peak, the
                  profiled second sweep too)
  RSS MiB         the child's peak resident set (getrusage(RUSAGE_SELF).ru_maxrss), taken before any
                  --tensor-peak run: the weights (as far as their pages were touched), torch's tensors at their
                  peak, and what the C allocator keeps mapped after tensors are freed (glibc's heap retains freed
                  chunks below its adaptive mmap threshold), so it moves with the order and sizes of allocations:
                  +93 to +450 MiB at 8K between two commits whose tensors peak 36 MiB apart (docs/long-context.md)
  tensor MiB      with --tensor-peak: the peak of torch's live CPU tensors during the sweep, weights excluded (the
                  sweep run once more, after the timed run, under torch.profiler with profile_memory; the peak
                  of its allocation events' running total); the same figure for the same code and rows (512 tokens,
                  shared: 135 MiB as a process's first sweep and as its second)
  ideal s/row     plain CPU s/row x tree_tokens / total tokens of the same rows' prompts (posbias.scoring.prefix.
                  tree_tokens: the prefix tree's tokens, what a perfectly shared computation runs); the rows are
                  built here once more, after the timed children, with posbias's Scorer
  exact s/row     plain CPU s/row x the tree's exact share (ideal_tokens: the prefix tree's tokens through plain
                  forwards, each at its own context length, over the rows' prompts computed whole): the token
                  share counts every token alike, but sharing saves a prompt's first tokens, the cheapest to
                  attend from, so where attention weighs (long prompts) the exact share is the larger; at 1K
                  a forward's fixed cost and one timing per forward can put it below (measured: 0.787 against
                  0.815, 3 rows)
  x ideal, x exact   CPU s/row over the ideal's and the exact tree's

Figures go in docs/long-context.md, with the command and the machine line this prints.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

PATHS = {"plain": False, "shared": True}


def depths(spec: str) -> list[str]:
    """Depth percents as the sweep's positions take them: "0%", "25%", ..."""
    from posbias.eval.longctx import depth_spacing

    pts = depth_spacing(spec) or [x.strip() for x in spec.split(",") if x.strip()]
    return [p if p.endswith("%") else f"{p}%" for p in pts]


def child(a) -> None:
    """One cold path: load, run the sweep once, print one JSON line."""
    import torch

    import posbias

    torch.set_num_threads(a.threads)
    loaded = posbias.load_model(a.model, a.dtype, "cpu", progress=False)
    cfg = posbias.SweepConfig(task="niah", task_options={"tokens": a.length}, model=a.model,
                              positions=",".join(depths(a.depths)), n=a.n, prefix_sharing=PATHS[a.child])
    w0, c0 = time.perf_counter(), time.process_time()
    res = posbias.run_sweep(cfg, out=None, loaded=loaded, progress=False)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rows = res.rows
    print(json.dumps({"rows": len(rows), "wall": wall, "cpu": cpu,
                      "prompt_tokens": sum(r["prompt_tokens"] for r in rows) / len(rows),
                      "correct": sum(bool(r["correct"]) for r in rows),
                      "path": res.config.get("scoring_path"), "note": res.config.get("scoring_note"),
                      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "tensor_mib": tensor_peak(lambda: posbias.run_sweep(cfg, out=None, loaded=loaded, progress=False))
                      if a.tensor_peak else None}))


def tensor_peak(fn) -> float:
    """MiB: the peak of torch's live CPU tensors allocated while fn() runs. Each allocation event of the profiler
    carries the allocator's running total (alloc_size < 0 for a free); the total counts only what was allocated and
    freed under a profiler, so the peak is taken against the total just before fn's first allocation."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if hasattr(node.extra_fields, "total_allocated"):  # allocation events only
            events.append((node.start_time_ns, node.extra_fields.total_allocated, node.extra_fields.alloc_size))
        stack.extend(node.children)
    if not events:
        return 0.0
    events.sort()
    base = events[0][1] - events[0][2]
    return max(0, max(total for _, total, _ in events) - base) / 2**20


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(a, path: str, L: int) -> dict:
    """Start one path cold in its own process; its JSON plus the whole child's CPU seconds."""
    cmd = [sys.executable, __file__, "--child", path, "--length", str(L), "--depths", a.depths, "--n", str(a.n),
           "--model", a.model, "--threads", str(a.threads), "--dtype", a.dtype] + (["--tensor-peak"] * a.tensor_peak)
    c0 = children_cpu()
    p = subprocess.run(cmd, capture_output=True, text=True)
    whole = children_cpu() - c0
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"{path} at {L} tokens failed (exit {p.returncode}): {' '.join(cmd)}")
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    if rec["path"] != ("prefix-shared" if PATHS[path] else "plain"):
        print(f"  note: {path} at {L} tokens ran the {rec['path']} path ({rec['note']})")
    print(f"  {L} tokens, {path}: {rec['rows']} rows, wall {rec['wall']:.1f} s, CPU {rec['cpu']:.1f} s "
          f"(whole child {whole:.1f} s)", flush=True)
    return {**rec, "child_cpu": whole}


def ideal_tokens(a, lengths: list[int]) -> dict[int, tuple[int, int, int, float]]:
    """Per length: (rows, total prompt tokens, prefix-tree tokens, the tree's exact share) of the rows the sweeps
    score.

    The exact tree cost counts what the token share leaves out: a branch token attends to every token before it, so
    the tokens sharing saves (a prompt's first ones) are its cheapest. It is measured with plain forwards (batch 1,
    no cache, the last logits; one untimed warm-up): f(n) = the CPU s of a forward over the first n tokens; the tree
    costs f(each spine) + sum over rows of f(prompt) - f(p_r), p_r the spine tokens row r reuses
    (posbias.scoring.prefix.shares_of), i.e. each branch token's own matmuls and attention and nothing else; its
    exact share is that over sum of f(prompt), the same rows' prompts computed whole. The exact ideal is the plain
    path's measured CPU s/row times that share, as the token ideal is times the token share."""
    import torch

    import posbias
    from posbias.scoring.prefix import shares_of, tree_tokens
    from posbias.scoring.scorer import Scorer

    torch.set_num_threads(a.threads)
    loaded = posbias.load_model(a.model, a.dtype, "cpu", progress=False)
    model = loaded.model

    @torch.inference_mode()
    def f(ids: list[int]) -> float:
        if not ids:
            return 0.0
        x = torch.tensor([ids])
        c0 = time.process_time()
        model(input_ids=x, logits_to_keep=1)
        return time.process_time() - c0

    out = {}
    for L in lengths:
        task = posbias.get_task("niah", tokens=L)
        rows = Scorer(loaded, task).rows(task.examples(a.n, 0), task.placements(",".join(depths(a.depths))))
        seqs = [r.prompt_ids for r in rows]
        f(seqs[0][:64])  # warm-up
        tree, whole = 0.0, 0.0
        for share in shares_of(rows):
            tree += f(share.spine)
            for i, p in zip(share.rows, share.plen):
                full = f(seqs[i])
                whole += full
                tree += max(0.0, full - f(seqs[i][:p]))
        out[L] = (len(seqs), sum(map(len, seqs)), tree_tokens(seqs), tree / whole)
    return out


HEAD = (f"{'length':>6} {'path':>8} {'rows':>4} {'mean tok':>8} {'wall s':>7} {'CPU s':>7} {'CPU s/row':>9} "
        f"{'x ideal':>7} {'x exact':>7} {'child CPU':>9} {'RSS MiB':>7} {'tensor MiB':>10}")


def lines(L: int, res: dict, tok: tuple[int, int, int, float]) -> list[str]:
    """One line per path, then the unique-token ideal (plain CPU s/row x prefix-tree tokens / all tokens) and the
    exact tree (ideal_tokens)."""
    n, total, tree, share = tok
    per_row = {p: r["cpu"] / r["rows"] for p, r in res.items()}
    if "plain" not in per_row:
        ideal = exact = None
    else:
        ideal, exact = per_row["plain"] * tree / total, per_row["plain"] * share

    def x(v: float, by: float | None) -> str:
        return f"{v / by:7.2f}" if by else f"{'-':>7}"

    out = []
    for p, r in res.items():
        out.append(f"{L:6d} {p:>8} {r['rows']:4d} {r['prompt_tokens']:8.0f} {r['wall']:7.1f} {r['cpu']:7.1f} "
                   f"{per_row[p]:9.3f} {x(per_row[p], ideal)} {x(per_row[p], exact)} {r['child_cpu']:9.1f} "
                   f"{r['rss_mib']:7.0f} {'-' if r['tensor_mib'] is None else round(r['tensor_mib']):>10}")
    if ideal is not None:
        out.append(f"{L:6d} {'ideal':>8} {n:4d} {total / n:8.0f} {'':>7} {'':>7} {ideal:9.3f} {x(ideal, ideal)} "
                   f"{x(ideal, exact)} {'':>9} {'':>7}   (prefix tree {tree} of {total} tokens, {tree / total:.3f})")
        out.append(f"{L:6d} {'exact':>8} {n:4d} {total / n:8.0f} {'':>7} {'':>7} {exact:9.3f} {x(exact, ideal)} "
                   f"{x(exact, exact)} {'':>9} {'':>7}   (the tree's exact share {share:.3f}: plain forwards, each "
                   f"branch token at its own context length)")
    return out


def checks(L: int, res: dict, tok: tuple[int, int, int, float]) -> list[str]:
    """Notes where a child's rows are not the rows the ideal counts, or the paths' verdicts differ in number."""
    notes = []
    for p, r in res.items():
        if r["rows"] != tok[0] or abs(r["prompt_tokens"] - tok[1] / tok[0]) > 1e-6:
            notes.append(f"note: {L} tokens, {p}: {r['rows']} rows of mean {r['prompt_tokens']:.1f} tokens, the "
                         f"ideal counts {tok[0]} rows of mean {tok[1] / tok[0]:.1f}")
    if len({r["correct"] for r in res.values()}) > 1:
        notes.append(f"note: {L} tokens: correct rows differ by path: "
                     + ", ".join(f"{p} {r['correct']}" for p, r in res.items()))
    return notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="2k,4k,8k", help="prompt lengths in model tokens (1k = 1024)")
    ap.add_argument("--depths", default="linear:5", help="linear:N | sigmoid:N | a list of percents")
    ap.add_argument("--n", type=int, default=2, help="examples; rows = n x depths")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of every child")
    ap.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                    help="every path's dtype (default auto: bf16 on a CPU with native bf16, else fp32)")
    ap.add_argument("--paths", default="plain,shared", help="plain and/or shared")
    ap.add_argument("--tensor-peak", action="store_true",
                    help="each child runs its sweep once more under torch.profiler and reports torch's peak of live "
                         "tensors (tensor MiB; slower, after the timed run)")
    ap.add_argument("--child", choices=sorted(PATHS), help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    from posbias.eval.longctx import parse_size

    lengths, paths = [parse_size(x.strip()) for x in a.lengths.split(",")], [p.strip() for p in a.paths.split(",")]
    if bad := [p for p in paths if p not in PATHS]:
        raise SystemExit(f"unknown path(s) {bad}: use plain and/or shared")
    la0, t0 = os.getloadavg(), time.perf_counter()
    from posbias.measure import choose_dtype, cpu_kind

    a.dtype, why = choose_dtype(a.dtype, "cpu")  # resolved once: every child runs the same dtype
    print(f"CPU: {cpu_kind().describe()}; dtype {a.dtype} ({why})")
    print(f"niah, {a.model} {a.dtype} on the CPU, {a.threads} torch thread(s), {a.n} example(s) x depths "
          f"{','.join(depths(a.depths))}")
    res = {L: {p: run_child(a, p, L) for p in paths} for L in lengths}
    toks = ideal_tokens(a, lengths)
    la1 = os.getloadavg()
    print()
    print(HEAD)
    for L in lengths:
        print("\n".join(lines(L, res[L], toks[L])))
    for L in lengths:
        for note in checks(L, res[L], toks[L]):
            print(note)
    print("CPU s: the child's process_time around run_sweep (scoring only); child CPU: the whole child, model load "
          "included (RUSAGE_CHILDREN); ideal s/row = plain CPU s/row x tree/total (prefix-tree / all prompt tokens); "
          "exact s/row = plain CPU s/row x the tree's exact share (plain forwards in this process, after the children, "
          "warm: each branch token at its own context length, over the prompts computed whole)")
    print(f"every path started cold in its own process; machine: {os.cpu_count()} logical cores "
          f"({len(os.sched_getaffinity(0))} usable), load average (1/5/15 min) at start "
          f"{la0[0]:.2f} {la0[1]:.2f} {la0[2]:.2f}, at end {la1[0]:.2f} {la1[1]:.2f} {la1[2]:.2f}; "
          f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
