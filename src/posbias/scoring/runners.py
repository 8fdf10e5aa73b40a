"""How a Scorer's rows reach the model: one runner per kind of backend, chosen once by what the backend declares
(`Capabilities.batching`: "padded" or "requests"), so nothing else asks whether the model is in process or served.

  InProcess  the model in this process (backends/hf.py): the method applied by hooks, then the prefix-shared plan
             (one spine prefill per group of examples, scoring/prefix.py) or padded batches (encode.plan_batches);
             split attention, the plan's units and order, token-level details, the items' attention
  Served     a served model (backends/openai.py, vllm.py): every row's requests in flight at once (as many as the
             backend keeps), each row emitted as soon as its last reply is in

Both answer the cost meter (eval/cost.py) the same three questions: the pieces a budget may stop between (`units`,
in scoring order), the price of a row (`price`: the requests it costs, in process as on a server with prompt
logprobs and token prompts), and how many requests one piece may hold (`in_flight`; None: one unit a piece).
A backend of another kind (llama.cpp bindings, MLX in process) registers its runner under its `batching` word.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any, Callable, ClassVar, NamedTuple

from ..backends import Request
from ..errors import PosbiasError
from ..methods import Method
from ..models.dtype import cpu_kind
from ..registry import Registry
from ..tasks import Prompt, as_json
from .encode import Encoded, plan_batches
from .prefix import GROUP_TOKENS, MIN_TOKENS, plan_shared
from .relevance import item_attention
from .teacher_forced import token_details

Scorer = Any  # scoring.scorer.Scorer, which builds its runner (not imported: imports run one way)
Emit = Callable[[list[Encoded], list[dict]], None]  # a batch of rows and their results, as they are scored


class ScoringPath(NamedTuple):
    """Whether rows continue a shared prompt prefix from cached keys/values; note: why a requested prefix sharing
    falls back to the plain path (None where it does not)."""

    shared: bool
    note: str | None = None


class Runner(ABC):
    """Runs a Scorer's encoded rows on its backend (module docstring)."""

    batching: ClassVar[str]  # the Capabilities.batching word of the backends it runs
    in_flight: int | None = None  # requests one budget piece may hold (None: one unit of `units` a piece)
    billed: ClassVar[bool] = False  # its requests are what a provider bills: the cost estimate is printed unpriced

    def __init__(self, scorer: Scorer):
        self.scorer = scorer  # what both runners share: task, engine, answer length, chat, encoding
        self.backend = scorer.backend

    @abstractmethod
    def run(self, rows: list[Encoded], method: Method, done: set, emit: Emit) -> None:
        """Score every row not in `done` with `method` on, `emit` each batch's results."""

    @abstractmethod
    def units(self, rows: list[Encoded], method: Method) -> list[list[int]]:
        """The independent pieces of `run`'s work on `rows` (row indices), in its order."""

    @abstractmethod
    def price(self, row: Encoded) -> list[Request]:
        """The requests a row costs (what the engine asks a served model for it)."""

    def in_row_order(self, method: Method) -> bool:
        """Whether `run` emits the rows in their order (else in its batches' order)."""
        return True

    def settings(self, method: Method | None) -> dict:
        """The scoring path a method runs (None: no method named), for the run's record."""
        return {}

    def attention(self) -> Callable[[list[Prompt]], list[list[float]]] | None:
        """Each item's attention from the last prompt token, where the runner can read it (None: served)."""
        return None

    def check_method(self, method: Method) -> None:
        """Refuse (one line) a method this runner's backend cannot apply."""
        self.backend.check_method(method)

    def count_tokens(self, text: str) -> int:
        return self.scorer.count_tokens(text)

    def counters(self) -> dict:
        """The backend's request and token counters (served backends; {} in process)."""
        return self.backend.counters()


