"""Peak memory of the per-span attention capture against a plain forward, on a ~2,000-token prompt.

    python benchmarks/attention_memory.py [--facts 90] [--model smollm2-135m] [--device cpu]

One kv-lookup prompt (about 90 facts, ~2,000 tokens with SmolLM2's chat template), one sequence, in the dtype auto
takes (bf16 on a CPU with native bf16, else fp32):

  (a) plain     the sdpa forward a sweep runs, logits of the last token only
  (b) capture   the same forward inside `span_attention` (the last prompt token's attention reduced to
                per-fact masses inside every layer; what `posbias analyze attention` runs)
  (c) eager     for reference, the full eager forward with output_attentions (L x H x T x T kept)

Each mode runs in a fresh subprocess. On the CPU the peak is the resident set size: after loading the model,
building the inputs and one short warm-up forward, the process's peak RSS counter (VmHWM) is reset
(/proc/self/clear_refs, "5") and its current RSS taken as the base; the figure reported is VmHWM after the
forward minus that base. On CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus the
allocated memory before. Target: capture / plain <= 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

import torch


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_peak(cuda: bool) -> int:
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def _peak(cuda: bool) -> int:
    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status("VmHWM")


def setup(a):
    from posbias import get_task, load_model
    from posbias.scoring.scorer import use_chat
    from posbias.scoring.spans import item_spans

    loaded = load_model(a.model, "auto", a.device)  # bf16 on a CPU with native bf16, else fp32
    loaded.model.set_attn_implementation("sdpa")
    task = get_task("kv-lookup", facts=a.facts)
    ex = task.examples(1, seed=0)[0]
    pos = a.facts // 2
    spans = item_spans(loaded.tokenizer, task.build(ex, pos), task.items(ex, pos), use_chat(loaded, "auto"))
    return loaded, spans


def forward(loaded, spans, mode: str, ids: torch.Tensor):
    from posbias.models.attention import eager_attention, span_attention

    model = loaded.model
    with torch.inference_mode():
        if mode == "plain":
            return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
        if mode == "eager":
            with eager_attention(model):
                return model(input_ids=ids, use_cache=False, output_attentions=True, logits_to_keep=1).attentions
        width = ids.shape[1]
        span_of = torch.tensor(spans.span_of[-width:])[None]
        with span_attention(model) as cap:
            cap.set_batch(span_of, spans.n_spans, torch.tensor([[width - 1]]), torch.ones(1, 1))
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            return dict(cap.masses)


def child(a) -> None:
    torch.set_num_threads(a.threads)
    cuda = a.device != "cpu"
    loaded, spans = setup(a)
    ids = torch.tensor([spans.ids], device=loaded.device)
    forward(loaded, spans, a.child, ids[:, -16:])  # warm-up: kernels, thread pools, the registered function
    base = _reset_peak(cuda)
    t0 = time.perf_counter()
    out = forward(loaded, spans, a.child, ids)
    sec = time.perf_counter() - t0
    peak = _peak(cuda)
    del out
    print(json.dumps({"mode": a.child, "tokens": len(spans.ids), "base": base, "peak": peak, "seconds": sec}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--facts", type=int, default=90)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", default=None)
    a = p.parse_args()
    if a.child:
        return child(a)
    res = {}
    for mode in ("plain", "capture", "eager"):
        cmd = [sys.executable, __file__, "--child", mode, "--model", a.model, "--facts", str(a.facts), "--device",
               a.device, "--threads", str(a.threads)]
        res[mode] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    mib = lambda x: x / 2**20  # noqa: E731
    from posbias.measure import dtype_note

    print(f"{a.model} {dtype_note('auto', a.device)} on {a.device}, kv-lookup {a.facts} facts = "  # every child's load
          f"{res['plain']['tokens']} tokens, 1 sequence, {a.threads} thread(s)")
    print(f"{'mode':>8}  {'peak above base (MiB)':>21}  {'x plain':>7}  {'seconds':>7}")
    plain = res["plain"]["peak"] - res["plain"]["base"]
    for mode, r in res.items():
        extra = r["peak"] - r["base"]
        times = f"{extra / plain:>7.2f}" if plain > 0 else f"{'-':>7}"
        print(f"{mode:>8}  {mib(extra):>21.1f}  {times}  {r['seconds']:>7.2f}")
    if plain <= 0:  # a prompt so short that the plain forward's activations never raised the peak: no ratio to read
        print("target capture/plain <= 2: not decided (the plain path's peak did not rise above its base at "
              f"{a.facts} facts; pass more --facts)")
        return
    ratio = (res["capture"]["peak"] - res["capture"]["base"]) / plain
    print(f"target capture/plain <= 2: {'met' if ratio <= 2 else 'MISSED'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
