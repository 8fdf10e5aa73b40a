"""The backend interface: what runs the model, and what it can do.

A backend declares its capabilities; the Scorer and the scoring protocols (eval/engines.py) read those and never
a backend's name. The in-process backend (hf.py) scores padded batches itself (methods, prefix sharing, hooks);
a served backend (openai.py, vllm.py) answers `Request`s, many in flight, and yields each `Reply` as it arrives
so the rows it completes are written at once (a killed run resumes without sending them again).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from ..errors import PosbiasError


@dataclass(frozen=True)
class Capabilities:
    prompt_logprobs: bool  # the rank and logprob of each given prompt token: teacher forcing
    token_prompts: bool  # prompts go as token ids (the very rows the hf path scores); else chat messages
    methods: bool  # training-free methods (hooks on an in-process module)
    prefix_sharing: bool  # posbias's own prefix sharing (a served engine has its own prefix cache)
    batching: str  # "padded": the Scorer plans padded-token batches | "requests": one request per sequence, many in flight


@dataclass
class Request:
    """One thing to ask a served model. kind "logprobs": the rank / logprob of every token of `ids` from `start`
    on (teacher forcing); kind "generate": greedy continuation of `ids` (or of `messages` on a chat-only server),
    at most max_tokens, stopped at a newline when stop_newline."""

    kind: str
    ids: list[int] | None = None
    start: int = 0
    messages: list[dict] | None = None
    max_tokens: int = 1
    stop_newline: bool = True


@dataclass
class Reply:
    """logprobs: per scored token (its logprob, its rank as vLLM counts it: 1 + the tokens at least as likely,
    the top token's id, the top token's logprob); generate: the text. Token counts as the server gave them."""

    tokens: list[tuple[float, int, int, float]] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish: str = ""  # why generation stopped, as the server says ("length": cut at max_tokens; "stop")


def prompt_ranks(positions: list, q: Request) -> list[tuple[float, int, int, float]]:
    """Reply.tokens of a teacher-forced request from prompt logprobs as vLLM gives them: per prompt position a dict
    {token id: (logprob, rank)} holding the actual token and the top-1 token; read from q.start on."""
    res = []
    for j in range(q.start, len(q.ids)):
        entry = positions[j]
        logprob, rank = entry[q.ids[j]]
        top = min(entry, key=lambda t: (entry[t][1], t))
        res.append((float(logprob), int(rank), int(top), float(entry[top][0])))
    return res


class Backend(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    ARGS: ClassVar[dict[str, str]] = {}  # the keys a model spec may give (key -> help); PASS_THROUGH: any key
    PASS_THROUGH: ClassVar[bool] = False
    caps: Capabilities
    tokenizer: Any  # the model's tokenizer (None: a chat-only server without one)
    info: dict  # JSON-able description for the run's record (never a secret)

    @classmethod
    @abstractmethod
    def capabilities(cls, args: dict) -> Capabilities:
        """What a backend opened with these spec arguments can do (known before it starts)."""

    @classmethod
    def check_args(cls, args: dict, spec: str) -> None:
        if "model" not in args:
            raise PosbiasError(f"model spec '{spec}' names no model", f"write {cls.name}:MODEL,... or {cls.name}:model=NAME,...")
        unknown = [k for k in args if k not in cls.ARGS and k != "model"]
        if unknown and not cls.PASS_THROUGH:
            raise PosbiasError(f"backend '{cls.name}' takes no '{unknown[0]}' (model spec '{spec}')",
                               f"use keys among: model, {', '.join(cls.ARGS)}")

    @classmethod
    @abstractmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "Backend":
        """Load or connect (an engine start, a reachability and key check)."""

    def check_method(self, method) -> None:
        """Refuse a training-free method the backend cannot apply (in one line), else the method's own check."""
        check_method(self.caps, self.name, method)

    @property
    def context_window(self) -> int:
        return int(self.info["context_window"])

    def counters(self) -> dict:
        """Requests, tokens, retries and cache hits since the backend opened (served backends)."""
        return {}

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (an engine, connections)."""


def check_method(caps: Capabilities, backend: str, method) -> None:
    """Refuse, in one line, a method that changes the model on a backend without methods (known before it starts)."""
    if getattr(method, "reads_attention", False) and not caps.methods:
        raise PosbiasError(f"method '{method.label}' reads the model's attention in process, but backend '{backend}' "
                           "serves the model as it is", "use a relevance signal a server can give (reorder:bm25, "
                           "reorder:oracle), or load the model in process (model=hf:DIR)")
    if getattr(method, "changes_model", True) and not caps.methods:
        raise PosbiasError(f"method '{method.label}' changes the model in process, but backend '{backend}' "
                           "serves the model as it is", "apply no method (none) to a served model, or load the model "
                           "in process (model=hf:DIR) to apply one")


class ServedBackend(Backend):
    """A model some engine runs: requests in, replies out, as they complete."""

    @abstractmethod
    def run(self, requests: list[Request]) -> Iterator[tuple[int, Reply]]:
        """(index into `requests`, reply) for each request, in the order they complete."""

    def settings(self) -> dict:
        """How requests are sent (concurrency, timeout, cache, ...): recorded, not part of the fingerprint."""
        return {}
