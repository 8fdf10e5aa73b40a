"""Sweep-harness speed on SmolLM2-135M, kv-lookup (10 facts, 5 positions x 40 examples).

Prints, from one run: raw batched forward throughput on the very token batches the
harness builds, the harness's teacher-forced throughput (tokenising, batching and
scoring included), a naive per-example `generate` loop, and the verdict agreement
between teacher forcing and generation.

    python benchmarks/sweep_speed.py [--model smollm2-135m] [--n 40] [--dtype auto]

Targets (issue 2): harness >= 0.8 x raw, >= 5 x faster than the naive loop,
teacher-forced/generate agreement >= 97%.

Then, prefix sharing (issue 17), per setting (`--settings kv10,kv30,nq10`: kv-lookup with 10 / 30 facts, nq
with 10 documents), every slot of `--prefix-n` examples, on the same rows: the raw forward of the plain path's
sequences, the plain harness (`prefix_sharing=False`), the prefix-shared harness, and the unique-token ideal
(all prompt tokens / the tokens of each example's prefix tree); target: speed-up >= 0.8 x ideal.
`--skip-legacy` prints only this part.

    python benchmarks/sweep_speed.py --skip-legacy --settings kv10,kv30,nq10 --prefix-n 5
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from floor import needed, raw_forward, tree_token_ids  # benchmarks/floor.py, beside this script

from posbias import get_task, load_model
from posbias.core.metrics import METRICS
from posbias.measure import Scorer
from posbias.scoring.encode import left_pad, plan_batches
from posbias.scoring.generate import _newline_ids, _StopAtNewline, eos_ids
from posbias.scoring.prefix import unique_ratio

SETTINGS = {"kv10": ("kv-lookup", {"facts": 10}), "kv30": ("kv-lookup", {"facts": 30}), "nq10": ("nq", {"docs": 10})}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # CUDA kernels run asynchronously: time what has finished


def best_of(fn, repeats: int):
    """(fastest wall time of `repeats` calls, the last result)."""
    times = []
    for _ in range(repeats):
        _sync()
        t = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - t)
    return min(times), out


def prefix_setting(loaded, name: str, n: int, engine: str, repeats: int, batch_tokens: int, max_batch: int) -> dict:
    """One setting: raw forward, plain harness, prefix-shared harness and the unique-token ideal on the same rows."""
    task_name, opts = SETTINGS[name]
    task = get_task(task_name, **opts)
    plain, shared = (Scorer(loaded, task, engine, batch_tokens=batch_tokens, max_batch=max_batch, prefix_sharing=ps)
                     for ps in (False, True))
    rows = plain.rows(task.examples(n, seed=0), list(range(task.n_slots)))
    seqs = [r.prompt_ids + a for r in rows for a in (r.answer_ids if engine == "teacher-forced" else [[]])]
    lengths = [len(q) for q in seqs]
    pad = loaded.tokenizer.pad_token_id
    dev = next(loaded.model.parameters()).device
    batches = [{k: v.to(dev) for k, v in left_pad([seqs[i] for i in b], pad).items()}
               for b in plan_batches(lengths, plain.batch_tokens, plain.max_batch)]

    @torch.inference_mode()
    def raw():
        for b in batches:
            loaded.model(**b, use_cache=False, logits_to_keep=1)

    raw()  # warm-up (CUDA kernels, allocator)
    t_raw, _ = best_of(raw, repeats)
    t_plain, p_rows = best_of(lambda: plain.score(rows), repeats)
    t_shared, s_rows = best_of(lambda: shared.score(rows), repeats)
    total, unique = unique_ratio(rows)
    # the raw-forward floor (benchmarks/floor.py): one plain forward over the unique tokens these rows need
    gen = [r["prediction"] for r in s_rows] if engine == "generate" else None
    tokens = tree_token_ids(needed(rows, engine, gen, loaded.tokenizer))
    length = round(sum(len(r.prompt_ids) for r in rows) / len(rows))
    t_floor, _ = best_of(lambda: raw_forward(loaded.model, tokens, length), repeats)
    verdict = {(r["example_id"], r["position"]): r["correct"] for r in p_rows}
    agree = sum(verdict[(r["example_id"], r["position"])] == r["correct"] for r in s_rows) / len(s_rows)
    return {"setting": name, "rows": len(rows), "tokens": sum(lengths), "prompt": total, "unique": unique,
            "raw": t_raw, "plain": t_plain, "shared": t_shared, "agree": agree, "floor": t_floor,
            "floor_tokens": len(tokens)}


PREFIX_HEAD = (f"{'setting':8s} {'rows':>5s} {'tokens':>7s} {'raw s':>7s} {'plain s':>8s} {'shared s':>8s} "
               f"{'raw tok/s':>10s} {'plain tok/s':>11s} {'shared tok/s':>12s} {'plain/raw':>9s} {'speed-up':>8s} "
               f"{'ideal':>6s} {'of ideal':>8s} {'agree':>6s} {'floor s':>8s} {'plain/floor':>11s} {'shared/floor':>12s}")


def print_prefix_row(r: dict) -> None:
    """One setting's line, printed as soon as it is measured (a later setting that fails loses nothing)."""
    up, ideal, n = r["plain"] / r["shared"], r["prompt"] / r["unique"], r["tokens"]
    print(f"{r['setting']:8s} {r['rows']:5d} {n:7d} {r['raw']:7.2f} {r['plain']:8.2f} {r['shared']:8.2f} "
          f"{n / r['raw']:10.0f} {n / r['plain']:11.0f} {n / r['shared']:12.0f} "
          f"{r['raw'] / r['plain']:8.2f}x {up:7.2f}x {ideal:5.2f}x {up / ideal:7.0%} {r['agree']:6.1%} "
          f"{r['floor']:8.2f} {r['plain'] / r['floor']:10.2f}x {r['shared'] / r['floor']:11.2f}x", flush=True)


