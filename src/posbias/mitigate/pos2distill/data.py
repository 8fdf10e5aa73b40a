"""Training data for Pos2Distill-R1 and its SFT / SeqKD baselines (Sec. 4.2, Appendix C).

One record per training question (JSON, one line of OUT/data.jsonl):

  {"example_id", "index" (the example's number in the task order), "anchor" (advantageous slot),
   "trivial": [K slots], "response" (the frozen base model's greedy answer at the anchor),
   "anchor_correct", "answers", "prompts": [{"position", "user", "answer_prefix"}, ...]}

`prompts` holds the anchor prompt first, then the K trivial ones, so training never needs the
task again and the file can be inspected or reused. The paired design of tasks/ holds: every
prompt of a record has the same content, only the gold item moved.

Choices:
- the split: training examples start at `skip` (default 2000 for generated tasks, half the pool,
  at most 2000, for file tasks); sweeps and compare evaluate examples 0.., so the two are disjoint.
  distill.json records the range looked at ("train_split"), the same shape as LPES's search_split.
- responses are greedy (Appendix C: "we only collected a greedy-search response from anchor
  positions") through the batched eval.generate path, cut at the first newline like the sweeps.
  (The released script samples with temperature 0.7, top-p 0.95; see the package docs.)
- `correct_only` keeps questions whose anchor response the task metric marks correct; the paper is
  silent, the released code filters (create_datasets.py, filter=True). Examples are drawn in
  order until n are kept or `max_draw` were looked at.
- the K trivial slots of a question are drawn without replacement from all slots but the anchor,
  seeded by (seed, example id): Appendix C samples "four distinct locations" per question.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from ...errors import PosbiasError
from ...eval.scorer import Scorer
from ...models.load import Loaded
from ...runs import progress as progress_bar
from ...runs import read_json, write_json_atomic, write_jsonl_atomic
from ...tasks.base import Prompt, Task


def default_skip(task: Task) -> int:
    """Where the training split starts when the user does not say (held-out sweeps use 0..)."""
    pool = task.pool_size
    return 2000 if pool is None else min(2000, pool // 2)


def resolve_anchor(spec: str | int, task: Task, task_name: str) -> tuple[int, dict]:
    """'0' | any slot | 'auto:PATH' (the best position of a sweep.json, or of DIR/sweep.json)."""
    spec = str(spec).strip()
    if spec.startswith("auto:"):
        return _anchor_from_sweep(Path(spec[len("auto:"):]), task, task_name)
    try:
        pos = int(spec)
    except ValueError:
        raise PosbiasError(f"bad `anchor` {spec!r}", "use a slot number like 0, or auto:PATH/sweep.json") from None
    if not 0 <= pos < task.n_slots:
        raise PosbiasError(f"`anchor` {pos} is out of range for {task.n_slots} slots", f"use 0..{task.n_slots - 1}")
    return pos, {"anchor": pos, "source": "given"}


def _anchor_from_sweep(path: Path, task: Task, task_name: str) -> tuple[int, dict]:
    path = path / "sweep.json" if path.is_dir() else path
    if not path.is_file():
        raise PosbiasError(f"no sweep result at {path}", "run a sweep into DIR first and pass `anchor=auto:DIR`")
    try:
        rec = json.loads(path.read_text())
        pos = int(rec["summary"]["best_position"])
        swept = rec["config"]["task"]
        slots = int(rec["task"]["n_slots"])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise PosbiasError(f"{path} is not a complete sweep.json ({e})", "pass the sweep.json a finished sweep wrote") from None
    if swept != task_name or slots != task.n_slots:
        raise PosbiasError(
            f"{path} is a sweep of {swept} with {slots} slots, not of {task_name} with {task.n_slots}",
            "sweep the same task (and `facts`/`docs`/`pairs`) you distil on",
        )
    best = rec["summary"].get("best", None)
    return pos, {"anchor": pos, "source": str(path), "sweep_accuracy": best, "sweep_model": rec["config"].get("model")}


def check_data(task: Task, k: int, skip: int) -> None:
    """The questions and slots a run asks for exist: k trivial slots besides the anchor, examples after skip."""
    if not 1 <= k <= task.n_slots - 1:
        raise PosbiasError(f"`k`={k} trivial positions, but this task has {task.n_slots - 1} slots besides the anchor",
                           f"use `k` between 1 and {task.n_slots - 1}")
    pool = task.pool_size
    if pool is not None and skip >= pool:
        raise PosbiasError(f"task {task.name} has {pool} examples, none after `skip={skip}`", f"use `skip` below {pool}")


def sample_trivial(n_slots: int, anchor: int, k: int, seed: int, example_id: str) -> list[int]:
    """K distinct trivial slots for one question, seeded by (seed, example id)."""
    others = [p for p in range(n_slots) if p != anchor]
    if not 1 <= k <= len(others):
        raise PosbiasError(f"`k`={k} trivial positions, but this task has {len(others)} slots besides the anchor",
                           f"use `k` between 1 and {len(others)}")
    return random.Random(f"pos2distill/{seed}/{example_id}").sample(others, k)


def _prompt_json(p: Prompt) -> dict:
    return {"position": p.position, "user": p.user, "answer_prefix": p.answer_prefix}


def make_record(task: Task, ex: Any, index: int, anchor: int, k: int, seed: int, gen: dict) -> dict:
    """One JSON-able training question (see the module docstring)."""
    a = task.build(ex, anchor)
    trivial = sample_trivial(task.n_slots, anchor, k, seed, a.example_id)
    prompts = [a] + [task.build(ex, p) for p in trivial]
    return {"example_id": a.example_id, "index": index, "anchor": anchor, "trivial": trivial,
            "response": gen["prediction"], "anchor_correct": bool(gen["correct"]), "answers": list(a.answers),
            "prompts": [_prompt_json(p) for p in prompts]}


def record_prompts(rec: dict) -> list[Prompt]:
    """The record's prompts (anchor first) as tasks.Prompt objects."""
    return [Prompt(rec["example_id"], q["position"], q["user"], q["answer_prefix"], tuple(rec["answers"]))
            for q in rec["prompts"]]


