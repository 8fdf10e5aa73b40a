"""Any OpenAI-compatible server: vLLM, SGLang, llama.cpp's server (llama-cpp-python), hosted APIs.

Three prompt protocols (recorded in run.json as info["prompts"]); which ones a server takes is its dialect's to
say (backends/dialects.py: detected from GET /models, or `dialect=`):
  tokens  `/v1/completions` with the row's token ids as the prompt (vLLM, SGLang): the very tokens the in-process
          path scores.
  text    `/v1/completions` with the row's prompt as text, the chat template applied by posbias (the in-process
          prompt); every prompt's tokenisation by the server is checked against the in-process ids first (a
          tokenize route) and a difference is refused in one line (llama.cpp's server takes no ids).
  chat    `/v1/chat/completions` with the task's prompt as one user message (hosted APIs): the server's template.

Teacher forcing (scoring/engines.py) goes by greedy generation by default ("every answer token is the greedy choice"
is "greedy generation begins with the answer's tokens"; one request per row), or by vLLM's `prompt_logprobs` with
teacher_forcing=prompt_logprobs; order tasks read the labels from the first generated token's top logprobs.
Every decoding field that makes a dialect greedy is sent with every request, and a seed.
"""

from __future__ import annotations

import os
import threading
from typing import Iterator

from ..errors import PosbiasError
from .base import Capabilities, Reply, Request, ServedBackend, Step, prompt_steps, teacher_forcing_route
from .dialects import Dialect, choose_prompts, detect, get_dialect, needs_tokenizer
from .http import Http, served_error

PROMPTS = ("tokens", "text", "chat")
DEFAULT_URL = "http://127.0.0.1:8000/v1"


