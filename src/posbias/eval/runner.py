"""Score (example, position) rows with either engine, batch by batch."""

from __future__ import annotations

from typing import Callable, Iterable

from ..core.metrics import METRICS
from ..errors import PosbiasError
from ..models.load import Loaded
from ..tasks.base import Task
from .encode import Encoded, encode, plan_batches
from .generate import generate_greedy
from .teacher_forced import score_teacher_forced

ENGINES = ("teacher-forced", "generate")


def use_chat(loaded: Loaded, chat: str) -> bool:
    if chat not in ("auto", "on", "off"):
        raise PosbiasError(f"unknown --chat '{chat}'", "use auto, on or off")
    has = bool(getattr(loaded.tokenizer, "chat_template", None))
    if chat == "on" and not has:
        raise PosbiasError("--chat on, but this model's tokenizer has no chat template", "use --chat auto or off")
    return has if chat == "auto" else chat == "on"


def build_rows(loaded: Loaded, task: Task, examples: Iterable, positions: list[int], chat: bool) -> list[Encoded]:
    """Tokenised rows, example-major (see check_window for the length check)."""
    return [encode(loaded.tokenizer, task.build(ex, p), chat) for ex in examples for p in positions]


def check_window(rows: list[Encoded], window: int, engine: str, max_new_tokens: int) -> None:
    """Refuse (never truncate) a row that does not fit the model's context window."""
    extra = (lambda r: max(map(len, r.answer_ids))) if engine == "teacher-forced" else (lambda r: max_new_tokens)
    worst = max(rows, key=lambda r: len(r.prompt_ids) + extra(r))
    need = len(worst.prompt_ids) + extra(worst)
    if need > window:
        ex, pos = worst.key
        raise PosbiasError(
            f"prompt for example {ex} at position {pos} needs {need} tokens "
            f"({len(worst.prompt_ids)} prompt + {extra(worst)} answer) but the model's context window is {window}",
            "use fewer facts/documents/pairs, a lower --max-new-tokens, or a model with a longer context",
        )


def score_rows(
    loaded: Loaded,
    rows: list[Encoded],
    engine: str,
    metric: str,
    max_new_tokens: int,
    batch_tokens: int = 16384,
    max_batch: int = 32,
    done: set | None = None,
    on_batch: Callable[[list[dict]], None] | None = None,
    prompt_end: Callable | None = None,
) -> list[dict]:
    """Score rows; batches whose rows are all in `done` are skipped (resume).

    Returns the new result dicts (one per row scored), in batch order.
    """
    if engine not in ENGINES:
        raise PosbiasError(f"unknown engine '{engine}'", f"use one of: {', '.join(ENGINES)}")
    tok, model = loaded.tokenizer, loaded.model
    pad = tok.pad_token_id
    if engine == "teacher-forced":
        lengths = [len(r.prompt_ids) + max(map(len, r.answer_ids)) for r in rows]
        weight = [len(r.answer_ids) for r in rows]
        lengths = [n * w for n, w in zip(lengths, weight)]  # variants share a batch
    else:
        lengths = [len(r.prompt_ids) + max_new_tokens for r in rows]
    done = done or set()
    out: list[dict] = []
    for idx in plan_batches(lengths, batch_tokens, max_batch):
        batch = [rows[i] for i in idx]
        if all(r.key in done for r in batch):
            continue
        if engine == "teacher-forced":
            scored = score_teacher_forced(model, tok, batch, pad, prompt_end)
        else:
            preds = generate_greedy(model, tok, batch, pad, max_new_tokens)
            scored = [{"correct": METRICS[metric](p, r.prompt.answers), "prediction": p} for p, r in zip(preds, batch)]
        new = [
            {"example_id": r.key[0], "position": r.key[1], **s, "answers": list(r.prompt.answers),
             "prompt_tokens": len(r.prompt_ids)}
            for r, s in zip(batch, scored)
            if r.key not in done
        ]
        out.extend(new)
        if on_batch:
            on_batch(new)
    return out
