"""What an OpenAI-compatible server takes and how it says it: one Dialect per server family (backends/openai.py).

A dialect is detected from `GET /models` (vLLM lists itself as owner "vllm", llama-cpp-python as "me") or declared
with `dialect=` in the model spec. Each one says which prompt protocols it takes, the decoding fields that make it
greedy (sent on every request, so a server's own defaults change nothing: llama.cpp's repeat_penalty 1.1, top_k
40, min_p 0.05, top_p 0.95; the generation_config.json vLLM applies), how to check its tokenisation of a text
prompt, how it lists generated tokens, and which of its errors are the request's fault.

  vllm      tokens (ids on /v1/completions, prompt_logprobs), text, chat; generated tokens listed by id
  llamacpp  text (posbias renders the template; /extras/tokenize checks the ids), chat; no token-id prompts,
            no prompt_logprobs; tokens listed as text; every exception in a route is answered as a JSON 500
            (llama-cpp-python's RouteErrorHandler), so a 500 is the request's fault, not an outage
  openai    chat only (hosted APIs): temperature 0, top_p 1, no penalties; the API promises no exact argmax
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PosbiasError


@dataclass(frozen=True)
class Dialect:
    name: str
    prompts: tuple[str, ...]  # the protocols it takes, the default (with a tokenizer) first
    greedy: dict  # every decoding field sent on every request: greedy, no penalties, no truncation
    owner: str | None = None  # owned_by in GET /models (detection)
    extra: dict = field(default_factory=dict)  # per protocol: further fields (tokens / text / chat)
    tokenize: str | None = None  # route (from the server root) that tokenises text as a completion prompt would
    tokenize_key: str = "input"  # the field of that route that holds the text
    tokenize_extra: dict = field(default_factory=dict)  # its further fields (vLLM: no special tokens added)
    token_ids: bool = False  # generated tokens listed by id (else by their text)
    prompt_logprobs: bool = False  # teacher forcing can read prompt logprobs (vLLM's extension)
    refuses_500: bool = False  # a 500 is the request's fault (a validation error), shown and not retried
    exact_greedy: bool = True  # temperature 0 is the argmax (False: a hosted API's best effort, recorded)
    window_hint: str = "add context_window=N to the model spec"

    def fields(self, prompts: str) -> dict:
        return {**self.greedy, **self.extra.get(prompts, {})}

    def tokenize_request(self, model: str, text: str) -> dict:
        return {"model": model, self.tokenize_key: text, **self.tokenize_extra}

    def tokens_of(self, reply: dict) -> list[int]:
        return [int(t) for t in reply.get("tokens") or []]


# vLLM / SGLang sampling fields: every sampler off but the argmax
_VLLM = {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
         "frequency_penalty": 0.0}
# llama-cpp-python's request fields (server/types.py): top_k 0 = off (-1 is a validation error), mirostat off
_LLAMACPP = {"temperature": 0, "top_p": 1, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
             "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat_mode": 0}

DIALECTS: dict[str, Dialect] = {d.name: d for d in (
    Dialect("vllm", ("tokens", "text", "chat"), _VLLM, owner="vllm", tokenize="/tokenize", token_ids=True,
            tokenize_key="prompt", tokenize_extra={"add_special_tokens": False},
            prompt_logprobs=True, extra={"text": {"add_special_tokens": False}, "tokens": {}, "chat": {}},
            window_hint="add context_window=N to the model spec (vLLM's --max-model-len)"),
    Dialect("llamacpp", ("text", "chat"), _LLAMACPP, owner="me", tokenize="/extras/tokenize", refuses_500=True,
            window_hint="add context_window=N to the model spec (the server's --n_ctx; llama-cpp-python's default is 2048)"),
    Dialect("openai", ("chat",), {"temperature": 0, "top_p": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0},
            exact_greedy=False),
)}


def get_dialect(name: str) -> Dialect:
    if name not in DIALECTS:
        raise PosbiasError(f"unknown dialect '{name}' in the model spec", f"use dialect= one of {', '.join(DIALECTS)}")
    return DIALECTS[name]


def detect(models: list[dict]) -> Dialect:
    """The dialect of a server from its GET /models listing (owned_by); any other: the hosted-API dialect."""
    owners = {str(m.get("owned_by")) for m in models}
    for d in DIALECTS.values():
        if d.owner in owners:
            return d
    return DIALECTS["openai"]


def choose_prompts(d: Dialect, asked: str | None, tokenizer: bool) -> str:
    """The prompt protocol: the one asked for if the dialect takes it (refused in one line otherwise), else the
    dialect's first one that needs no tokenizer the spec lacks."""
    if asked is not None:
        if asked not in d.prompts:
            other = " (or dialect=vllm, if the server takes vLLM's requests, as SGLang's does)" if d.name == "openai" else ""
            raise PosbiasError(f"this server's dialect, {d.name}, takes no prompts={asked} (it takes {', '.join(d.prompts)})",
                               f"use prompts={d.prompts[0] if tokenizer or d.prompts[0] == 'chat' else 'chat'} "
                               f"in the model spec{other}")
        if asked != "chat" and not tokenizer:
            raise PosbiasError(f"prompts={asked} needs the served model's tokenizer", "add tokenizer=DIR (or a "
                               "registered name) to the model spec, or use prompts=chat")
        return asked
    return next(p for p in d.prompts if tokenizer or p == "chat")
