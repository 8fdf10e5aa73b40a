"""What an OpenAI-compatible server takes and how it says it: one Dialect per server family (backends/openai.py).

A dialect is detected from `GET /models` (vLLM lists itself as owner "vllm", llama-cpp-python as "me") or declared
with `dialect=` in the model spec; `DIALECTS` is their registry (`register_dialect`: a plugin's too, a taken name
refused). Each one says which prompt protocols it takes, the decoding fields that make it
greedy (sent on every request, so a server's own defaults change nothing: llama.cpp's repeat_penalty 1.1, top_k
40, min_p 0.05, top_p 0.95; the generation_config.json vLLM applies), how to check its tokenisation of a text
prompt, how it lists generated tokens, and which of its errors are the request's fault.

  vllm      tokens (ids on /v1/completions, prompt_logprobs), text, chat; generated tokens listed by id
  llamacpp  text (posbias renders the template; /extras/tokenize checks the ids), chat; no token-id prompts,
            no prompt_logprobs; tokens listed as text; every exception in a route is answered as a JSON 500
            (llama-cpp-python's RouteErrorHandler), so a 500 is the request's fault, not an outage
  openai    chat only (hosted APIs): temperature 0, top_p 1, no penalties; the API promises no exact argmax

A dialect also says whether the server drops a request its client abandoned (a reply past the timeout may then be
asked for again without the server computing it twice) and how it words a prompt longer than its context window.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from ..errors import PosbiasError
from ..registry import Registry


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
    drops_abandoned: bool = True  # an abandoned request (the client timed out and closed) is not computed on
    too_long: tuple[str, ...] = ()  # regexes of its refusal of a prompt over the window; group 1: the window

    def window_of(self, message: str) -> int | None:
        """The server's context window where `message` refuses a prompt as too long (0: too long, window unsaid);
        None: another refusal."""
        for pattern in self.too_long:
            m = re.search(pattern, message, re.IGNORECASE)
            if m:
                return int(m.group(1)) if m.groups() and m.group(1) else 0
        return None

    def fields(self, prompts: str) -> dict:
        return {**self.greedy, **self.extra.get(prompts, {})}

    def tokenize_request(self, model: str, text: str) -> dict:
        return {"model": model, self.tokenize_key: text, **self.tokenize_extra}

    def tokens_of(self, reply: dict) -> list[int]:
        return [int(t) for t in reply.get("tokens") or []]


# vLLM / SGLang sampling fields: every sampler off but the argmax (the one definition: the offline engine, vllm.py,
# builds its SamplingParams from it too)
VLLM_GREEDY = {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
         "frequency_penalty": 0.0}
# llama-cpp-python's request fields (server/types.py): top_k 0 = off (-1 is a validation error), mirostat off
_LLAMACPP = {"temperature": 0, "top_p": 1, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
             "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat_mode": 0}

DIALECTS = Registry("dialect")  # name -> Dialect: what `dialect=` names, in the order GET /models detection tries


def register_dialect(dialect: Dialect) -> Dialect:
    """Make a server family's Dialect one a model spec's `dialect=NAME` names and GET /models detects (by `owner`);
    a taken name is refused."""
    if not isinstance(dialect, Dialect) or not dialect.name:
        raise PosbiasError(f"register_dialect takes a Dialect with a name, got {dialect!r}",
                           "build one with posbias.backends.dialects.Dialect(name, prompts, greedy, ...)")
    return DIALECTS.add(dialect.name, dialect, owner=sys._getframe(1).f_globals.get("__name__", "?"))


for _dialect in (
    # vLLM 0.32 (HTTP 400): "This model's maximum context length is 2048 tokens. However, your prompt contains at
    # least 2049 input tokens, ..." (renderers/params.py), "The decoder prompt (length 3000) is longer than the maximum
    # model length of 2048." (v1/engine/input_processor.py), "Input length (3000) exceeds model's maximum context length
    # (2048)." (api_utils.get_max_tokens); a timed-out client's request is aborted when its connection closes
    Dialect("vllm", ("tokens", "text", "chat"), VLLM_GREEDY, owner="vllm", tokenize="/tokenize", token_ids=True,
            tokenize_key="prompt", tokenize_extra={"add_special_tokens": False},
            prompt_logprobs=True, extra={"text": {"add_special_tokens": False}, "tokens": {}, "chat": {}},
            window_hint="add context_window=N to the model spec (vLLM's --max-model-len)",
            too_long=(r"maximum context length is (\d+)", r"maximum model length of (\d+)",
                      r"maximum context length \((\d+)\)")),
    # llama-cpp-python 0.3.36 (HTTP 400, its server/errors.py rewording llama.py's "Requested tokens (3088) exceed
    # context window of 2048"): "This model's maximum context length is 2048 tokens, however you requested 3088
    # tokens (3081 in your prompt; 7 for the completion) ..."; it computes a request to the end after its client left
    Dialect("llamacpp", ("text", "chat"), _LLAMACPP, owner="me", tokenize="/extras/tokenize", refuses_500=True,
            window_hint="add context_window=N to the model spec (the server's --n_ctx; llama-cpp-python's default is 2048)",
            drops_abandoned=False, too_long=(r"maximum context length is (\d+)", r"exceed context window of (\d+)")),
    Dialect("openai", ("chat",), {"temperature": 0, "top_p": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0},
            exact_greedy=False, too_long=(r"maximum context length is (\d+)",)),  # OpenAI's context_length_exceeded
):
    register_dialect(_dialect)


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


def needs_tokenizer(prompts: str) -> PosbiasError:
    """The refusal of prompts=text|tokens without the served model's tokenizer (the spec's check and the dialect's)."""
    return PosbiasError(f"prompts={prompts} needs the served model's tokenizer", "add tokenizer=DIR (or a registered "
                        "name) to the model spec, or use prompts=chat and `engine=generate`")


def choose_prompts(d: Dialect, asked: str | None, tokenizer: bool) -> str:
    """The prompt protocol: the one asked for if the dialect takes it (refused in one line otherwise), else the
    dialect's first one that needs no tokenizer the spec lacks."""
    if asked is not None:
        if asked not in d.prompts:
            other = " (or dialect=vllm, if the server takes vLLM's requests, as SGLang's does)" if d.name == "openai" else ""
            use = d.prompts[0] if tokenizer or d.prompts[0] == "chat" else "chat"
            generate = " and `engine=generate`" if use == "chat" else ""  # chat teacher-forces order tasks only
            raise PosbiasError(f"this server's dialect, {d.name}, takes no prompts={asked} (it takes {', '.join(d.prompts)})",
                               f"use prompts={use} in the model spec{generate}{other}")
        if asked != "chat" and not tokenizer:
            raise needs_tokenizer(asked)
        return asked
    return next(p for p in d.prompts if tokenizer or p == "chat")
