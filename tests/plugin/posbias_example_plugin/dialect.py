"""A server dialect: vLLM's requests from a server that lists its models as owned by "vllm-plugin" (a fork or a proxy
of vLLM), so GET /models detects it; a variant of the built-in, registered in one line."""

from dataclasses import replace

from posbias.measure import DIALECTS, register_dialect

register_dialect(replace(DIALECTS["vllm"], name="vllm-plugin", owner="vllm-plugin"))
