"""Loading a registered GGUF model three ways: transformers' own GGUF path (what every load did before posbias's
cache), posbias's first load (the GGUF file parsed once under models/gguf_cache.py `shared_reads`, the result written
to the cache), and a load from that cache; with the check that all three give the same model.

    python benchmarks/load_speed.py [--models smollm2-135m,gemma3-270m] [--dtype bf16]

Each load runs cold in its own process, in this order, into a fresh private cache directory: transformers' path (caching
off, `shared_reads` off), posbias's GGUF read (writes the cache), the cached load. The time is that of the load call
alone, after the child imported its libraries (wall and CPU seconds of that process). The GGUF file is in the OS page
cache after the first load (100-250 MB; reading it is not where the time goes). The equality columns compare each of
the last two loads with transformers' path: every tensor (bit for bit, by SHA-256 of its bytes), the logits of a
300-token input, the token ids of a prompt, the recorded model block.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

TEXT = "Document [3]: the value of key 8a7f-2b is 1234.\nQuestion: what is the value of 8a7f-2b?\nAnswer:"


def child(name: str, dtype: str, path: str) -> None:
    """One load, cold: time it, print its fingerprint as JSON."""
    import gguf  # noqa: F401  (the imports are not the load's time)
    import transformers.modeling_gguf_pytorch_utils  # noqa: F401

    import posbias.models.load as load

    if path == "transformers":
        load.shared_reads = contextlib.nullcontext
    w, c = time.perf_counter(), time.process_time()
    lo = load.load_model(name, dtype, "cpu", progress=False)
    w, c = time.perf_counter() - w, time.process_time() - c
    ids = torch.randint(5, 20000, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = lo.model(input_ids=ids).logits
    sd = lo.model.state_dict()
    print(json.dumps({"wall": w, "cpu": c, "logits": hashlib.sha256(logits.float().numpy().tobytes()).hexdigest(),
                      "tensors": {k: hashlib.sha256(v.view(torch.uint8).numpy().tobytes()).hexdigest() + str(v.dtype)
                                  for k, v in sd.items()},
                      "tokens": lo.tokenizer(TEXT).input_ids, "record": {**lo.info, "dtype_reason": None}}))


def run(name: str, dtype: str, path: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", path, "--models", name, "--dtype", dtype], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def same(a: dict, b: dict) -> str:
    return " / ".join(str(a[k] == b[k]) for k in ("tensors", "logits", "tokens", "record"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.models, a.dtype, a.child)
    with tempfile.TemporaryDirectory(prefix="posbias-load-speed-") as d:  # removed afterwards (1.3 GB for both models)
        env = {k: v for k, v in os.environ.items() if k != "POSBIAS_NO_CACHE"}
        print(f"CPU {torch.backends.cpu.get_cpu_capability()}, threads {torch.get_num_threads()}, dtype {a.dtype}, "
              f"cache {d}; each load cold in its own process: wall s / CPU s of the load call\n")
        print(f"{'model':14s} {'transformers path':>17s} {'posbias GGUF read':>17s} {'cached':>13s} {'tf/read':>8s} "
              f"{'read/cached':>11s}  same as transformers' path (read; cached): tensors / logits / tokens / record")
        for name in a.models.split(","):
            tf = run(name, a.dtype, "transformers", {**env, "POSBIAS_NO_CACHE": "1"})
            read = run(name, a.dtype, "read", {**env, "POSBIAS_CACHE_DIR": d})
            cached = run(name, a.dtype, "cached", {**env, "POSBIAS_CACHE_DIR": d})
            print(f"{name:14s} {tf['wall']:7.2f} / {tf['cpu']:6.2f}  {read['wall']:7.2f} / {read['cpu']:6.2f}  "
                  f"{cached['wall']:5.2f} / {cached['cpu']:5.2f} {tf['cpu'] / read['cpu']:7.1f}x "
                  f"{read['cpu'] / cached['cpu']:10.1f}x  {same(tf, read)}; {same(tf, cached)}")


if __name__ == "__main__":
    main()