class InProcess(Runner):
    """The model in this process: methods by hooks, prefix-shared groups or padded batches (module docstring)."""

    batching = "padded"
    PRICED_AS = {"teacher_forcing": "prompt_logprobs", "token_prompts": True}  # a row priced as on such a server

    def __init__(self, scorer: Scorer):
        super().__init__(scorer)
        self.loaded = scorer.backend.loaded
        self._split: tuple[bool, str | None] | None = None  # (split attention?, why not where asked), once decided
        self._model_note: str | None = None  # why this model cannot share prefixes ("" if it can), once decided

    def check_method(self, method: Method) -> None:
        return  # checked against the loaded model where the method is applied (HFBackend.check_method)

    def price(self, row: Encoded) -> list[Request]:
        s = self.scorer
        return s.engine.requests(s, row, replace(self.backend.caps, **self.PRICED_AS))

    def in_row_order(self, method: Method) -> bool:
        return self.scoring_path(method).shared  # the plain path: batch order

    def settings(self, method: Method | None) -> dict:
        if method is None:
            return {}
        path = self.scoring_path(method)
        out = {"scoring_path": "prefix-shared" if path.shared else "plain", **(self.scorer.engine.shared_settings
                                                                                if path.shared else {})}
        split, why = self.split_attention() if path.shared else (False, None)
        # recorded where split ran or was asked for (a run without the key used the copy path, as runs before it)
        out.update({"prefix_attention": "split"} if split else {"prefix_attention": f"copy ({why})"} if why else {})
        return {**out, **({"scoring_note": path.note} if path.note else {})}

    def scoring_path(self, method: Method) -> ScoringPath:
        """Prefix-shared or plain, and why not prefix-shared where the Scorer asked for it."""
        from ..models.prefix import prefix_exact

        if not self.scorer.prefix_sharing or not self.backend.caps.prefix_sharing:
            return ScoringPath(False)
        if self._model_note is None:
            why = prefix_exact(self.loaded.model)
            self._model_note = f"model: plain scoring path, no prefix sharing ({why})" if why else ""
        if self._model_note:
            return ScoringPath(False, self._model_note)
        if not method.prefix_safe:
            return ScoringPath(False, f"{method.label}: plain scoring path, no prefix sharing ({method.prefix_note})")
        return ScoringPath(True)

    def split_attention(self) -> tuple[bool, str | None]:
        """(whether the prefix-shared path runs split attention, why not where `prefix_attention="split"` asked for
        it): unset, split where it runs (models.prefix.split_attention) and keeps verdicts (fp32; not bf16:
        docs/sweep.md, "Split attention"); "copy" never."""
        from ..models.prefix import split_attention

        asked = self.scorer.prefix_attention
        if self._split is None and asked == "copy":
            self._split = (False, None)
        elif self._split is None:
            why = split_attention(self.loaded.model)
            # unset: fp32 only (in bf16 split moved 6 of 100 NQ verdicts against the copy path: docs/sweep.md)
            kept = asked == "split" or self.loaded.info.get("dtype") == "fp32"
            self._split = (why is None and kept, why if asked == "split" else None)
        return self._split

    def run(self, rows: list[Encoded], method: Method, done: set, emit: Emit) -> None:
        """The method applied, then prefix-shared groups or padded batches (the results in their order)."""
        s = self.scorer
        with method.apply(self.loaded) as active:
            if self.scoring_path(method).shared:
                self._run_shared(rows, done, emit)
                return
            costs = [s.engine.cost(r, s.max_new_tokens) for r in rows]
            keys = method.batch_keys(rows, s.hook_view)  # a row's shape: rows of one shape only, if given
            for idx in plan_batches(costs, s.batch_tokens, s.max_batch, keys and list(zip(costs, keys))):
                batch = [rows[i] for i in idx]
                if not all(r.key in done for r in batch):
                    active.set_rows(batch, s.hook_view)
                    emit(batch, s.engine.score(s, batch, active))

    def units(self, rows: list[Encoded], method: Method) -> list[list[int]]:
        """On the prefix-shared path the example groups of plan_shared (each with its own spine prefill), on the plain
        path the batches of plan_batches. Both planners pack greedily from a piece's start, so scoring one piece alone
        (or a contiguous run of them) plans exactly those batches again: the scale-out (scoring/scaleout.py) and a
        budget split at these bounds."""
        if self.scoring_path(method).shared:
            return [g.rows for g in self._plan(rows)]
        s = self.scorer
        return plan_batches([s.engine.cost(r, s.max_new_tokens) for r in rows], s.batch_tokens, s.max_batch)

    def result_order(self, rows: list[Encoded], method: Method) -> list[int]:
        """Indices of `rows` in the order `run` emits them: row order on the prefix-shared path, batch order (longest
        first, plan_batches) on the plain one."""
        if self.scoring_path(method).shared:
            return list(range(len(rows)))
        return [i for idx in self.units(rows, method) for i in idx]

    def _plan(self, rows: list[Encoded]) -> list:
        """The prefix-shared plan (scoring/prefix.py): on an accelerator batches close only at the budget; on a CPU where
        forwards are slow groups of examples stay small, so rows are written (and the bar moves) within seconds."""
        from ..models.prefix import launch_bound

        s = self.scorer
        branch = functools.partial(s.engine.branch, max_new_tokens=s.max_new_tokens)  # a branch's (tokens, cost)
        if launch_bound(self.loaded.model):
            return plan_shared(rows, branch, s.batch_tokens, s.max_batch, s.batch_tokens, pad_tokens=None)
        fast = self.loaded.info.get("dtype") == "bf16" and bool(cpu_kind().bf16)  # small groups where forwards are slow
        return plan_shared(rows, branch, s.batch_tokens, s.max_batch, MIN_TOKENS, None if fast else GROUP_TOKENS)

    def _run_shared(self, rows: list[Encoded], done: set, emit: Emit) -> None:
        """Per group of examples one spine prefill, then its branch batches (scoring/prefix.py)."""
        from ..models.prefix import prefill

        pad_id, split = self.loaded.tokenizer.pad_token_id, self.split_attention()[0]
        for group in self._plan(rows):
            if all(rows[i].key in done for i in group.rows):
                continue
            kv = prefill(self.loaded.model, [sh.spine for sh in group.shares], pad_id)
            where = {i: (e, p) for e, sh in enumerate(group.shares) for i, p in zip(sh.rows, sh.plen)}
            parts = [([rows[i] for i in idx], (kv, [where[i][0] for i in idx], [where[i][1] for i in idx], split))
                     for idx in group.batches]  # every batch, done or not: the engine plans over the whole group
            finished = lambda batch: all(r.key in done for r in batch)  # noqa: E731
            for batch, scored in self.scorer.engine.score_shared(self.scorer, parts, finished):  # type: ignore[arg-type]
                emit(batch, scored)

    def details(self, rows: list[Encoded], method: Method, top: int = 10) -> list[dict]:
        """Token-level teacher-forced details of each row's first answer under `method` (teacher_forced.token_details),
        one dict per row in the order of `rows`, keyed like the scored results."""
        s, tok = self.scorer, self.loaded.tokenizer
        costs = [len(r.prompt_ids) + len(r.answer_ids[0]) for r in rows]
        out: list[dict | None] = [None] * len(rows)
        with method.apply(self.loaded) as active:
            for idx in plan_batches(costs, s.batch_tokens, s.max_batch):
                batch = [rows[i] for i in idx]
                for i, d in zip(idx, token_details(self.loaded.model, tok, batch, tok.pad_token_id, active.set_prompt_end, top)):
                    out[i] = {"example_id": rows[i].key[0], "position": as_json(rows[i].key[1]), **d}
        return out  # type: ignore[return-value]

    def attention(self) -> Callable[[list[Prompt]], list[list[float]]]:
        return self.item_attention

    def item_attention(self, prompts: list[Prompt]) -> list[list[float]]:
        """Each item's attention from the last prompt token (scoring/relevance.py), on the model as it is."""
        s = self.scorer
        return item_attention(self.loaded, prompts, s.chat, s.batch_tokens, s.max_batch)


