"""How often prefix sharing changes a verdict on bf16, against how often bf16 changes verdicts by itself.

Scores every slot of `--n` examples (kv-lookup, 10 facts by default) three ways on the same rows:

    plain      the plain path, default batches (rows of several examples share a batch: left padding)
    alone      the plain path, one row per batch (no padding at all)
    shared     the prefix-shared path (scoring/prefix.py)

and prints the verdict agreement of each pair, and for every row where two of them disagree its margin:
min over answer steps of (gold logit - best other logit), from one unpadded fp32 forward of that row (> 0: the
gold answer is greedy), and the share of all rows that are such near ties. A disagreement with |margin| below ~0.5 logits is a near tie that bf16 rounding decides.

    python benchmarks/prefix_agreement.py [--n 20] [--task kv-lookup] [--facts 10] [--dtype bf16] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from posbias import get_task, load_model
from posbias.measure import Scorer


@torch.inference_mode()
def margin(model, row) -> float:
    """min over answer steps of (gold logit - best other logit), one unpadded forward."""
    ans = row.answer_ids[0]
    logits = model(input_ids=torch.tensor([row.prompt_ids + ans])).logits[0, -len(ans) - 1:-1].float()
    gold = torch.tensor(ans)[:, None]
    return float((logits.gather(-1, gold)[:, 0] - logits.scatter(-1, gold, float("-inf")).max(-1).values).min())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="kv-lookup")
    ap.add_argument("--facts", type=int, default=10, help="kv-lookup: facts per prompt")
    ap.add_argument("--docs", type=int, default=10, help="nq: documents per prompt")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    loaded = load_model(a.model, a.dtype, "cpu", progress=False)
    task = get_task(a.task, **({"facts": a.facts} if a.task == "kv-lookup" else {"docs": a.docs}))
    rows = Scorer(loaded, task).rows(task.examples(a.n, seed=0), list(range(task.n_slots)))
    ways = {"plain": Scorer(loaded, task, prefix_sharing=False),
            "alone": Scorer(loaded, task, prefix_sharing=False, max_batch=1),
            "shared": Scorer(loaded, task)}
    got = {}
    for name, scorer in ways.items():
        t = time.perf_counter()
        got[name] = {(r["example_id"], json.dumps(r["position"])): r for r in scorer.score(rows)}
        print(f"{name:7s} {time.perf_counter() - t:7.1f} s  accuracy {sum(r['correct'] for r in got[name].values()) / len(rows):.3f}")
    print(f"\n{a.model} {a.dtype}, {task.name}, {a.n} examples x {task.n_slots} slots = {len(rows)} rows")
    fp32 = load_model(a.model, "fp32", "cpu", progress=False).model
    by_key = {(r.key[0], json.dumps(r.key[1])): r for r in rows}
    near = [abs(margin(fp32, r)) for r in rows]
    print("near ties (fp32 |margin| below 0.1 / 0.25 / 0.5 logits): "
          + " / ".join(f"{sum(m < t for m in near) / len(rows):.1%}" for t in (0.1, 0.25, 0.5)) + " of the rows")
    for x, y in (("plain", "alone"), ("plain", "shared"), ("alone", "shared")):
        flips = [k for k in got[x] if got[x][k]["correct"] != got[y][k]["correct"]]
        dlp = max(abs(got[x][k]["logprob"] - got[y][k]["logprob"]) for k in got[x])
        ms = sorted(round(margin(fp32, by_key[k]), 3) for k in flips)
        print(f"{x} vs {y}: agreement {1 - len(flips) / len(rows):.1%} ({len(flips)} of {len(rows)} differ), "
              f"largest logprob difference {dlp:.3f}; fp32 margins of the rows that differ: {ms}")


if __name__ == "__main__":
    main()