class OpenAIBackend(ServedBackend):
    name = "openai"
    description = "any OpenAI-compatible server: vLLM, SGLang, llama.cpp's server, hosted APIs"
    TRANSPORT = frozenset({"api_key_env", "concurrency", "batch", "timeout", "retries", "cache"})
    ARGS = {
        "base_url": f"the server's API root (default {DEFAULT_URL})",
        "tokenizer": "the served model's tokenizer: a registered name, a model directory or a .gguf (tokens, text)",
        "prompts": "tokens (ids) | text (posbias's template, tokenisation checked) | chat (messages); default: the "
                   "server's first (vllm: tokens, llamacpp: text) with a tokenizer, else chat",
        "dialect": "the server's family: one of the dialects below (default: detected from GET /models)",
        "teacher_forcing": "generate (greedy generation, default) | prompt_logprobs (vLLM's extension)",
        "api_key_env": "environment variable holding the API key (default OPENAI_API_KEY; unset: no key sent)",
        "concurrency": "requests in flight (default 8)",
        "batch": "token prompts per /v1/completions request (default 1; vLLM and SGLang take a list: 8 cuts HTTP cost)",
        "timeout": "seconds to wait for one reply (default 120; past it a request is sent once more at most)",
        "retries": "tries after the first on 429 / 5xx / dropped connections (default 6)",
        "cache": "a directory for an on-disk response cache (default none): a re-run costs no requests",
        "context_window": "tokens the served model takes (default: the server's max_model_len)",
        "seed": "sent with every request (default 0)",
    }

    def __init__(self, args: dict, progress: bool = True):
        self.model = str(args["model"])
        self.seed = int(args.get("seed", 0))
        self.concurrency = int(args.get("concurrency", 8))
        if self.concurrency < 1 or int(args.get("batch", 1)) < 1:
            raise PosbiasError(f"concurrency and batch must be at least 1, got {self.concurrency} and "
                               f"{args.get('batch', 1)}", "use concurrency=8 and batch=1 in the model spec (each at "
                               "least 1)")
        env = str(args.get("api_key_env", "OPENAI_API_KEY"))
        key = os.environ.get(env)  # read here, sent in a header, never stored in a record
        self.http = Http(self.where(args), {"Authorization": f"Bearer {key}"} if key else {},
                         env, float(args.get("timeout", 120)), int(args.get("retries", 6)), args.get("cache"))
        listed = self._listed()
        self.dialect: Dialect = get_dialect(args["dialect"]) if "dialect" in args else detect(listed)
        self.http.refuses_500 = self.dialect.refuses_500
        self.prompts = choose_prompts(self.dialect, args.get("prompts"), "tokenizer" in args)
        self.batch = int(args.get("batch", 1)) if self.prompts == "tokens" else 1
        self.http.hint = _refusal_hint(self.dialect.name, self.prompts)
        self.http.resend_timeout = self.dialect.drops_abandoned
        self.http.explain = self._too_long
        self.http.usage = _usage  # the OpenAI reply's token counts, for the backend's counters
        self.route = teacher_forcing_route(args, self.dialect.prompt_logprobs and self.prompts == "tokens")
        self.caps = _caps(self.prompts, self.route)
        self.tokenizer = None
        if "tokenizer" in args:
            from ..models.load import load_tokenizer

            self.tokenizer = load_tokenizer(str(args["tokenizer"]), progress)
        self.served_window = _window(listed, self.model)  # the server's own (vLLM's max_model_len), if it says
        window = args.get("context_window") or self.served_window
        if self.served_window and int(window) > self.served_window:
            raise PosbiasError(f"context_window={window} in the model spec, but the server takes {self.served_window} "
                               "tokens", f"use context_window={self.served_window} in the model spec (or leave it out)")
        if not window:
            raise PosbiasError(f"the server at {self.http.base_url} does not say how long a context '{self.model}' "
                               "takes", self.dialect.window_hint)
        self._checked: set[int] = set()  # prompts whose server tokenisation matched (text protocol)
        self._lock = threading.Lock()
        self.info = {"backend": self.name, "name": f"openai:{self.model}", "served_model": self.model,
                     "base_url": self.http.base_url, "dialect": self.dialect.name, "prompts": self.prompts,
                     "tokenizer": args.get("tokenizer"), "context_window": int(window), "seed": self.seed,
                     **({"teacher_forcing": self.route} if self.route else {})}

    @classmethod
    def tokenizer_source(cls, args: dict) -> str | None:
        return args.get("tokenizer")  # the served model's own directory, if the spec names it

    @classmethod
    def capabilities(cls, args: dict) -> Capabilities:
        """What the spec alone says (before the server is asked; the open backend's caps follow its dialect)."""
        prompts = args.get("prompts", "tokens" if "tokenizer" in args else "chat")
        return _caps(prompts, teacher_forcing_route(args, prompts == "tokens"))

    @classmethod
    def check_args(cls, args: dict, spec: str) -> None:
        super().check_args(args, spec)
        if args.get("prompts", "chat") not in PROMPTS:
            raise PosbiasError(f"unknown prompts '{args['prompts']}' in model spec '{spec}'", f"use prompts= one of {', '.join(PROMPTS)}")
        if "dialect" in args:
            get_dialect(str(args["dialect"]))
        if args.get("prompts", "chat") != "chat" and "tokenizer" not in args:
            raise needs_tokenizer(args["prompts"])
        teacher_forcing_route(args, args.get("prompts", "tokens" if "tokenizer" in args else "chat") == "tokens")

    @classmethod
    def where(cls, args: dict) -> str:
        return str(args.get("base_url", DEFAULT_URL))

    @classmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "OpenAIBackend":
        return cls(args, progress)

    def _listed(self) -> list[dict]:
        """GET /models: reachable, key accepted, model served."""
        listed = self.http.get("/models", opening=True).get("data", [])
        ids = [m.get("id") for m in listed]
        if ids and self.model not in ids:
            raise PosbiasError(f"the server at {self.http.base_url} serves {', '.join(map(str, ids))}, not '{self.model}'",
                               f"use model={ids[0]} in the model spec")
        return listed

    def _too_long(self, status: int, message: str) -> PosbiasError | None:
        """A refusal of a prompt longer than the server's context window (None: another refusal), with the fix that
        works: the server's window in the model spec (posbias then refuses rows too long for it before sending)."""
        said = self.dialect.window_of(message)
        if said is None:
            return None
        window = said or self.served_window
        problem = f"the server refused a prompt longer than its context window (HTTP {status}: {message})"
        if self.tokenizer is None:  # chat messages: nothing counts their tokens here
            fix = ("add tokenizer=DIR (the served model's) to the model spec: posbias then counts each prompt's tokens "
                   "and refuses rows too long for the server before sending any")
        elif window is None or window < self.context_window:
            n = window or "N (the server's --max-model-len or --n_ctx)"
            fix = f"set context_window={n} in the model spec: posbias then refuses rows too long for it before sending any"
        else:  # posbias counted a chat prompt shorter than the server's own template made it
            fix = ("use shorter prompts (fewer facts or documents, a smaller size): the server's chat template makes "
                   "them longer than posbias counts")
        return served_error(problem, fix, False)

    def decoding(self) -> dict:
        fields = self.dialect.fields(self.prompts)
        return {"rule": "greedy" if self.dialect.exact_greedy else "greedy as far as the API goes (temperature 0)",
                "request": {**fields, "seed": self.seed}, "dialect": self.dialect.name}

    @property
    def in_flight(self) -> int:
        return self.concurrency * self.batch  # `concurrency` units of up to `batch` requests each

    def settings(self) -> dict:
        return {"concurrency": self.concurrency, "batch": self.batch, "timeout_s": self.http.timeout,
                "retries": self.http.retries, "cache": str(self.http.cache) if self.http.cache else None}

    def counters(self) -> dict:
        return dict(self.http.counts)

    def starting(self) -> None:
        self.http.stopped.clear()  # set when a request fails for good: the others are then not sent again

    def units(self, requests: list[Request]) -> Iterator[list[int]]:
        """Indices of the requests one HTTP request carries: up to `batch` neighbours of one kind and length limit."""
        unit: list[int] = []
        for i, q in enumerate(requests):
            if unit and (len(unit) == self.batch or _shape(requests[unit[0]]) != _shape(q)):
                yield unit
                unit = []
            unit.append(i)
        if unit:
            yield unit

    def send(self, qs: list[Request]) -> list[Reply]:
        """One HTTP request for `qs` (one chat message, one text prompt, or a list of token prompts)."""
        q = qs[0]
        common = {"model": self.model, **self.dialect.fields(self.prompts), "seed": self.seed}
        stop = {"stop": ["\n"]} if q.stop_newline and q.kind == "generate" else {}
        if self.prompts == "chat":
            tops = {"logprobs": True, "top_logprobs": q.top} if q.top else {}
            out = self.http.post("/chat/completions", {**common, **stop, **tops, "messages": q.messages,
                                                        "max_tokens": q.max_tokens})
            c = _choices(out, 1)[0]
            steps = [_step(e["token"], e["logprob"], {a["token"]: a["logprob"] for a in e.get("top_logprobs") or []})
                     for e in (c.get("logprobs") or {}).get("content") or []]
            return [Reply(tokens=steps, text=(c.get("message") or {}).get("content") or "",
                          finish=c.get("finish_reason") or "", **_usage(out))]
        if self.prompts == "text":
            prompt = self._text(q.ids)
        else:
            prompt = q.ids if len(qs) == 1 else [x.ids for x in qs]  # a single prompt as before (the same cache keys)
        if q.kind == "logprobs":
            body = {**common, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 2}
        else:
            tops = {"logprobs": q.top, **({"return_tokens_as_token_ids": True} if self.dialect.token_ids else {})} if q.top else {}
            body = {**common, **stop, **tops, "prompt": prompt, "max_tokens": q.max_tokens}
        out = self.http.post("/completions", body)
        usage = _usage(out)
        return [Reply(tokens=_prompt_steps(c, x) if x.kind == "logprobs" else _gen_steps(c), text=c.get("text") or "",
                      finish=c.get("finish_reason") or "", **(usage if k == 0 else {}))
                for k, (c, x) in enumerate(zip(_choices(out, len(qs)), qs))]

    def _text(self, ids: list[int]) -> str:
        """A row's prompt as text; the first time a prompt is seen, the server's tokenisation of it is checked."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        key = hash(tuple(ids))
        with self._lock:
            if key in self._checked:
                return text
        got = self.dialect.tokens_of(self.http.post(self.dialect.tokenize, self.dialect.tokenize_request(self.model, text),
                                                     root=True))
        if got != ids:
            at = next((i for i, (a, b) in enumerate(zip(ids, got)) if a != b), min(len(ids), len(got)))
            raise served_error(f"the server tokenises a prompt differently from the tokenizer posbias encoded it with "
                               f"(from token {at} on: {ids[at:at + 3]} here, {got[at:at + 3]} there; {len(ids)} vs "
                               f"{len(got)} tokens)", "give tokenizer= the served model's own (its directory or .gguf), "
                               "or use prompts=chat and `engine=generate`", False)
        with self._lock:
            self._checked.add(key)
            self.http.count(tokenize_checks=1)
        return text


def _caps(prompts: str, route: str) -> Capabilities:
    return Capabilities(prompt_logprobs=route == "prompt_logprobs", token_prompts=prompts != "chat", methods=False,
                        prefix_sharing=False, batching="requests", top_logprobs=True,
                        teacher_forcing=route if prompts != "chat" else "generate")


def _window(listed: list[dict], model: str) -> int | None:
    for m in listed:
        if m.get("id") == model and m.get("max_model_len"):
            return int(m["max_model_len"])
    return None


def _shape(q: Request) -> tuple:
    return (q.kind, q.max_tokens, q.stop_newline, q.top)


def _choices(out: dict, n: int) -> list[dict]:
    choices = sorted(out.get("choices") or [], key=lambda c: c.get("index", 0))
    if not choices:
        raise served_error("the server replied without choices", "check that it is an OpenAI-compatible endpoint", True)
    if len(choices) != n:
        raise served_error(f"the server answered {len(choices)} choices for {n} prompts",
                           "use batch=1 in the model spec (this server does not take a list of prompts)", True)
    return choices


def _usage(out: dict) -> dict:
    """The reply's token counts as the server gave them (None: it gave none)."""
    u = out.get("usage") or {}
    return {k: None if u.get(k) is None else int(u[k]) for k in ("prompt_tokens", "completion_tokens")}


