"""Scoring engines: how a batch of encoded rows becomes verdicts.

  teacher-forced  one forward of prompt + each accepted answer; correct iff greedy decoding would
                  emit that answer token by token (teacher_forced.py)
  generate        batched greedy generation with the KV cache, cut at the first newline, scored
                  with the task's metric (generate.py)

Both also score rows that continue a cached spine (prefix sharing, eval/prefix.py): `score(..., shared=)`.

Each engine also says how many context tokens a row needs (the window check) and how many padded
tokens it costs (the batch planner), so the Scorer never branches on the engine.

On a served backend (backends/) an engine is a protocol over requests: `requests` says what to ask for a row,
`verdict` turns the replies into the same dict the in-process path gives. Teacher forcing reads each answer
token's rank among the prompt logprobs: greedy iff rank 1, or, in a tie, iff the in-process rule would pick it
(torch's argmax takes the lowest token id among equal logits; a served reply shows the top token, so a two-way
tie is decided exactly and a wider tie counts as not greedy).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

from ..backends import Reply, Request
from ..core.metrics import METRICS, first_line
from ..core.order import parse_choice
from ..errors import PosbiasError
from ..methods import Active
from ..models.load import Loaded
from ..tasks import Task
from .encode import Encoded, render
from .generate import generate_limited
from .teacher_forced import option_verdict, score_teacher_forced


class ScorerView(Protocol):
    """What an engine reads from the scorer (eval.scorer.Scorer); a protocol, so engines import nothing back."""

    loaded: Loaded
    task: Task
    max_new_tokens: int
    backend: Any


class Engine(ABC):
    name: ClassVar[str]
    reads_options: ClassVar[bool] = False  # an order task's labels are scored as next tokens (encode: option_ids)

    @abstractmethod
    def need(self, row: Encoded, max_new_tokens: int) -> int:
        """Context tokens the row needs (prompt plus what is scored or generated after it)."""

    def cost(self, row: Encoded, max_new_tokens: int) -> int:
        """Padded tokens the row adds to a batch."""
        return self.need(row, max_new_tokens)

    def score(self, scorer: ScorerView, batch: list[Encoded], active: Active, shared: tuple | None = None) -> list[dict]:
        """One dict per row: correct (the task's metric), prediction, the task's further metrics (and logprob
        for teacher forcing). shared = (spine_kv, owner, plen): the rows continue cached spines (eval/prefix.py)."""
        return [self.also(scorer, r, row) for r, row in zip(self._predict(scorer, batch, active, shared), batch)]

    @staticmethod
    def also(scorer: ScorerView, result: dict, row: Encoded) -> dict:
        """The task's further metrics of a result, added to it."""
        result.update({m: METRICS[m](result["prediction"], row.prompt.answers) for m in scorer.task.also})
        return result

    def check(self, caps, backend: str) -> None:  # noqa: B027 - most protocols run on every backend
        """Refuse (one line) a backend (its capabilities and name) this protocol cannot run on."""

    @abstractmethod
    def requests(self, scorer: ScorerView, row: Encoded) -> list[Request]:
        """What to ask a served backend for one row."""

    @abstractmethod
    def verdict(self, scorer: ScorerView, row: Encoded, replies: list[Reply]) -> dict:
        """correct and prediction (and logprob) of a row from its replies, in the order of `requests`."""

    @abstractmethod
    def _predict(self, scorer: ScorerView, batch: list[Encoded], active: Active | None, shared: tuple | None) -> list[dict]:
        """correct and prediction per row (shared: row i continues spine owner[i] after its first plen[i] tokens)."""

    @abstractmethod
    def branch(self, row: Encoded, p: int, max_new_tokens: int) -> tuple[int, int]:
        """(sequences, padded tokens per sequence) the row runs after reusing p spine tokens (the shared planner)."""


class TeacherForced(Engine):
    name = "teacher-forced"
    reads_options = True

    def need(self, row: Encoded, max_new_tokens: int) -> int:
        return len(row.prompt_ids) + max(map(len, row.answer_ids))

    def cost(self, row: Encoded, max_new_tokens: int) -> int:
        return self.need(row, max_new_tokens) * len(row.answer_ids)  # answer variants share a batch

    def _predict(self, scorer: ScorerView, batch: list[Encoded], active: Active | None, shared: tuple | None) -> list[dict]:
        tok = scorer.loaded.tokenizer
        return score_teacher_forced(scorer.loaded.model, tok, batch, tok.pad_token_id,
                                    active.set_prompt_end if active else None, shared=shared)

    def branch(self, row: Encoded, p: int, max_new_tokens: int) -> tuple[int, int]:
        return len(row.answer_ids), len(row.prompt_ids) - p + max(map(len, row.answer_ids))

    def check(self, caps, backend: str) -> None:
        if not caps.prompt_logprobs:
            raise PosbiasError(f"teacher forcing needs prompt logprobs, which backend '{backend}' does not give with "
                               "chat prompts", "use `engine=generate`, or token "
                               "prompts on a server with prompt_logprobs (vLLM, SGLang: prompts=tokens,tokenizer=DIR)")

    def requests(self, scorer: ScorerView, row: Encoded) -> list[Request]:
        n = len(row.prompt_ids)
        if row.option_ids:  # an order task: each option label's logprob as the next token
            return [Request("logprobs", ids=row.prompt_ids + [t], start=n) for t in row.option_ids]
        return [Request("logprobs", ids=row.prompt_ids + a, start=n) for a in row.answer_ids]

    def verdict(self, scorer: ScorerView, row: Encoded, replies: list[Reply]) -> dict:
        if row.option_ids:
            return option_verdict(row, [rep.tokens[0][0] for rep in replies])
        tok = scorer.backend.tokenizer
        best = None
        for ans, rep in zip(row.answer_ids, replies):
            hits = [_greedy(a, t) for a, t in zip(ans, rep.tokens)]
            ok = all(hits)
            pred = [a if hit else t[2] for a, hit, t in zip(ans, hits, rep.tokens)]
            if best is None or (ok and not best["correct"]):
                best = {"correct": ok, "prediction": tok.decode(pred, skip_special_tokens=True),
                        "logprob": sum(t[0] for t in rep.tokens) if best is None else best["logprob"]}
        return best  # type: ignore[return-value]


class Generate(Engine):
    name = "generate"

    def need(self, row: Encoded, max_new_tokens: int) -> int:
        return len(row.prompt_ids) + max_new_tokens

    def _predict(self, scorer: ScorerView, batch: list[Encoded], active: Active | None, shared: tuple | None) -> list[dict]:
        tok = scorer.loaded.tokenizer
        preds = generate_limited(scorer.loaded.model, tok, batch, tok.pad_token_id, scorer.max_new_tokens,
                                 multiline=scorer.task.multiline, shared=shared)
        return [self._judge(scorer, p, r, cut) for (p, cut), r in zip(preds, batch)]

    @staticmethod
    def _judge(scorer: ScorerView, pred: str, row: Encoded, cut: bool) -> dict:
        """correct and prediction of a generated answer, and whether max_new_tokens cut it short; on an order task
        also the option it names (-1: none)."""
        if row.prompt.options:
            choice = parse_choice(pred, row.prompt.options)
            return {"correct": choice == row.prompt.position, "prediction": pred, "choice": choice, "cut": cut}
        return {"correct": METRICS[scorer.task.metric](pred, row.prompt.answers), "prediction": pred, "cut": cut}

    def branch(self, row: Encoded, p: int, max_new_tokens: int) -> tuple[int, int]:
        return 1, len(row.prompt_ids) - p + max_new_tokens

    def requests(self, scorer: ScorerView, row: Encoded) -> list[Request]:
        stop = not scorer.task.multiline
        if scorer.backend.caps.token_prompts:
            return [Request("generate", ids=row.prompt_ids, max_tokens=scorer.max_new_tokens, stop_newline=stop)]
        text = render(None, row.prompt, chat=False)  # a chat-only server: one user message, its answer prefix after it
        return [Request("generate", messages=[{"role": "user", "content": text}], max_tokens=scorer.max_new_tokens,
                        stop_newline=stop)]

    def verdict(self, scorer: ScorerView, row: Encoded, replies: list[Reply]) -> dict:
        text = replies[0].text
        return self._judge(scorer, text.strip() if scorer.task.multiline else first_line(text), row,
                           replies[0].finish == "length")


def _greedy(token: int, reply: tuple[float, int, int, float]) -> bool:
    """Whether the in-process argmax would pick `token` (see the module docstring for ties)."""
    logprob, rank, top, top_logprob = reply
    return rank == 1 or (rank == 2 and top_logprob == logprob and token < top)


ENGINES: dict[str, Engine] = {e.name: e for e in (TeacherForced(), Generate())}


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise PosbiasError(f"unknown engine '{name}'", f"use `engine` {' or '.join(ENGINES)}")
    return ENGINES[name]
