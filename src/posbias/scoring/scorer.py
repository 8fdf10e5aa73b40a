"""The Scorer: one model on one task with one engine, metric and batching.

    scorer = Scorer(loaded, task)                       # the task's engine, metric, answer length
    rows = scorer.rows(examples, positions)             # tokenised, refused if over the window
    results = scorer.score(rows, method="pi:1.1")       # one dict per row, batch by batch

Every pipeline scores through it: the sweep, the LPES fitness and the distillation data builder.
The model is an in-process `Loaded` (the hf backend) or any Backend (backends/): on a served one the rows go as
requests, many in flight, and each row is reported as soon as its replies are in (`_score_requests`).
With prefix_sharing (the default) each example's shared prompt prefix is computed once and every row continues
it from cached keys/values (scoring/prefix.py); a method that is not `prefix_safe` runs the plain path instead.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from typing import Callable, Iterable

from ..backends import Backend, as_backend
from ..errors import PosbiasError
from ..methods import Method, get_method
from ..models.dtype import cpu_kind
from ..models.load import Loaded
from ..tasks import Placement, Prompt, Task, as_json, placement_key
from .encode import BATCH_TOKENS, MAX_BATCH, Encoded, encode, plan_batches, render
from .engines import get_engine
from .prefix import GROUP_TOKENS, MIN_TOKENS, plan_shared
from .relevance import item_attention
from .spans import item_spans
from .teacher_forced import token_details

CHAT_MODES = ("auto", "on", "off")
PREFIX_ATTENTION = ("split", "copy")  # how a branch attends to its spine (models/prefix.py, SharedKV)


def use_chat(loaded: Loaded | Backend, chat: str | bool) -> bool:
    """Whether prompts go through the model's chat template: auto (if it has one), on, off (or an
    already resolved bool)."""
    if isinstance(chat, bool):
        return chat
    if chat not in CHAT_MODES:
        raise PosbiasError(f"unknown `chat` '{chat}'", "use auto, on or off")
    if loaded.tokenizer is None:  # a chat-only server: its own template applies to the messages
        return chat != "off"
    has = bool(getattr(loaded.tokenizer, "chat_template", None))
    if chat == "on" and not has:
        raise PosbiasError("`chat=on`, but this model's tokenizer has no chat template", "use `chat=auto` or `chat=off`")
    return has if chat == "auto" else chat == "on"



class Scorer:
    """Builds and scores (example, position) rows; the engine, answer length and chat use are resolved once."""

    def __init__(self, loaded: Loaded | Backend, task: Task, engine: str | None = None, max_new_tokens: int | None = None,
                 chat: str | bool = "auto", batch_tokens: int = BATCH_TOKENS, max_batch: int = MAX_BATCH,
                 prefix_sharing: bool = True, prefix_attention: str | None = None):
        if prefix_attention not in (None, *PREFIX_ATTENTION):
            raise PosbiasError(f"unknown prefix_attention '{prefix_attention}'",
                               f"use {' or '.join(PREFIX_ATTENTION)}, or None (split where it runs and was checked)")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise PosbiasError(f"`max_new_tokens` must be at least 1, got {max_new_tokens}", "pass `max_new_tokens=16` or so")
        if batch_tokens < 1 or max_batch < 1:
            raise PosbiasError(f"batch sizes must be positive, got {batch_tokens} tokens / {max_batch} rows",
                               "pass `batch_tokens` and `max_batch` of at least 1")
        self.backend = as_backend(loaded)
        self.loaded = self.backend.loaded  # the in-process model (None on a served backend)
        self.task = task
        self.engine = get_engine(engine or task.default_engine)
        self.engine.check(self.backend.caps, self.backend.name, task)
        self.metric = task.metric
        self.limit_from: str | None = None  # how a task derived max_new_tokens from its data (None: fixed or given)
        if max_new_tokens:
            self.max_new_tokens = max_new_tokens
        else:
            self.max_new_tokens, self.limit_from = task.generation_limit(self.count_tokens)
        self.chat = use_chat(self.backend, chat)
        task.check_engine(self.engine.name)
        task.bind_tokens(*self._counters())  # a task sized in tokens (niah) counts with the model's own tokenizer
        self.batch_tokens, self.max_batch = batch_tokens, max_batch
        self.prefix_sharing, self.prefix_attention = prefix_sharing, prefix_attention
        self._split: tuple[bool, str | None] | None = None  # (split attention?, why not where asked), once decided
        self._model_note: str | None = None  # why this model cannot share prefixes ("" if it can), once decided
        # the runner, chosen once: requests in flight to a served model, or padded batches in process
        self._runner = self._score_requests if self.backend.caps.batching == "requests" else self._score_padded

    def settings(self, method: str | Method | None = None) -> dict:
        """The resolved choices, for a run's record: with a method, also the scoring path it runs (and why not
        the prefix-shared one, if not)."""
        from .template import template_settings

        extra = {**template_settings(self.backend.tokenizer, self.chat),  # the template's hash and system turn, if used
                 **({"max_new_tokens_from": self.limit_from} if self.limit_from else {})}  # a limit the data gave
        out = {"engine": self.engine.name, "max_new_tokens": self.max_new_tokens, "chat_used": self.chat,
               "decoding": self.backend.decoding(), **extra}  # served: every field its requests send
        if self.loaded is None:
            out.update(backend=self.backend.name, scoring_path="served (the engine's own prefix cache)")
        elif method is not None:
            shared, note = self.path(method)
            out["scoring_path"] = "prefix-shared" if shared else "plain"
            out.update(self.engine.shared_settings if shared else {})
            split, why = self.split() if shared else (False, None)
            # recorded where split ran or was asked for (a run without the key used the copy path, as runs before it)
            out.update({"prefix_attention": "split"} if split else {"prefix_attention": f"copy ({why})"} if why else {})
            out.update({"scoring_note": note} if note else {})
        return out

    def _counters(self) -> tuple:
        """(a prompt's length in tokens after the template, the lengths of a list of texts), or (None, None) without a
        tokenizer."""
        tok = self.backend.tokenizer
        if tok is None:
            return None, None
        return (lambda p: len(tok(render(tok, p, self.chat), add_special_tokens=not self.chat)["input_ids"]),
                lambda texts: [len(x) for x in tok(list(texts), add_special_tokens=False)["input_ids"]])

    def count_tokens(self, text: str) -> int:
        """An answer's length in the model's tokens (a chat-only server without a tokenizer: two per word, a rough
        upper estimate for English under subword tokenizers)."""
        tok = self.backend.tokenizer
        return len(text.split()) * 2 if tok is None else len(tok(" " + text, add_special_tokens=False)["input_ids"])

    def path(self, method: str | Method | None = None) -> tuple[bool, str | None]:
        """(prefix-shared?, note): the note says why a requested prefix sharing falls back to the plain path."""
        from ..models.prefix import prefix_exact

        m = self.method(method)
        if not self.prefix_sharing or not self.backend.caps.prefix_sharing:
            return False, None
        if self._model_note is None:
            why = prefix_exact(self.loaded.model)
            self._model_note = f"model: plain scoring path, no prefix sharing ({why})" if why else ""
        if self._model_note:
            return False, self._model_note
        if not m.prefix_safe:
            return False, f"{m.label}: plain scoring path, no prefix sharing ({m.prefix_note})"
        return True, None

    def split(self) -> tuple[bool, str | None]:
        """(whether the prefix-shared path runs split attention, why not where `prefix_attention="split"` asked for
        it): unset, split where it runs (models.prefix.split_attention) and keeps verdicts (fp32; not bf16:
        docs/sweep.md, "Split attention"); "copy" never."""
        from ..models.prefix import split_attention

        if self._split is None and (self.prefix_attention == "copy" or self.loaded is None):
            self._split = (False, None)
        elif self._split is None:
            why = split_attention(self.loaded.model)
            # unset: fp32 only (in bf16 split moved 6 of 100 NQ verdicts against the copy path: docs/sweep.md)
            kept = self.prefix_attention == "split" or self.loaded.info.get("dtype") == "fp32"
            self._split = (why is None and kept, why if self.prefix_attention == "split" else None)
        return self._split

    def rows(self, examples: Iterable, positions: list[int]) -> list[Encoded]:
        """Tokenised rows, example-major; refuses (never truncates) a row over the context window."""
        rows = [encode(self.backend.tokenizer, self.task.prompt(ex, p), self.chat, options=self.engine.reads_options)
                for ex in examples for p in positions]
        self.check_window(rows)
        return rows

    def prompt_rows(self, prompts: Iterable[Prompt], continuation: bool = False) -> list[Encoded]:
        """Rows of ready-made prompts (e.g. from a saved training record); refused over the window like `rows`.
        continuation=True: the answers are generated responses, joined to the prompt as they are (encode)."""
        rows = [encode(self.backend.tokenizer, p, self.chat, continuation) for p in prompts]
        self.check_window(rows)
        return rows

    def check_window(self, rows: list[Encoded]) -> None:
        if not rows or self.backend.tokenizer is None:  # no tokenizer (a chat-only server): the server checks
            return
        window = self.backend.context_window
        worst = max(rows, key=lambda r: self.engine.need(r, self.max_new_tokens))
        need = self.engine.need(worst, self.max_new_tokens)
        if need > window:
            ex, pos = worst.key
            raise PosbiasError(
                f"prompt for example {ex} at position {pos} needs {need} tokens "
                f"({len(worst.prompt_ids)} prompt + {need - len(worst.prompt_ids)} answer) "
                f"but the model's context window is {window}",
                f"use {self.task.shrink}, a lower `max_new_tokens`, or a model with a longer context",
            )

    def method(self, method: str | Method | None) -> Method:
        """The method (spec, object, None: unmodified) as it runs on this scorer's task (`Method.for_task`); refused
        in one line on a backend that cannot apply it."""
        m = get_method(method if method is not None else "none").for_task(self.task)
        if self.loaded is None:
            self.backend.check_method(m)
        return m

    def score(self, rows: list[Encoded], method: str | Method | None = None, done: set | None = None,
              on_batch: Callable[[list[dict]], None] | None = None) -> list[dict]:
        """Score rows under `method` (default: the unmodified model); batches whose rows are all in
        `done` are skipped (resume). Returns the new result dicts, in batch order (prefix-shared: in row order)."""
        method = self.method(method)
        return method.read(_Reading(self, method), rows, done or set(), on_batch)  # the method's read stage

    def _read(self, rows: list[Encoded], method: Method, done: set,
              on_batch: Callable[[list[dict]], None] | None) -> list[dict]:
        """Each row not in `done` read once with `method` on (a method's default read stage)."""
        out: list[dict] = []
        moved: dict = {}  # a reordering method: where each row's gold item went (its row key is kept)
        if method.rearranges:
            before = [r for r in rows if r.key not in done]
            rows = self.rearranged(before, method)
            moved = {r.key: _gold_slot(a.prompt, r.prompt, self.task.slot_label) for a, r in zip(before, rows)}

        def emit(batch: list[Encoded], scored: list[dict]) -> None:
            new = [{"example_id": r.key[0], "position": as_json(r.key[1]), **s, "answers": list(r.prompt.answers),
                    "prompt_tokens": s.get("prompt_tokens", len(r.prompt_ids)), **r.prompt.meta,
                    **({"arranged_slot": moved[r.key]} if r.key in moved else {})}
                   for r, s in zip(batch, scored) if r.key not in done]
            out.extend(new)
            if on_batch:
                on_batch(new)

        self._runner(rows, method, done, emit)
        served_or_shared = self.loaded is None or self.path(method)[0]  # both in row order (the plain path: batch order)
        return in_row_order(out, rows) if served_or_shared else out

    def _score_padded(self, rows: list[Encoded], method: Method, done: set, emit: Callable) -> None:
        """In process: the method applied, then prefix-shared groups or padded batches (the results in their order)."""
        with method.apply(self.loaded) as active:
            if self.path(method)[0]:
                self._score_shared(rows, done, emit)
            else:
                costs = [self.engine.cost(r, self.max_new_tokens) for r in rows]
                keys = method.batch_keys(rows, _Prompts(self))  # a row's shape: rows of one shape only, if given
                for idx in plan_batches(costs, self.batch_tokens, self.max_batch, keys and list(zip(costs, keys))):
                    batch = [rows[i] for i in idx]
                    if not all(r.key in done for r in batch):
                        active.set_rows(batch, _Prompts(self))
                        emit(batch, self.engine.score(self, batch, active))

    def item_attention(self, prompts: list[Prompt]) -> list[list[float]]:
        """Each item's attention from the last prompt token (scoring/relevance.py), on the model as it is."""
        return item_attention(self.loaded, prompts, self.chat, self.batch_tokens, self.max_batch)

    def item_spans(self, prompt: Prompt):
        """Which prompt tokens belong to each item (scoring/spans.py), as this scorer encodes the prompt."""
        return item_spans(self.backend.tokenizer, prompt, list(prompt.items), self.chat)

    def rearranged(self, rows: list[Encoded], method: Method) -> list[Encoded]:
        """The rows as a reordering method presents them, re-encoded and checked against the window again."""
        if not rows:
            return rows
        attention = self.item_attention if self.loaded is not None else None
        prompts = method.rearrange([r.prompt for r in rows], self.task, attention)
        out = [encode(self.backend.tokenizer, p, self.chat, options=self.engine.reads_options) for p in prompts]
        self.check_window(out)
        return out

    def _score_requests(self, rows: list[Encoded], method: Method, done: set, emit: Callable) -> None:
        """A served backend: every row's requests in flight at once (as many as the backend keeps), and each row
        emitted as soon as its last reply is in, so a killed run has written every row it finished."""
        todo = [r for r in rows if r.key not in done]
        reqs, owner = [], []
        for i, row in enumerate(todo):
            for q in self.engine.requests(self, row):
                reqs.append(q)
                owner.append(i)
        need = Counter(owner)
        got: dict[int, dict] = defaultdict(dict)
        for j, reply in self.backend.run(reqs):  # type: ignore[attr-defined]
            i = owner[j]
            got[i][j] = reply
            if len(got[i]) == need[i]:
                row = todo[i]
                mine = got.pop(i)
                replies = [mine[k] for k in sorted(mine)]
                verdict = self.engine.also(self, self.engine.verdict(self, row, replies), row)
                if not row.prompt_ids:  # chat messages: the server's count of their tokens (None: it gave none)
                    counts = [q.prompt_tokens for q in replies]
                    verdict["prompt_tokens"] = None if None in counts else sum(counts)
                emit([row], [verdict])

    def units(self, rows: list[Encoded], method: str | Method | None = None) -> list[list[int]]:
        """The independent pieces of `score`'s work on `rows`, in its order (row indices): on the prefix-shared path
        the example groups of plan_shared (each with its own spine prefill), on the plain path the batches of
        plan_batches. Both planners pack greedily from a piece's start, so scoring one piece alone (or a contiguous
        run of them) plans exactly those batches again: the scale-out (scoring/scaleout.py) splits at these bounds."""
        if self.path(method)[0]:
            return [g.rows for g in self._plan(rows)]
        costs = [self.engine.cost(r, self.max_new_tokens) for r in rows]
        return plan_batches(costs, self.batch_tokens, self.max_batch)

    def order(self, rows: list[Encoded], method: str | Method | None = None) -> list[int]:
        """Indices of `rows` in the order `score` returns their results: row order on the prefix-shared path,
        batch order (longest first, plan_batches) on the plain one."""
        if self.path(method)[0]:
            return list(range(len(rows)))
        return [i for idx in self.units(rows, method) for i in idx]

    def _plan(self, rows: list[Encoded]) -> list:
        """The prefix-shared plan (scoring/prefix.py): on an accelerator batches close only at the budget; on a CPU where
        forwards are slow groups of examples stay small, so rows are written (and the bar moves) within seconds."""
        from ..models.prefix import launch_bound

        branch = functools.partial(self.engine.branch, max_new_tokens=self.max_new_tokens)  # a branch's (tokens, cost)
        if launch_bound(self.loaded.model):
            return plan_shared(rows, branch, self.batch_tokens, self.max_batch, self.batch_tokens, pad_tokens=None)
        fast = self.loaded.info.get("dtype") == "bf16" and bool(cpu_kind().bf16)  # small groups where forwards are slow
        return plan_shared(rows, branch, self.batch_tokens, self.max_batch, MIN_TOKENS, None if fast else GROUP_TOKENS)

    def _score_shared(self, rows: list[Encoded], done: set, emit: Callable) -> None:
        """The prefix-shared path: per group of examples one spine prefill, then its branch batches (scoring/prefix.py)."""
        from ..models.prefix import prefill

        pad_id = self.loaded.tokenizer.pad_token_id
        for group in self._plan(rows):
            if all(rows[i].key in done for i in group.rows):
                continue
            kv = prefill(self.loaded.model, [s.spine for s in group.shares], pad_id)
            where = {i: (e, p) for e, s in enumerate(group.shares) for i, p in zip(s.rows, s.plen)}
            split = self.split()[0]
            parts = [([rows[i] for i in idx], (kv, [where[i][0] for i in idx], [where[i][1] for i in idx], split))
                     for idx in group.batches]  # every batch, done or not: the engine plans over the whole group
            finished = lambda batch: all(r.key in done for r in batch)  # noqa: E731
            for batch, scored in self.engine.score_shared(self, parts, finished):  # type: ignore[arg-type]
                emit(batch, scored)

    def details(self, rows: list[Encoded], method: str | Method | None = None, top: int = 10) -> list[dict]:
        """Token-level teacher-forced details of each row's first answer under `method` (teacher_forced.token_details),
        one dict per row in the order of `rows`, keyed like `score`'s results."""
        method = self.method(method)
        costs = [len(r.prompt_ids) + len(r.answer_ids[0]) for r in rows]
        out: list[dict | None] = [None] * len(rows)
        tok = self.loaded.tokenizer
        with method.apply(self.loaded) as active:
            for idx in plan_batches(costs, self.batch_tokens, self.max_batch):
                batch = [rows[i] for i in idx]
                for i, d in zip(idx, token_details(self.loaded.model, tok, batch, tok.pad_token_id, active.set_prompt_end, top)):
                    out[i] = {"example_id": rows[i].key[0], "position": as_json(rows[i].key[1]), **d}
        return out  # type: ignore[return-value]

    def accuracy(self, rows: list[Encoded], method: str | Method | None = None,
                 on_batch: Callable[[list[dict]], None] | None = None) -> dict[Placement, float]:
        """Accuracy per gold placement of `rows` under `method` (on_batch: called with each batch's results)."""
        hits: dict[Placement, list[bool]] = {}
        for r in self.score(rows, method, on_batch=on_batch):
            hits.setdefault(placement_key(r["position"]), []).append(bool(r["correct"]))
        return {p: sum(h) / len(h) for p, h in hits.items()}


def _gold_slot(before: Prompt, after: Prompt, label: str | None) -> int | None:
    """The slot the gold item (one-gold tasks) sits in after a reordering method rearranged the prompt."""
    from ..tasks.arrange import split_label

    if not isinstance(before.position, int):
        return None
    body = split_label(before.items[before.position], label)[1]
    bodies = [split_label(t, label)[1] for t in after.items]
    return bodies.index(body) if body in bodies else None


def in_row_order(results: list[dict], rows: list[Encoded]) -> list[dict]:
    """Result dicts in the order of `rows` (example-major, as `Scorer.rows` builds them); one of no row goes last."""
    order = {r.key: i for i, r in enumerate(rows)}
    return sorted(results, key=lambda d: order.get((d["example_id"], placement_key(d["position"])), len(order)))


class _Prompts:
    """The Scorer as a method's active hooks see it (methods/base.py `PromptReader`): the task, the chat setting, and
    the items' attention and spans."""

    def __init__(self, scorer: Scorer):
        self.task, self.chat = scorer.task, scorer.chat
        self.item_attention, self.item_spans = scorer.item_attention, scorer.item_spans


class _Reading:
    """The Scorer as a method's read stage sees it (methods/base.py `Reader`): the task, the default reading with the
    method on, and a reading of prompts on the unmodified model (an order ensemble's orders)."""

    def __init__(self, scorer: Scorer, method: Method):
        self._scorer, self._method, self.task = scorer, method, scorer.task

    def read(self, rows: list[Encoded], done: set, on_batch: Callable[[list[dict]], None] | None) -> list[dict]:
        return self._scorer._read(rows, self._method, done, on_batch)

    def read_unmodified(self, prompts: list[Prompt]) -> list[dict]:
        s = self._scorer
        rows = [encode(s.backend.tokenizer, p, s.chat, options=s.engine.reads_options) for p in prompts]
        s.check_window(rows)
        index = {r.key: i for i, r in enumerate(rows)}
        got = s._read(rows, get_method("none").for_task(s.task), set(), None)
        return sorted(got, key=lambda d: index[(d["example_id"], placement_key(d["position"]))])