def cpu_name() -> str:
    """The CPU model and the bf16 matrix units it has: bf16 throughput, and so every ratio against the per-call
    overhead of a naive loop, depends on them (AMX-BF16 runs bf16 matmuls several times faster than AVX-512-BF16)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((x.split(":", 1)[1].strip() for x in info.splitlines() if x.startswith("model name")), "cpu")
    flags = set(next((x.split(":", 1)[1].split() for x in info.splitlines() if x.startswith("flags")), []))
    units = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({', '.join(units) or 'no bf16 units'})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--positions", default="0,2,5,7,9")
    ap.add_argument("--dtype", default="auto", help="auto (default: bf16 on a CPU with native bf16, else fp32) | bf16 | fp32")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compare-fp32", action="store_true", help="also time the raw forward in fp32")
    ap.add_argument("--settings", default="kv10,kv30,nq10", help="prefix-sharing settings: kv10,kv30,nq10 (empty: none)")
    ap.add_argument("--prefix-n", type=int, default=5, help="examples per prefix-sharing setting (every slot)")
    ap.add_argument("--prefix-engine", default="teacher-forced")
    ap.add_argument("--skip-legacy", action="store_true", help="only the prefix-sharing part")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto (the model's device)")
    ap.add_argument("--batch-tokens", type=int, default=16384, help="prefix part: padded tokens per batch")
    ap.add_argument("--max-batch", type=int, default=32, help="prefix part: rows per batch at most")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("POSBIAS_THREADS", "0")) or None,
                    help="torch threads (default: $POSBIAS_THREADS, else torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    loaded = load_model(a.model, a.dtype, a.device)
    a.dtype = loaded.info["dtype"]  # what auto took: the figures below name it
    dev = next(loaded.model.parameters()).device
    print(f"device: {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else cpu_name()}")
    if not a.skip_legacy:
        legacy(a, loaded)
    names = [x for x in a.settings.split(",") if x]
    if names:
        print(f"model {a.model} ({a.dtype}), threads {torch.get_num_threads()}, {a.prefix_n} examples x every slot, "
              f"batch_tokens {a.batch_tokens}, max_batch {a.max_batch}")
        print(f"\nprefix sharing ({a.prefix_engine}): seconds (best of repeats); tokens/s: the plain path's tokens "
              "(prompt + answer, every row) per second in each column; ideal = prompt tokens / unique prefix-tree tokens")
        print(PREFIX_HEAD)
        for x in names:
            print_prefix_row(prefix_setting(loaded, x, a.prefix_n, a.prefix_engine, a.repeats, a.batch_tokens,
                                            a.max_batch))
        print("target: speed-up >= 80% of the ideal on every setting; plain/raw: the plain harness's share of raw speed; "
              "floor: one raw forward over the unique tokens the rows need (benchmarks/floor.py), the least any engine "
              "on this torch build spends; plain/floor, shared/floor: each path's seconds over it")


def legacy(a, loaded) -> None:
    """The issue-2 comparison: raw forward, harness, batched generate and a naive generate loop (kv-lookup 10)."""
    model, tok = loaded.model, loaded.tokenizer
    task = get_task("kv-lookup", facts=10)
    positions = [int(p) for p in a.positions.split(",")]
    examples = task.examples(a.n, seed=0)
    scorer = Scorer(loaded, task, "teacher-forced")
    print(f"model {a.model} ({a.dtype}), threads {torch.get_num_threads()}, "
          f"{len(examples)} examples x {len(positions)} positions")

    def harness():
        rows = scorer.rows(examples, positions)
        return rows, scorer.score(rows)

    rows, _ = harness()  # warm-up (also gives the rows for the raw baseline)
    lengths = [len(r.prompt_ids) + len(r.answer_ids[0]) for r in rows]
    dev = next(model.parameters()).device
    batches = [{k: v.to(dev) for k, v in left_pad([rows[i].prompt_ids + rows[i].answer_ids[0] for i in b],
                                                   tok.pad_token_id).items()}
               for b in plan_batches(lengths, 16384, 32)]
    n_tokens = sum(lengths)

    @torch.inference_mode()
    def raw(**kw):
        for b in batches:
            model(**b, use_cache=False, **kw)

    def timed(fn):
        return best_of(fn, a.repeats)

    t_raw_full, _ = timed(raw)
    t_raw_last, _ = timed(lambda: raw(logits_to_keep=1))
    t_harness, (_, tf_rows) = timed(harness)

    # the harness's batched generate engine
    generate = Scorer(loaded, task, "generate")
    t_gen, gen_rows = timed(lambda: generate.score(rows))

    # naive loop: one example at a time through model.generate
    from transformers import GenerationConfig, StoppingCriteriaList

    cfg = GenerationConfig(max_new_tokens=task.max_new_tokens, do_sample=False,
                           eos_token_id=eos_ids(model, tok), pad_token_id=tok.pad_token_id)
    stop = StoppingCriteriaList([_StopAtNewline(_newline_ids(tok), dev)])
    naive = {}
    t = time.perf_counter()
    with torch.inference_mode():
        for r in rows:
            ids = torch.tensor([r.prompt_ids], device=dev)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=cfg,
                                 stopping_criteria=stop)
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("\n")[0]
            naive[r.key] = METRICS[task.metric](text, r.prompt.answers)
    t_naive = time.perf_counter() - t

    tf = {(x["example_id"], x["position"]): x["correct"] for x in tf_rows}
    gen = {(x["example_id"], x["position"]): x["correct"] for x in gen_rows}
    agree_gen = sum(tf[k] == gen[k] for k in tf) / len(tf)
    agree_naive = sum(tf[k] == naive[k] for k in tf) / len(tf)
    acc = {p: sum(tf[(e.id, p)] for e in examples) / len(examples) for p in positions}

    print(f"\n{'what':44s} {'seconds':>8s} {'tokens/s':>9s} {'ratio':>7s}")
    print(f"{'raw forward, full logits':44s} {t_raw_full:8.2f} {n_tokens / t_raw_full:9.0f} {'':>7s}")
    print(f"{'raw forward, logits of last token only':44s} {t_raw_last:8.2f} {n_tokens / t_raw_last:9.0f} {'':>7s}")
    print(f"{'harness teacher-forced (tokenise+score)':44s} {t_harness:8.2f} {n_tokens / t_harness:9.0f} "
          f"{t_raw_last / t_harness:6.2f}x")
    print(f"{'harness batched generate':44s} {t_gen:8.2f} {'':>9s} {t_gen / t_harness:6.2f}x")
    print(f"{'naive per-example generate loop':44s} {t_naive:8.2f} {'':>9s} {t_naive / t_harness:6.2f}x")
    print("\nratio column: harness/raw(last-token) throughput; generate rows: time / harness time")
    print(f"harness vs raw (full logits):       {t_raw_full / t_harness:.2f}x  (target >= 0.8)")
    print(f"harness vs raw (last-token logits): {t_raw_last / t_harness:.2f}x  (target >= 0.8)")
    print(f"speed-up over naive generate loop:  {t_naive / t_harness:.1f}x  (target >= 5)")
    print(f"agreement teacher-forced vs batched generate: {agree_gen:.1%} ({len(tf)} rows)  (target >= 97%)")
    print(f"agreement teacher-forced vs naive generate:   {agree_naive:.1%}")
    print("accuracy by position (teacher-forced): " + ", ".join(f"{p}: {v:.2f}" for p, v in acc.items()))

    if a.compare_fp32:
        model = load_model(a.model, "fp32", a.device).model
        t_fp32, _ = timed(lambda: raw(logits_to_keep=1))
        print(f"raw forward (last-token logits) fp32: {n_tokens / t_fp32:.0f} tokens/s; "
              f"{a.dtype}: {n_tokens / t_raw_last:.0f} tokens/s ({t_fp32 / t_raw_last:.1f}x)")


if __name__ == "__main__":
    main()