def _refusal_hint(dialect: str, prompts: str) -> str:
    """The fix for a request the server refused (4xx, or a llama-cpp-python 500): another prompt protocol."""
    sent = f"this {dialect} server refused a request posbias sends with prompts={prompts}"
    if prompts == "tokens":
        return f"{sent}: try prompts=text in the model spec"
    if prompts == "text":  # chat teacher-forces order tasks only: generation runs every task
        return f"{sent}: try prompts=chat in the model spec and `engine=generate`"
    return ("this server refuses a field posbias sends for greedy decoding or logprobs (its reason above): on an order "
            "task use `engine=generate` (no logprobs asked); otherwise the server cannot be measured as it is")


def _token(t) -> int | str:
    """A listed token: its id where the server gives one ("token_id:123", vLLM's return_tokens_as_token_ids), else
    its text."""
    return int(t[9:]) if isinstance(t, str) and t.startswith("token_id:") and t[9:].isdigit() else t


def _step(token, logprob, alts: dict) -> Step:
    return (_token(token), float(logprob), {_token(k): float(v) for k, v in alts.items()})


def _gen_steps(choice: dict) -> list[Step]:
    """Generated tokens of a completion choice (the legacy logprobs object: tokens, token_logprobs, top_logprobs)."""
    lp = choice.get("logprobs") or {}
    tops = lp.get("top_logprobs") or [None] * len(lp.get("tokens") or [])
    return [_step(t, v, top or {}) for t, v, top in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], tops)]


def _prompt_steps(choice: dict, q: Request) -> list[Step]:
    """Reply.tokens from a choice's prompt_logprobs (vLLM's JSON: per position None or {"id": {logprob, rank}})."""
    plp = choice.get("prompt_logprobs")
    if not plp or len(plp) != len(q.ids):
        raise served_error("the server returned no prompt logprobs for a teacher-forced row",
                           "use teacher_forcing=generate in the model spec (greedy generation, any server)", False)
    return prompt_steps([e and {int(k): float(v["logprob"]) for k, v in e.items()} for e in plp], q)
