"""Scoring engines: how a batch of encoded rows becomes verdicts.

  teacher-forced  one forward of prompt + each accepted answer; correct iff greedy decoding would
                  emit that answer token by token (teacher_forced.py)
  generate        batched greedy generation with the KV cache, cut at the first newline, scored
                  with the task's metric (generate.py)

Both also score rows that continue a cached spine (prefix sharing, scoring/prefix.py): `score(..., shared=)`.

Each engine also says how many context tokens a row needs (the window check) and how many padded
tokens it costs (the batch planner), so the Scorer never branches on the engine.

On a served backend (backends/) an engine is a protocol over requests: `requests` says what to ask for a row,
`verdict` turns the replies into the same dict the in-process path gives. Teacher forcing on a served model
(its capabilities' `teacher_forcing` route):
  generate         "every answer token is the greedy choice" is "greedy generation begins with the answer's
                   tokens": one generation of the longest answer's length per row, compared token by token (ids,
                   or each token's text where the server lists text); the engine's own argmax breaks ties, which
                   on vLLM and llama.cpp is the in-process rule (the lowest id). The row's logprob is known only
                   when the first answer was generated (else None); its prediction is the greedy continuation.
  prompt_logprobs  each answer token's logprob among the engine's top-2 alternatives: greedy iff no listed
                   alternative is more likely or as likely with a lower id (backends.base.is_greedy: decided from
                   the values, not from where the engine ranks them).
An order task reads its labels from the first generated token's top logprobs (a chat server too): a label missing
from the list counts as less likely than every listed token.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol

from ..backends import Reply, Request
from ..backends.base import Step, is_greedy
from ..core.metrics import METRICS, first_line
from ..errors import PosbiasError
from ..methods import Active
from ..models.load import Loaded
from ..registry import Registry
from ..tasks import Task
from .encode import Encoded, render
from .generate import decode_shared, generate_limited
from .teacher_forced import option_verdict, score_teacher_forced


class ScorerView(Protocol):
    """What an engine reads from the scorer (scoring.scorer.Scorer); a protocol, so engines import nothing back."""

    loaded: Loaded
    task: Task
    max_new_tokens: int
    backend: Any

    def count_tokens(self, text: str) -> int: ...


TOP_LABELS = 20  # alternatives asked for with an order task's first generated token (OpenAI's API allows 20)


class Engine(ABC):
    name: ClassVar[str]
    kind: ClassVar[str]  # the protocol it is, "teacher-forced" or "generate": what tasks, methods and configs check
    #                      (an engine registered under its own name that subclasses one of these inherits its kind)
    reads_options: ClassVar[bool] = False  # an order task's labels are scored as next tokens (encode: option_ids)
    shared_settings: ClassVar[dict] = {}  # what score_shared does beyond one batch at a time, for the run's record

    @abstractmethod
    def need(self, row: Encoded, max_new_tokens: int) -> int:
        """Context tokens the row needs (prompt plus what is scored or generated after it)."""

    def cost(self, row: Encoded, max_new_tokens: int) -> int:
        """Padded tokens the row adds to a batch."""
        return self.need(row, max_new_tokens)

    def score(self, scorer: ScorerView, batch: list[Encoded], active: Active, shared: tuple | None = None) -> list[dict]:
        """One dict per row: correct (the task's metric), prediction, the task's further metrics (and logprob
        for teacher forcing). shared = (spine_kv, owner, plen, split): the rows continue cached spines (scoring/prefix.py)."""
        return [self.also(scorer, r, row) for r, row in zip(self._predict(scorer, batch, active, shared), batch)]

    def score_shared(self, scorer: ScorerView, parts: list[tuple[list[Encoded], tuple]],
                     finished: Callable[[list[Encoded]], bool]) -> Iterator[tuple[list[Encoded], list[dict]]]:
        """The branch batches of one example group on the prefix-shared path, parts = [(batch, shared), ...]:
        (batch, its results) for each, in order, but those `finished` says a resumed run already holds. Here one
        batch at a time; an engine that shares work across batches plans it over all of them, done or not, so a
        resumed run computes every row in the company it had."""
        for batch, shared in parts:
            if not finished(batch):
                yield batch, self.score(scorer, batch, None, shared)  # type: ignore[arg-type]

    @staticmethod
    def also(scorer: ScorerView, result: dict, row: Encoded) -> dict:
        """The task's further metrics of a result, added to it."""
        result.update({m: METRICS[m](result["prediction"], row.prompt.answers) for m in scorer.task.also})
        return result

    def check(self, caps, backend: str, task: Task | None = None) -> None:  # noqa: B027 - most run on every backend
        """Refuse (one line) a backend (its capabilities and name) this protocol cannot run on (for `task`, if given)."""

    @abstractmethod
    def requests(self, scorer: ScorerView, row: Encoded, caps=None) -> list[Request]:
        """What to ask a served backend for one row (caps: a backend's capabilities other than the scorer's, as the
        in-process runner prices a row: runners.InProcess.price)."""

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
    name = kind = "teacher-forced"
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

    def check(self, caps, backend: str, task: Task | None = None) -> None:
        if not caps.teacher_forcing:
            raise PosbiasError(f"backend '{backend}' offers no route for teacher forcing", "use `engine=generate`")
        if not caps.token_prompts and task is not None and not task.order:
            raise PosbiasError("teacher forcing on chat messages scores order tasks only (their labels from the first "
                               "token's top logprobs)", "use `engine=generate`, or prompts=text (or tokens) with "
                               "tokenizer=DIR in the model spec")

    def requests(self, scorer: ScorerView, row: Encoded, caps=None) -> list[Request]:
        n, order, caps = len(row.prompt_ids), bool(row.prompt.options), caps or scorer.backend.caps
        if caps.teacher_forcing == "prompt_logprobs":
            if order:  # each option label's logprob as the next token
                return [Request("logprobs", ids=row.prompt_ids + [t], start=n) for t in row.option_ids]
            return [Request("logprobs", ids=row.prompt_ids + a, start=n) for a in row.answer_ids]
        if order:
            return [_prompt_request(caps, row, max_tokens=1, stop_newline=False, top=TOP_LABELS)]
        return [_prompt_request(caps, row, max_tokens=max(map(len, row.answer_ids)), stop_newline=False, top=1)]

    def verdict(self, scorer: ScorerView, row: Encoded, replies: list[Reply]) -> dict:
        if scorer.backend.caps.teacher_forcing != "prompt_logprobs":
            if row.prompt.options:
                return _label_verdict(scorer, row, replies[0].tokens)
            return _generated_verdict(scorer, row, replies[0])
        if row.option_ids:
            return option_verdict(row, [rep.tokens[0][1] for rep in replies])
        tok = scorer.backend.tokenizer
        best = None
        for ans, rep in zip(row.answer_ids, replies):
            hits = [is_greedy(a, lp, alts) for a, (_, lp, alts) in zip(ans, rep.tokens)]
            ok = all(hits)
            pred = [a if hit else _top(alts) for a, hit, (_, _, alts) in zip(ans, hits, rep.tokens)]
            if best is None or (ok and not best["correct"]):
                best = {"correct": ok, "prediction": tok.decode(pred, skip_special_tokens=True),
                        "logprob": sum(t[1] for t in rep.tokens) if best is None else best["logprob"]}
        return best  # type: ignore[return-value]


class Generate(Engine):
    name = kind = "generate"
    shared_settings = {"decode": "joined"}  # score_shared: the decode steps of consecutive branch batches shared

    def need(self, row: Encoded, max_new_tokens: int) -> int:
        return len(row.prompt_ids) + max_new_tokens

    def _predict(self, scorer: ScorerView, batch: list[Encoded], active: Active | None, shared: tuple | None) -> list[dict]:
        tok = scorer.loaded.tokenizer
        preds = generate_limited(scorer.loaded.model, tok, batch, tok.pad_token_id, scorer.max_new_tokens,
                                 multiline=scorer.task.multiline, shared=shared)
        return [self._judge(scorer, p, r, cut) for (p, cut), r in zip(preds, batch)]

    def score_shared(self, scorer: ScorerView, parts: list[tuple[list[Encoded], tuple]],
                     finished: Callable[[list[Encoded]], bool]) -> Iterator[tuple[list[Encoded], list[dict]]]:
        """Each branch batch prefilled on its own, their decode steps shared (generate.decode_shared: a step costs
        about the same for 5 rows as for 30), in runs of consecutive batches of at most max_batch rows and
        batch_tokens cache columns (rows x (their widest spine cut + branch + max_new_tokens)), the budgets of
        every batch; the settings' `decode` says so. A run is planned over the whole group and run again whole
        unless all its batches are finished, so a resumed row decodes beside the rows it had (bf16 arithmetic can
        depend on the batch)."""
        tok, n_new = scorer.loaded.tokenizer, scorer.max_new_tokens
        for run in _decode_runs(parts, scorer.batch_tokens, scorer.max_batch, n_new):
            if all(finished(batch) for batch, _ in run):
                continue
            preds = iter(decode_shared(scorer.loaded.model, tok, run, n_new, multiline=scorer.task.multiline))
            for batch, _ in run:
                yield batch, [self.also(scorer, self._judge(scorer, pred, r, cut), r)
                              for r, (pred, cut) in zip(batch, preds)]

    @staticmethod
    def _judge(scorer: ScorerView, pred: str, row: Encoded, cut: bool) -> dict:
        """correct and prediction of a generated answer, and whether max_new_tokens cut it short; on an order task
        also the option it names (-1: none)."""
        if row.prompt.options:
            choice = scorer.task.read_choice(pred, row.prompt.options)
            return {"correct": choice == row.prompt.position, "prediction": pred, "choice": choice, "cut": cut}
        return {"correct": METRICS[scorer.task.metric](pred, row.prompt.answers), "prediction": pred, "cut": cut}

    def branch(self, row: Encoded, p: int, max_new_tokens: int) -> tuple[int, int]:
        return 1, len(row.prompt_ids) - p + max_new_tokens

    def requests(self, scorer: ScorerView, row: Encoded, caps=None) -> list[Request]:
        limit, caps = scorer.max_new_tokens, caps or scorer.backend.caps
        if not caps.token_prompts:  # a chat model may restate the answer prefix first: room for it
            limit += scorer.count_tokens(row.prompt.answer_prefix) if row.prompt.answer_prefix else 0
        return [_prompt_request(caps, row, max_tokens=limit, stop_newline=not scorer.task.multiline)]

    def verdict(self, scorer: ScorerView, row: Encoded, replies: list[Reply]) -> dict:
        text = replies[0].text
        if not scorer.backend.caps.token_prompts:  # "The code for K is 1234": the restated answer prefix is not the answer
            head, prefix = text.lstrip(), row.prompt.answer_prefix.strip()
            text = head[len(prefix):] if prefix and head.startswith(prefix) else text
        return self._judge(scorer, text.strip() if scorer.task.multiline else first_line(text), row,
                           replies[0].finish == "length")


def _prompt_request(caps, row: Encoded, **kw) -> Request:
    """A generation request for the row's prompt: its token ids (the token and text protocols), or one chat message
    with the answer prefix after the user's text (a chat server applies its own template)."""
    if caps.token_prompts:
        return Request("generate", ids=row.prompt_ids, **kw)
    return Request("generate", messages=[{"role": "user", "content": render(None, row.prompt, chat=False)}], **kw)


def _top(alts: dict) -> int:
    """The token the in-process argmax picks among listed alternatives (the lowest id among the most likely)."""
    return min(alts, key=lambda t: (-alts[t], t))


def _listed(scorer: ScorerView, ids: list[int], like: list) -> list:
    """Token ids as the server lists generated tokens: ids, or each token's text."""
    if not like or isinstance(like[0], int):
        return ids
    return [scorer.backend.tokenizer.decode([t]) for t in ids]


def _generated_verdict(scorer: ScorerView, row: Encoded, reply: Reply) -> dict:
    """Teacher forcing by greedy generation: correct iff the generation begins with an accepted answer's tokens."""
    gen = [s[0] for s in reply.tokens]
    if not gen and reply.completion_tokens:
        raise PosbiasError("the server listed no generated tokens (logprobs) for a teacher-forced row",
                           "use `engine=generate`, or a server that returns logprobs")
    wants = [_listed(scorer, a, gen) for a in row.answer_ids]
    hits = [gen[:len(w)] == w for w in wants]
    logprob = sum(s[1] for s in reply.tokens[:len(wants[0])]) if hits[0] else None
    return {"correct": any(hits), "prediction": reply.text, "logprob": logprob}


def _label_verdict(scorer: ScorerView, row: Encoded, steps: list[Step]) -> dict:
    """An order-task row from the first generated token's listed alternatives: each label's logprob (None: not
    listed, less likely than every listed token); the choice is the most likely listed label (the first of equal
    ones), -1 when none is listed."""
    alts = steps[0][2] if steps else {}
    options, tok = row.prompt.options, scorer.backend.tokenizer
    by_id = scorer.backend.caps.token_prompts and any(isinstance(k, int) for k in alts)

    def logprob(slot: int) -> float | None:
        if by_id:
            return alts.get(row.option_ids[slot])
        if scorer.backend.caps.token_prompts:  # the server lists text: the label token's own text
            keys = [k for k in alts if k == tok.decode([row.option_ids[slot]])]
        else:  # a chat server's template: the label with or without a leading space
            keys = [k for k in alts if isinstance(k, str) and k.strip() == options[slot]]
        return max((alts[k] for k in keys), default=None)

    lps = [logprob(s) for s in range(len(options))]
    seen = [s for s, v in enumerate(lps) if v is not None]
    choice = max(seen, key=lambda s: (lps[s], -row.prompt.tie_rank(s))) if seen else -1
    return {"correct": choice == row.prompt.position, "prediction": options[choice] if seen else "", "choice": choice,
            "option_logprobs": [None if v is None else round(v, 6) for v in lps]}


ENGINES = Registry("engine")  # name -> Engine (one instance each): the protocols `engine=` names


KINDS = ("teacher-forced", "generate")  # the protocols an engine can be (Engine.kind)


def register_engine(cls: type[Engine]) -> type[Engine]:
    """Make an Engine subclass the scoring protocol `engine=NAME` names (also a class decorator); a taken name is
    refused, the same class again is a no-op."""
    if not (isinstance(cls, type) and issubclass(cls, Engine)) or inspect.isabstract(cls) or not getattr(cls, "name", ""):
        raise PosbiasError(f"register_engine takes an Engine subclass with a name, got {cls!r}",
                           "subclass an engine of posbias.scoring.engines (Engine, TeacherForced, Generate) and set `name`")
    if getattr(cls, "kind", None) not in KINDS:
        raise PosbiasError(f"engine '{cls.name}' declares no kind among {', '.join(KINDS)}",
                           "subclass TeacherForced or Generate (their kind is inherited), or set `kind`")
    if type(ENGINES.get(cls.name)) is not cls:
        ENGINES.add(cls.name, cls(), owner=cls)
    return cls


for _cls in (TeacherForced, Generate):
    register_engine(_cls)


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise PosbiasError(f"unknown engine '{name}'", f"use `engine` {' or '.join(ENGINES)}")
    return ENGINES[name]


def engine_kind(name: str) -> str:
    """The protocol a registered engine is ("teacher-forced" or "generate"), by its name."""
    return get_engine(name).kind


def _decode_runs(parts: list[tuple[list[Encoded], tuple]], batch_tokens: int, max_batch: int,
                 max_new_tokens: int) -> list[list[tuple[list[Encoded], tuple]]]:
    """Consecutive branch batches whose rows decode together: a run grows while its rows stay within max_batch and
    rows x (widest spine cut + widest branch + max_new_tokens) within batch_tokens (one batch alone always runs)."""
    def width(part) -> int:
        rows, (_, _, plen, _) = part
        return max(1, max(plen)) + max(len(r.prompt_ids) - p for r, p in zip(rows, plen))

    runs: list[list] = []
    n = w = 0
    for part in parts:
        rows, wide = len(part[0]), width(part)
        if runs and n + rows <= max_batch and (n + rows) * (max(w, wide) + max_new_tokens) <= batch_tokens:
            runs[-1].append(part)
            n, w = n + rows, max(w, wide)
        else:
            runs.append([part])
            n, w = rows, wide
    return runs
