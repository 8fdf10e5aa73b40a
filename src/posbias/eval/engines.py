"""Scoring engines: how a batch of encoded rows becomes verdicts.

  teacher-forced  one forward of prompt + each accepted answer; correct iff greedy decoding would
                  emit that answer token by token (teacher_forced.py)
  generate        batched greedy generation with the KV cache, cut at the first newline, scored
                  with the task's metric (generate.py)

Both also score rows that continue a cached spine (prefix sharing, eval/prefix.py): `score(..., shared=)`.

Each engine also says how many context tokens a row needs (the window check) and how many padded
tokens it costs (the batch planner), so the Scorer never branches on the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

from ..core.metrics import METRICS
from ..errors import PosbiasError
from ..methods import Active
from ..models.load import Loaded
from ..tasks import Task
from .encode import Encoded
from .generate import generate_greedy
from .teacher_forced import score_teacher_forced


class ScorerView(Protocol):
    """What an engine reads from the scorer (eval.scorer.Scorer); a protocol, so engines import nothing back."""

    loaded: Loaded
    task: Task
    max_new_tokens: int


class Engine(ABC):
    name: ClassVar[str]

    @abstractmethod
    def need(self, row: Encoded, max_new_tokens: int) -> int:
        """Context tokens the row needs (prompt plus what is scored or generated after it)."""

    def cost(self, row: Encoded, max_new_tokens: int) -> int:
        """Padded tokens the row adds to a batch."""
        return self.need(row, max_new_tokens)

    def score(self, scorer: ScorerView, batch: list[Encoded], active: Active, shared: tuple | None = None) -> list[dict]:
        """One dict per row: correct (the task's metric), prediction, the task's further metrics (and logprob
        for teacher forcing). shared = (spine_kv, owner, plen): the rows continue cached spines (eval/prefix.py)."""
        out = self._predict(scorer, batch, active, shared)
        for r, row in zip(out, batch):
            r.update({m: METRICS[m](r["prediction"], row.prompt.answers) for m in scorer.task.also})
        return out

    @abstractmethod
    def _predict(self, scorer: ScorerView, batch: list[Encoded], active: Active | None, shared: tuple | None) -> list[dict]:
        """correct and prediction per row (shared: row i continues spine owner[i] after its first plen[i] tokens)."""

    @abstractmethod
    def branch(self, row: Encoded, p: int, max_new_tokens: int) -> tuple[int, int]:
        """(sequences, padded tokens per sequence) the row runs after reusing p spine tokens (the shared planner)."""


class TeacherForced(Engine):
    name = "teacher-forced"

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


class Generate(Engine):
    name = "generate"

    def need(self, row: Encoded, max_new_tokens: int) -> int:
        return len(row.prompt_ids) + max_new_tokens

    def _predict(self, scorer: ScorerView, batch: list[Encoded], active: Active | None, shared: tuple | None) -> list[dict]:
        tok = scorer.loaded.tokenizer
        preds = generate_greedy(scorer.loaded.model, tok, batch, tok.pad_token_id, scorer.max_new_tokens,
                                multiline=scorer.task.multiline, shared=shared)
        metric = METRICS[scorer.task.metric]
        return [{"correct": metric(p, r.prompt.answers), "prediction": p} for p, r in zip(preds, batch)]

    def branch(self, row: Encoded, p: int, max_new_tokens: int) -> tuple[int, int]:
        return 1, len(row.prompt_ids) - p + max_new_tokens


ENGINES: dict[str, Engine] = {e.name: e for e in (TeacherForced(), Generate())}


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise PosbiasError(f"unknown engine '{name}'", f"use `engine` {' or '.join(ENGINES)}")
    return ENGINES[name]
