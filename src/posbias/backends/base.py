"""The backend interface: what runs the model, and what it can do.

A backend declares its capabilities; the Scorer and the scoring protocols (scoring/engines.py) read those and never
a backend's name. The in-process backend (hf.py) scores padded batches itself (methods, prefix sharing, hooks);
a served backend (openai.py, vllm.py) answers `Request`s, many in flight, and yields each `Reply` as it arrives
so the rows it completes are written at once (a killed run resumes without sending them again).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from ..errors import PosbiasError


@dataclass(frozen=True)
class Capabilities:
    prompt_logprobs: bool  # the logprob of each given prompt token and its most likely alternatives
    token_prompts: bool  # the model reads the very token ids posbias encoded (sent as ids, or as text whose
    #                      tokenisation the server was checked to give the same); else chat messages it renders
    methods: bool  # training-free methods (hooks on an in-process module)
    prefix_sharing: bool  # posbias's own prefix sharing (a served engine has its own prefix cache)
    batching: str  # "padded": the Scorer plans padded-token batches | "requests": one request per sequence, many in flight
    top_logprobs: bool = False  # generated tokens come with their most likely alternatives (ids, or text)
    teacher_forcing: str = ""  # its route: "forward" (in process: one forward of prompt + answer) | served, "generate"
    #                            (greedy generation) or "prompt_logprobs" | "" (none)


@dataclass
class Request:
    """One thing to ask a served model.
    kind "logprobs": the logprob of every token of `ids` from `start` on, with the top alternatives (teacher forcing);
    kind "generate": greedy continuation of `ids` (or of `messages` on a chat server), at most max_tokens, stopped
    at a newline when stop_newline; with top > 0 each generated token comes with its `top` alternatives."""

    kind: str
    ids: list[int] | None = None
    start: int = 0
    messages: list[dict] | None = None
    max_tokens: int = 1
    stop_newline: bool = True
    top: int = 0


# One scored or generated token: (the token: its id, or its text where a server gives only text; its logprob;
# {alternative: logprob} as the engine listed them, the token itself among them where listed)
Step = tuple[int | str, float, dict]


@dataclass
class Reply:
    """logprobs: a Step per scored prompt token; generate: the text (and, when asked with top > 0, a Step per
    generated token). Token counts as the server gave them (None: it gave none)."""

    tokens: list[Step] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish: str = ""  # why generation stopped, as the server says ("length": cut at max_tokens; "stop")


ROUTES = ("generate", "prompt_logprobs")  # how a served backend teacher-forces (scoring/engines.py)


def teacher_forcing_route(args: dict, prompt_logprobs: bool = True) -> str:
    """A model spec's `teacher_forcing` key: greedy generation (default) or prompt logprobs, the latter only where
    the backend can give them; refused in one line otherwise."""
    route = str(args.get("teacher_forcing", "generate"))
    if route not in ROUTES:
        raise PosbiasError(f"unknown teacher_forcing '{route}' in the model spec", f"use teacher_forcing= one of {', '.join(ROUTES)}")
    if route == "prompt_logprobs" and not prompt_logprobs:
        raise PosbiasError("teacher_forcing=prompt_logprobs needs token prompts on a server with prompt_logprobs (vLLM)",
                           "use teacher_forcing=generate (greedy generation, any server)")
    return route


def is_greedy(token: int, logprob: float, alts: dict) -> bool:
    """Whether the in-process argmax (the lowest id among equal logits) picks `token`, decided from the values the
    engine listed, never from where it ranked them (vLLM's V1 engine numbers tied entries by their place in topk).
    A tie wider than the listed alternatives could hide a lower tied id (docs/backends.md, "Ties")."""
    return all(lp < logprob or (lp == logprob and int(t) >= token) for t, lp in alts.items())


def prompt_steps(positions: list, q: Request) -> list[Step]:
    """Reply.tokens of a teacher-forced request from prompt logprobs: per prompt position a dict {token id:
    logprob} holding the actual token and the engine's top alternatives; read from q.start on."""
    return [(q.ids[j], float(positions[j][q.ids[j]]), positions[j]) for j in range(q.start, len(q.ids))]


class Backend(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    ARGS: ClassVar[dict[str, str]] = {}  # the keys a model spec may give (key -> help); PASS_THROUGH: any key
    PASS_THROUGH: ClassVar[bool] = False
    TRANSPORT: ClassVar[frozenset] = frozenset()  # keys that say how requests travel, not what answers: free on resume
    caps: Capabilities
    tokenizer: Any  # the model's tokenizer (None: a chat-only server without one)
    info: dict  # JSON-able description for the run's record (never a secret)
    loaded: Any = None  # the model in process (models.load.Loaded) where the backend holds one (hf); None: served

    @classmethod
    @abstractmethod
    def capabilities(cls, args: dict) -> Capabilities:
        """What a backend opened with these spec arguments can do (known before it starts)."""

    @classmethod
    def tokenizer_source(cls, args: dict) -> str | None:
        """Where the model's tokenizer loads from without the model (`posbias show`): the model itself by default;
        None where the spec names none (a served model whose prompts the server renders)."""
        return args.get("model")

    @classmethod
    def check_args(cls, args: dict, spec: str) -> None:
        if "model" not in args:
            raise PosbiasError(f"model spec '{spec}' names no model", f"write {cls.name}:MODEL,... or {cls.name}:model=NAME,...")
        unknown = [k for k in args if k not in cls.ARGS and k != "model"]
        if unknown and not cls.PASS_THROUGH:
            raise PosbiasError(f"backend '{cls.name}' takes no '{unknown[0]}' (model spec '{spec}')",
                               f"use keys among: model, {', '.join(cls.ARGS)}")

    @classmethod
    def where(cls, args: dict) -> str | None:
        """Where a served model is reached (a URL), for the CLI's "connecting to" line; None: loaded here."""
        return None

    @classmethod
    @abstractmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "Backend":
        """Load or connect (an engine start, a reachability and key check)."""

    def check_method(self, method) -> None:
        """Refuse a training-free method the backend cannot apply (in one line), else the method's own check."""
        check_method(self.caps, self.name, method)
        method.check_info(self.info)

    @property
    def in_flight(self) -> int:
        """Requests the backend keeps in flight at once (a served run's budget windows hold this many)."""
        return 1

    @property
    def context_window(self) -> int:
        return int(self.info["context_window"])

    def counters(self) -> dict:
        """Requests, tokens, retries and cache hits since the backend opened (served backends)."""
        return {}

    @abstractmethod
    def decoding(self) -> dict:
        """How the model decodes, for the run's record: the rule and every field that makes it greedy."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (an engine, connections)."""


def check_method(caps: Capabilities, backend: str, method) -> None:
    """Refuse, in one line, a method that changes the model on a backend without methods (known before it starts)."""
    if method.reads_attention and not caps.methods:
        raise PosbiasError(f"method '{method.label}' reads the model's attention in process, but backend '{backend}' "
                           "serves the model as it is", "use a relevance signal a server can give (reorder:bm25, "
                           "reorder:oracle), or load the model in process (model=hf:DIR)")
    if method.changes_model and not caps.methods:
        raise PosbiasError(f"method '{method.label}' changes the model in process, but backend '{backend}' "
                           "serves the model as it is", "apply no method (none) to a served model, or load the model "
                           "in process (model=hf:DIR) to apply one")


class RunStopped(PosbiasError):
    """A request not sent because another one failed for good: that one's error is the run's."""


def _completed(pending: dict) -> Iterator[tuple[int, Reply]]:
    """The replies of the units that completed next (pending: future -> unit, emptied of them). A unit refused because
    the run stopped is reported last, and only when no unit failed for its own reason: the first error is the run's."""
    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
    for f in sorted(finished, key=lambda f: isinstance(f.exception(), RunStopped)):
        unit = pending.pop(f)
        if isinstance(f.exception(), RunStopped):
            wait(pending)  # the request that stopped the run may still be finishing
            own = [g.exception() for g in pending if g.exception() is not None]
            cause = next((e for e in own if not isinstance(e, RunStopped)), None)
            if cause is not None:
                raise cause
        yield from zip(unit, f.result())


class ServedBackend(Backend):
    """A model some engine runs: requests in, replies out, as they complete. The in-flight loop is here: `run` sends
    the `units` of the requests (one request each by default) through `send`, `concurrency` of them in flight, and
    yields each reply as it completes; a backend supplies `send` (its payload, headers and reading of the reply), or
    overrides `run` where its engine takes the requests another way (vLLM's offline engine: chunks of them)."""

    concurrency: int = 1  # units in flight at once

    @property
    def in_flight(self) -> int:
        return self.concurrency

    def run(self, requests: list[Request]) -> Iterator[tuple[int, Reply]]:
        """(index into `requests`, reply) for each request, in the order they complete."""
        self.starting()
        pool = ThreadPoolExecutor(self.concurrency)
        pending: dict = {}
        try:
            for unit in self.units(requests):  # keep `concurrency` units in flight (bounded: a failure stops early)
                pending[pool.submit(self.send, [requests[i] for i in unit])] = unit
                if len(pending) < self.concurrency:
                    continue
                yield from _completed(pending)
            while pending:
                yield from _completed(pending)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def starting(self) -> None:  # noqa: B027 - most backends need nothing before a run
        """Before the requests of one `run` are sent."""

    def units(self, requests: list[Request]) -> Iterator[list[int]]:
        """The indices of the requests each `send` carries: one each by default."""
        for i in range(len(requests)):
            yield [i]

    def send(self, qs: list[Request]) -> list[Reply]:
        """The replies to one unit of requests, in their order (a backend that uses the default `run` supplies it)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither `send` nor `run`")

    def settings(self) -> dict:
        """How requests are sent (concurrency, timeout, cache, ...): recorded, not part of the fingerprint."""
        return {}
