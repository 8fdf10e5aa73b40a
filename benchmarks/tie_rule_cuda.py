"""The premise of the served tie rule (backends.base.is_greedy) on a GPU: torch's argmax takes the lowest index
among equal values (the in-process rule), while torch.topk may list a tied higher index first (where vLLM's V1
ranks come from). Prints, per device and dtype, how often each holds over random tied rows of a real vocabulary's
size. Run: python benchmarks/tie_rule_cuda.py (on a CUDA machine; on CPU it measures the CPU)."""

from __future__ import annotations

import torch


def check(device: str, dtype: torch.dtype, vocab: int = 49152, rows: int = 4096, ties: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g)
    top = x.max(-1, keepdim=True).values + 1.0
    idx = torch.stack([torch.randperm(vocab, generator=g)[:ties] for _ in range(rows)])  # tied maxima, random ids
    x.scatter_(1, idx, top.expand(-1, ties))
    x = x.to(device=device, dtype=dtype)
    lowest = idx.min(-1).values.to(device)
    arg = x.argmax(-1)
    first = x.topk(2, -1).indices[:, 0]
    return {"device": device, "dtype": str(dtype).removeprefix("torch."), "ties": ties, "rows": rows,
            "argmax_lowest": int((arg == lowest).sum()), "topk_first_lowest": int((first == lowest).sum())}


if __name__ == "__main__":
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print("torch", torch.__version__, "| cuda:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
    for device in devices:
        for dtype in (torch.float32, torch.bfloat16):
            for ties in (2, 3):
                print(check(device, dtype, ties=ties))