class Served(Runner):
    """A served model: requests in flight, rows emitted as their replies complete (module docstring)."""

    batching = "requests"
    billed = True

    def __init__(self, scorer: Scorer):
        super().__init__(scorer)
        self.in_flight = max(1, int(self.backend.in_flight))  # what the backend declares it keeps in flight

    def settings(self, method: Method | None) -> dict:
        return {"backend": self.backend.name, "scoring_path": "served (the engine's own prefix cache)"}

    def price(self, row: Encoded) -> list[Request]:
        return self.scorer.engine.requests(self.scorer, row)

    def units(self, rows: list[Encoded], method: Method) -> list[list[int]]:
        return [[i] for i in range(len(rows))]  # a row's requests go together; a budget piece is a window of rows

    def run(self, rows: list[Encoded], method: Method, done: set, emit: Emit) -> None:
        """Every row's requests in flight at once, each row emitted as soon as its last reply is in, so a killed run
        has written every row it finished."""
        s = self.scorer
        todo = [r for r in rows if r.key not in done]
        reqs, owner = [], []
        for i, row in enumerate(todo):
            for q in s.engine.requests(s, row):
                reqs.append(q)
                owner.append(i)
        need = Counter(owner)
        got: dict[int, dict] = defaultdict(dict)
        for j, reply in self.backend.run(reqs):
            i = owner[j]
            got[i][j] = reply
            if len(got[i]) == need[i]:
                row = todo[i]
                mine = got.pop(i)
                replies = [mine[k] for k in sorted(mine)]
                verdict = s.engine.also(s, s.engine.verdict(s, row, replies), row)
                if not row.prompt_ids:  # chat messages: the server's count of their tokens (None: it gave none)
                    counts = [q.prompt_tokens for q in replies]
                    verdict["prompt_tokens"] = None if None in counts else sum(counts)
                emit([row], [verdict])


RUNNERS = Registry("runner")  # batching word -> Runner class; a plugin registers a runner for its backend's word


def register_runner(cls: type[Runner]) -> type[Runner]:
    """Register a Runner subclass under its `batching` word (a class decorator); a taken word is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Runner)) or not getattr(cls, "batching", None):
        raise PosbiasError(f"{cls!r} is not a Runner subclass with a `batching` word", "subclass posbias's Runner and "
                           "set batching to the word your backend's Capabilities declare")
    return RUNNERS.add(cls.batching, cls)


for _r in (InProcess, Served):
    register_runner(_r)


def runner_for(scorer: Scorer) -> Runner:
    """The runner of the scorer's backend, by the batching it declares: the one place in-process and served part."""
    kind = scorer.backend.caps.batching
    if kind not in RUNNERS:
        raise PosbiasError(f"backend '{scorer.backend.name}' declares batching '{kind}', which no runner takes",
                           f"declare one of: {', '.join(RUNNERS)}")
    return RUNNERS[kind](scorer)
