"""What runs the model, behind one interface with declared capabilities (docs/backends.md).

  hf      in process with transformers: methods, prefix sharing, hooks (models/load.py)
  vllm    vLLM's offline engine in this process (an optional extra; tensor / pipeline parallel)
  openai  any OpenAI-compatible HTTP server, by its dialect (dialects.py): vLLM, llama.cpp, hosted APIs

A model spec names one: `smollm2-135m` or `hf:DIR` (in process), `vllm:DIR,tensor_parallel_size=2`,
`openai:model=NAME,base_url=http://127.0.0.1:8000/v1,tokenizer=DIR`. The scoring protocols (scoring/engines.py)
ask a backend only for what its capabilities say it has.
"""

from .base import Backend, Capabilities, Reply, Request, ServedBackend, check_method
from .spec import BACKENDS, ModelSpec, as_backend, open_backend, open_model, parse_spec, register_backend, split_models

__all__ = ["BACKENDS", "Backend", "Capabilities", "ModelSpec", "Reply", "Request", "ServedBackend", "as_backend", "check_method",
           "open_backend", "open_model", "parse_spec", "register_backend", "split_models"]
