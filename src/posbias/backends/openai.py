"""Any OpenAI-compatible server: vLLM, SGLang, TGI, llama.cpp's server, hosted APIs.

Two ways to send a row (recorded in run.json as info["prompts"]):
  tokens  `/v1/completions` with the row's token ids as the prompt (vLLM, SGLang take them): the very tokens the
          in-process path scores. Teacher forcing reads `prompt_logprobs` (vLLM's extension): the rank of every
          prompt token (1 = the greedy choice) and the top token.
  chat    `/v1/chat/completions` with the task's prompt as one user message (hosted APIs): generate only.

Greedy and deterministic: temperature 0 and a seed on every request; on token prompts also repetition_penalty 1,
top_k -1, min_p 0, so a served model's generation_config.json (which vLLM applies as request defaults) changes
nothing, as on the in-process path (models/decoding.py).
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Iterator

from ..errors import PosbiasError
from .base import Capabilities, Reply, Request, ServedBackend, prompt_ranks
from .http import Http

PROMPTS = ("tokens", "chat")
NEUTRAL = {"repetition_penalty": 1.0, "top_k": -1, "min_p": 0.0}  # vLLM / SGLang sampling extras


class OpenAIBackend(ServedBackend):
    name = "openai"
    description = "any OpenAI-compatible server: vLLM, SGLang, TGI, llama.cpp, hosted APIs"
    ARGS = {
        "base_url": "the server's API root (default http://127.0.0.1:8000/v1)",
        "tokenizer": "the served model's tokenizer: a registered name, a model directory or a .gguf (token prompts)",
        "prompts": "tokens (token ids on /v1/completions; needs tokenizer) | chat (messages on /v1/chat/completions)",
        "api_key_env": "environment variable holding the API key (default OPENAI_API_KEY; unset: no key sent)",
        "concurrency": "requests in flight (default 8)",
        "batch": "token prompts per /v1/completions request (default 1; vLLM and SGLang take a list: 8 cuts HTTP cost)",
        "timeout": "seconds to wait for one reply (default 120)",
        "retries": "tries after the first on 429 / 5xx / timeouts / dropped connections (default 6)",
        "cache": "a directory for an on-disk response cache (default none): a re-run costs no requests",
        "context_window": "tokens the served model takes (default: the server's max_model_len)",
        "seed": "sent with every request (default 0)",
    }

    def __init__(self, args: dict, progress: bool = True):
        self.caps = self.capabilities(args)
        self.model = str(args["model"])
        self.prompts = _prompts(args)
        self.seed = int(args.get("seed", 0))
        self.concurrency = int(args.get("concurrency", 8))
        self.batch = int(args.get("batch", 1)) if self.prompts == "tokens" else 1
        if self.concurrency < 1 or self.batch < 1:
            raise PosbiasError(f"concurrency and batch must be at least 1, got {self.concurrency} and {self.batch}",
                               "pass concurrency=8 or so, batch=1 or more")
        self.http = Http(str(args.get("base_url", "http://127.0.0.1:8000/v1")), str(args.get("api_key_env", "OPENAI_API_KEY")),
                         float(args.get("timeout", 120)), int(args.get("retries", 6)), args.get("cache"))
        self.tokenizer = None
        if "tokenizer" in args:
            from ..models.load import load_tokenizer

            self.tokenizer = load_tokenizer(str(args["tokenizer"]), progress)
        window = args.get("context_window") or self._server_window()
        if not window:
            raise PosbiasError(f"the server at {self.http.base_url} does not say how long a context '{self.model}' "
                               "takes", "add context_window=N to the model spec")
        self.info = {"backend": self.name, "name": f"openai:{self.model}", "served_model": self.model,
                     "base_url": self.http.base_url, "prompts": "token-ids" if self.prompts == "tokens" else "chat-messages",
                     "tokenizer": args.get("tokenizer"), "context_window": int(window), "seed": self.seed}

    @classmethod
    def capabilities(cls, args: dict) -> Capabilities:
        tokens = _prompts(args) == "tokens"
        return Capabilities(prompt_logprobs=tokens, token_prompts=tokens, methods=False, prefix_sharing=False,
                            batching="requests")

    @classmethod
    def check_args(cls, args: dict, spec: str) -> None:
        super().check_args(args, spec)
        _prompts(args)

    @classmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "OpenAIBackend":
        return cls(args, progress)

    def _server_window(self) -> int | None:
        """GET /models: reachable, key accepted, model served; its max_model_len (vLLM, SGLang) if given."""
        listed = self.http.get("/models").get("data", [])
        ids = [m.get("id") for m in listed]
        if ids and self.model not in ids:
            raise PosbiasError(f"the server at {self.http.base_url} serves {', '.join(map(str, ids))}, not '{self.model}'",
                               f"use model={ids[0]} in the model spec")
        for m in listed:
            if m.get("id") == self.model and m.get("max_model_len"):
                return int(m["max_model_len"])
        return None

    def settings(self) -> dict:
        return {"concurrency": self.concurrency, "batch": self.batch, "timeout_s": self.http.timeout,
                "retries": self.http.retries, "cache": str(self.http.cache) if self.http.cache else None}

    def counters(self) -> dict:
        return dict(self.http.counts)

    def run(self, requests: list[Request]) -> Iterator[tuple[int, Reply]]:
        pool = ThreadPoolExecutor(self.concurrency)
        pending = {}
        try:
            for unit in self._units(requests):  # keep `concurrency` requests in flight (bounded: a failure stops early)
                pending[pool.submit(self._send, [requests[i] for i in unit])] = unit
                if len(pending) < self.concurrency:
                    continue
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    yield from zip(pending.pop(f), f.result())
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    yield from zip(pending.pop(f), f.result())
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _units(self, requests: list[Request]) -> Iterator[list[int]]:
        """Indices of the requests one HTTP request carries: up to `batch` neighbours of one kind and length limit."""
        unit: list[int] = []
        for i, q in enumerate(requests):
            if unit and (len(unit) == self.batch or _shape(requests[unit[0]]) != _shape(q)):
                yield unit
                unit = []
            unit.append(i)
        if unit:
            yield unit

    def _send(self, qs: list[Request]) -> list[Reply]:
        """One HTTP request for `qs` (one chat message, or a list of token prompts): one reply per request."""
        q = qs[0]
        common = {"model": self.model, "temperature": 0, "top_p": 1, "seed": self.seed}
        if self.prompts == "chat":
            stop = {"stop": ["\n"]} if q.stop_newline else {}
            out = self.http.post("/chat/completions", {**common, **stop, "messages": q.messages, "max_tokens": q.max_tokens})
            choice = _choice(out)
            return [Reply(text=(choice.get("message") or {}).get("content") or "", finish=choice.get("finish_reason") or "",
                          **_usage(out))]
        prompt = q.ids if len(qs) == 1 else [x.ids for x in qs]  # a single prompt as before (the same cache keys)
        if q.kind == "logprobs":
            body = {**common, **NEUTRAL, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 1}
        else:
            body = {**common, **NEUTRAL, **({"stop": ["\n"]} if q.stop_newline else {}), "prompt": prompt,
                    "max_tokens": q.max_tokens}
        out = self.http.post("/completions", body)
        choices = sorted(out.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(qs):
            raise PosbiasError(f"the server answered {len(choices)} choices for {len(qs)} prompts",
                               "use batch=1 in the model spec (this server does not take a list of prompts)")
        usage = _usage(out)
        return [Reply(tokens=_ranks(c, x) if x.kind == "logprobs" else [], text=c.get("text") or "",
                      finish=c.get("finish_reason") or "", **(usage if k == 0 else {}))
                for k, (c, x) in enumerate(zip(choices, qs))]


def _shape(q: Request) -> tuple:
    return (q.kind, q.max_tokens, q.stop_newline)


def _prompts(args: dict) -> str:
    p = args.get("prompts", "tokens" if "tokenizer" in args else "chat")
    if p not in PROMPTS:
        raise PosbiasError(f"unknown prompts '{p}' in the model spec", "use prompts=tokens (with tokenizer=...) or prompts=chat")
    if p == "tokens" and "tokenizer" not in args:
        raise PosbiasError("token prompts need the served model's tokenizer", "add tokenizer=DIR (or a registered "
                           "name) to the model spec, or use prompts=chat")
    return p


def _choice(out: dict) -> dict:
    choices = out.get("choices") or []
    if not choices:
        raise PosbiasError("the server replied without choices", "check that it is an OpenAI-compatible endpoint")
    return choices[0]


def _usage(out: dict) -> dict:
    u = out.get("usage") or {}
    return {"prompt_tokens": int(u.get("prompt_tokens") or 0), "completion_tokens": int(u.get("completion_tokens") or 0)}


def _ranks(choice: dict, q: Request) -> list[tuple[float, int, int, float]]:
    """Reply.tokens from a choice's prompt_logprobs (vLLM's JSON: per position None or {"id": {logprob, rank}})."""
    plp = choice.get("prompt_logprobs")
    if not plp or len(plp) != len(q.ids):
        raise PosbiasError("the server returned no prompt logprobs for a teacher-forced row",
                           "use a server that supports prompt_logprobs (vLLM, SGLang), or `engine=generate`")
    return prompt_ranks([e and {int(k): (v["logprob"], v["rank"]) for k, v in e.items()} for e in plp], q)