def _draw_sizes(n: int, kept: int, drawn: int, limit: int) -> int:
    """How many more examples to look at: enough for n kept at the accuracy seen so far."""
    rate = max(kept / drawn, 0.1) if drawn else 1.0
    return max(0, min(limit - drawn, math.ceil((n - kept) / rate)))


def build_records(loaded: Loaded, task: Task, *, n: int, k: int, anchor: int, seed: int, skip: int, chat: bool,
                  correct_only: bool, max_draw: int, max_new_tokens: int, batch_tokens: int = 16384,
                  max_batch: int = 32, progress: bool = False) -> tuple[list[dict], dict]:
    """Greedy anchor responses of the frozen model for up to n questions; (records, summary)."""
    pool = task.pool_size
    limit = max_draw if pool is None else min(max_draw, pool - skip)
    if limit < 1:
        raise PosbiasError(f"task {task.name} has {pool} examples, none after `skip={skip}`", f"use `skip` below {pool}")
    scorer = Scorer(loaded, task, "generate", max_new_tokens, chat, batch_tokens, max_batch)
    records: list[dict] = []
    drawn = n_correct = 0
    bar = progress_bar(n, "anchor responses", "question", enabled=progress)
    while len(records) < n and drawn < limit:
        size = _draw_sizes(n, len(records), drawn, limit) if correct_only else min(n - len(records), limit - drawn)
        examples = task.examples(size, seed, skip + drawn)
        rows = scorer.rows(examples, [anchor])
        gen = {r["example_id"]: r for r in scorer.score(rows)}
        for i, ex in enumerate(examples):
            g = gen[rows[i].prompt.example_id]
            n_correct += bool(g["correct"])
            if len(records) < n and (g["correct"] or not correct_only):
                records.append(make_record(task, ex, skip + drawn + i, anchor, k, seed, g))
                bar.update(1)
        drawn += len(examples)
    bar.close()
    if not records:
        raise PosbiasError(f"the model answered none of the {drawn} examples correctly at slot {anchor}",
                           "use `correct_only=False`, another `anchor`, or an easier task")
    summary = {"questions": len(records), "asked": n, "looked_at": drawn, "anchor_accuracy": n_correct / drawn,
               "correct_only": correct_only, "train_split": {"task": task.name, "seed": seed, "skip": skip, "n": drawn}}
    return records, summary


def write_records(out: Path, records: list[dict], summary: dict, fingerprint: dict) -> None:
    """data.jsonl, then data.json (its presence means the data is complete)."""
    write_jsonl_atomic(out / "data.jsonl", records)
    write_json_atomic(out / "data.json", {"fingerprint": fingerprint, "summary": summary}, indent=2)


def read_records(out: Path, fingerprint: dict) -> tuple[list[dict], dict] | None:
    """Saved records if OUT holds complete data made with the same fingerprint, else None."""
    meta, data = out / "data.json", out / "data.jsonl"
    if not (meta.exists() and data.exists()):
        return None
    saved = read_json(meta, "training data summary")
    if saved.get("fingerprint") != json.loads(json.dumps(fingerprint)):
        return None
    try:
        records = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PosbiasError(f"{data} is not readable ({e})", "pass `overwrite=True` to start again") from None
    return records, saved["summary"]
