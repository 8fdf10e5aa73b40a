"""Loading a registered GGUF model: reading the GGUF file (what every load did before the cache) against a load from
posbias's de-quantized cache, with the check that both give the same model.

    python benchmarks/load_speed.py [--models smollm2-135m,gemma3-270m] [--dtype bf16]

Each model is loaded twice into a fresh, private cache directory: the first load reads the GGUF file and writes the
cache, the second reads the cache. Printed side by side: the two times, their ratio, and whether the two models agree
in every tensor (bit for bit), in the logits of a 300-token input, in the tokenizer and in the recorded model block.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="posbias-load-speed-") as d:  # removed afterwards (1.3 GB for both models)
        os.environ["POSBIAS_CACHE_DIR"] = d
        os.environ.pop("POSBIAS_NO_CACHE", None)
        measure(a)


def measure(a) -> None:
    from posbias import load_model

    print(f"threads {torch.get_num_threads()}, dtype {a.dtype}, cache {os.environ['POSBIAS_CACHE_DIR']}\n")
    print(f"{'model':14s} {'GGUF read s':>11s} {'cached s':>9s} {'speed-up':>9s}  same tensors / logits / tokens / record")
    for name in a.models.split(","):
        t = time.perf_counter()
        read = load_model(name, a.dtype, "cpu", progress=False)
        t_read = time.perf_counter() - t
        t = time.perf_counter()
        cached = load_model(name, a.dtype, "cpu", progress=False)
        t_cached = time.perf_counter() - t
        sa, sb = read.model.state_dict(), cached.model.state_dict()
        tensors = sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        ids = torch.randint(5, 20000, (1, 300), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            logits = torch.equal(read.model(input_ids=ids).logits, cached.model(input_ids=ids).logits)
        text = "Document [3]: the value of key 8a7f-2b is 1234.\nQuestion: what is the value of 8a7f-2b?\nAnswer:"
        tokens = read.tokenizer(text).input_ids == cached.tokenizer(text).input_ids
        record = read.info == cached.info
        print(f"{name:14s} {t_read:11.2f} {t_cached:9.2f} {t_read / t_cached:8.1f}x  {tensors} / {logits} / {tokens} / {record}")


if __name__ == "__main__":
    main()
