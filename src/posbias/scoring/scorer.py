"""The Scorer: one model on one task with one engine, metric and batching.

    scorer = Scorer(loaded, task)                       # the task's engine, metric, answer length
    rows = scorer.rows(examples, positions)             # tokenised, refused if over the window
    results = scorer.score(rows, method="pi:1.1")       # one dict per row, batch by batch

Every pipeline scores through it: the sweep, the LPES fitness and the distillation data builder.
The model is an in-process `Loaded` (the hf backend) or any Backend (backends/): on a served one the rows go as
requests, many in flight, and each row is reported as soon as its replies are in. How rows reach the model is the
runner's (scoring/runners.py: in process or served, chosen once from what the backend declares); the Scorer keeps
what both share: encoding, the window check, the rows, reading them with the method's stages.
With prefix_sharing (the default) each example's shared prompt prefix is computed once and every row continues
it from cached keys/values (scoring/prefix.py); a method that is not `prefix_safe` runs the plain path instead.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ..backends import Backend, as_backend
from ..errors import PosbiasError
from ..methods import Method, get_method
from ..models.load import Loaded
from ..tasks import Placement, Prompt, Task, as_json, placement_key
from .encode import BATCH_TOKENS, MAX_BATCH, Encoded, encode, render
from .engines import get_engine
from .runners import runner_for
from .spans import item_spans

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
                 prefix_sharing: bool | str = True):
        """prefix_sharing: True (the prefix-shared path where the model and method allow it; its branches attend
        split where that runs and keeps verdicts, else copy: runners.InProcess.split_attention), "split" or "copy"
        (shared, attending so), False (the plain path)."""
        if prefix_sharing not in (True, False, *PREFIX_ATTENTION):
            raise PosbiasError(f"unknown prefix_sharing {prefix_sharing!r}",
                               f"use True, False, or {' or '.join(PREFIX_ATTENTION)} (shared, attending so)")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise PosbiasError(f"`max_new_tokens` must be at least 1, got {max_new_tokens}", "pass `max_new_tokens=16` or so")
        if batch_tokens < 1 or max_batch < 1:
            raise PosbiasError(f"batch sizes must be positive, got {batch_tokens} tokens / {max_batch} rows",
                               "pass `batch_tokens` and `max_batch` of at least 1")
        self.backend = as_backend(loaded)
        self.loaded = self.backend.loaded  # the in-process model (None on a served backend): what the engines compute on
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
        task.check_engine(self.engine.kind)
        task.bind_tokens(*self._counters())  # a task sized in tokens (niah) counts with the model's own tokenizer
        self.batch_tokens, self.max_batch = batch_tokens, max_batch
        self.prefix_sharing = prefix_sharing is not False
        self.prefix_attention = prefix_sharing if isinstance(prefix_sharing, str) else None
        self.runner = runner_for(self)  # in process or served (scoring/runners.py), chosen once
        self.hook_view = _HookView(self)  # the scorer as a method's active hooks read prompts (methods/base.py HookView)

    def settings(self, method: str | Method | None = None) -> dict:
        """The resolved choices, for a run's record: with a method, also the scoring path it runs (and why not
        the prefix-shared one, if not); served, the backend and its own prefix cache."""
        from .template import template_settings

        extra = {**template_settings(self.backend.tokenizer, self.chat),  # the template's hash and system turn, if used
                 **({"max_new_tokens_from": self.limit_from} if self.limit_from else {})}  # a limit the data gave
        out = {"engine": self.engine.name, "max_new_tokens": self.max_new_tokens, "chat_used": self.chat,
               "decoding": self.backend.decoding(), **extra}  # served: every field its requests send
        return {**out, **self.runner.settings(None if method is None else self.resolve(method))}

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

    def resolve(self, method: str | Method | None) -> Method:
        """The method (spec, object, None: unmodified) as it runs on this scorer's task (`Method.for_task`, which a
        resolved method passes through); refused in one line where the runner cannot apply it. Resolved once per
        call of `score` or `details`; the runner takes the result."""
        m = get_method(method if method is not None else "none").for_task(self.task)
        self.runner.check_method(m)
        return m

    def score(self, rows: list[Encoded], method: str | Method | None = None, done: set | None = None,
              on_batch: Callable[[list[dict]], None] | None = None) -> list[dict]:
        """Score rows under `method` (default: the unmodified model); batches whose rows are all in
        `done` are skipped (resume). Returns the new result dicts, in batch order (prefix-shared: in row order)."""
        method = self.resolve(method)
        return method.read(_ReadView(self, method), rows, done or set(), on_batch)  # the method's read stage

    def _read_once(self, rows: list[Encoded], method: Method, done: set,
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

        self.runner.run(rows, method, done, emit)
        return in_row_order(out, rows) if self.runner.in_row_order(method) else out

    def item_spans(self, prompt: Prompt):
        """Which prompt tokens belong to each item (scoring/spans.py), as this scorer encodes the prompt."""
        return item_spans(self.backend.tokenizer, prompt, list(prompt.items), self.chat)

    def rearranged(self, rows: list[Encoded], method: Method) -> list[Encoded]:
        """The rows as a reordering method presents them, re-encoded and checked against the window again."""
        if not rows:
            return rows
        prompts = method.rearrange([r.prompt for r in rows], self.task, self.runner.attention())
        out = [encode(self.backend.tokenizer, p, self.chat, options=self.engine.reads_options) for p in prompts]
        self.check_window(out)
        return out

    def details(self, rows: list[Encoded], method: str | Method | None = None, top: int = 10) -> list[dict]:
        """Token-level teacher-forced details of each row's first answer under `method` (in process: runners.InProcess)."""
        return self.runner.details(rows, self.resolve(method), top)

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


class _HookView:
    """The Scorer as a method's active hooks see it (methods/base.py `HookView`): the task, the chat setting, and
    the items' attention and spans."""

    def __init__(self, scorer: Scorer):
        self.task, self.chat = scorer.task, scorer.chat
        self.item_attention, self.item_spans = scorer.runner.attention(), scorer.item_spans


class _ReadView:
    """The Scorer as a method's read stage sees it (methods/base.py `ReadView`): the task, the default reading with the
    method on, and a reading of prompts on the unmodified model (an order ensemble's orders)."""

    def __init__(self, scorer: Scorer, method: Method):
        self._scorer, self._method, self.task = scorer, method, scorer.task

    def read(self, rows: list[Encoded], done: set, on_batch: Callable[[list[dict]], None] | None) -> list[dict]:
        return self._scorer._read_once(rows, self._method, done, on_batch)

    def read_unmodified(self, prompts: list[Prompt]) -> list[dict]:
        s = self._scorer
        rows = [encode(s.backend.tokenizer, p, s.chat, options=s.engine.reads_options) for p in prompts]
        s.check_window(rows)
        index = {r.key: i for i, r in enumerate(rows)}
        got = s._read_once(rows, get_method("none").for_task(s.task), set(), None)
        return sorted(got, key=lambda d: index[(d["example_id"], placement_key(d["position"]))])
