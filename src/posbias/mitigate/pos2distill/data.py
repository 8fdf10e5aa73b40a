"""Training data for Pos2Distill-R1 / R2 and their baselines (Sec. 4.2, 4.3, Appendix C).

One record per training question (JSON, one line of OUT/data.jsonl):

  {"example_id", "index" (the example's number in the task order), "anchor" (advantageous placement),
   "trivial": [K placements], "response" (the frozen base model's greedy answer at the anchor),
   "anchor_correct", "answers", "gold_target" (the gold answer as the task writes it, for SFT),
   "prompts": [{"position", "user", "answer_prefix"}, ...]}

A placement is a slot (R1, retrieval) or a pair [first hop, second hop] (R2, two-hop reasoning).
`prompts` holds the anchor prompt first, then the K trivial ones, so training never needs the
task again and the file can be inspected or reused. The paired design of tasks/ holds: every
prompt of a record has the same content, only the gold item(s) moved.

Choices:
- the split: training examples start at `skip` (default 2000 for generated tasks, half the pool,
  at most 2000, for file tasks); sweeps and compare evaluate examples 0.., so the two are disjoint.
  distill.json records the range looked at ("train_split"), the same shape as LPES's search_split.
- the anchor: the sink, slot 0, for retrieval; the recent placement (n-2, n-1) (the paper's
  1-based (n-1, n), Sec. 4.3) for two hops; or given, or auto:SWEEP (the best placement measured).
- responses are greedy (Appendix C: "we only collected a greedy-search response from anchor
  positions") through the batched eval path: cut at the first newline for retrieval, the whole
  chain of thought for reasoning. (The released script samples with temperature 0.7, top-p 0.95.)
- `correct_only` keeps questions whose anchor response the task metric marks correct; the paper is
  silent, the released code filters (create_datasets.py, filter=True). Examples are drawn in
  order until n are kept or `max_draw` were looked at.
- the K trivial placements of a question are drawn without replacement from all placements but the
  anchor (slots; or ordered pairs i != j, Sec. 4.3), seeded by (seed, example id): Appendix C samples
  "four distinct locations" (R1) and "four randomly selected pairs of locations" (R2) per question.
- self-training (R2 baseline): each question's K placements again, each with the model's own greedy
  response there, kept where it is correct (`expand_selftrain`): instance-by-instance training on
  exactly the questions and placements Pos2Distill-R2 uses.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from ...errors import PosbiasError
from ...models.load import Loaded
from ...runs import progress as progress_bar
from ...runs import read_json, write_json_atomic, write_jsonl_atomic
from ...scoring.encode import BATCH_TOKENS, MAX_BATCH
from ...scoring.scorer import Scorer
from ...tasks import Placement, Prompt, Task, as_json, label, placement_key


def default_skip(task: Task) -> int:
    """Where the training split starts when the user does not say (held-out sweeps use 0..)."""
    pool = task.pool_size
    return 2000 if pool is None else min(2000, pool // 2)


def resolve_anchor(spec: str | int | None, task: Task, task_name: str) -> tuple[Placement, dict]:
    """None (the task's advantageous placement) | a slot | 'i:j' (two hops) | 'auto:PATH' (the best placement of
    a sweep.json, or of DIR/sweep.json)."""
    if spec is None:
        pos = task.advantageous()
        return pos, {"anchor": as_json(pos), "source": "default"}
    spec = str(spec).strip()
    if spec.startswith("auto:"):
        return _anchor_from_sweep(Path(spec[len("auto:"):]), task, task_name)
    form = "a slot number like 0" if task.n_gold == 1 else f"a pair of slots like {task.n_slots - 2}:{task.n_slots - 1}"
    if not (spec.replace(":", "").isdigit() and spec.count(":") == task.n_gold - 1):
        raise PosbiasError(f"bad `anchor` {spec!r}", f"use {form}, or auto:PATH/sweep.json")
    try:
        pos = task.placements(spec)[0]
    except PosbiasError as e:
        raise PosbiasError(f"`anchor` {spec}: {e.problem}", e.fix) from None
    return pos, {"anchor": as_json(pos), "source": "given"}


def _anchor_from_sweep(path: Path, task: Task, task_name: str) -> tuple[Placement, dict]:
    path = path / "sweep.json" if path.is_dir() else path
    if not path.is_file():
        raise PosbiasError(f"no sweep result at {path}", "run a sweep into DIR first and pass `anchor=auto:DIR`")
    try:
        rec = json.loads(path.read_text())
        swept = rec["config"]["task"]
        slots = int(rec["task"]["n_slots"])
        best = str(rec["summary"]["best_position"])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise PosbiasError(f"{path} is not a complete sweep.json ({e})", "pass the sweep.json a finished sweep wrote") from None
    if swept != task_name or slots != task.n_slots:
        raise PosbiasError(
            f"{path} is a sweep of {swept} with {slots} slots, not of {task_name} with {task.n_slots}",
            "sweep the same task (and `facts`/`docs`/`pairs`) you distil on",
        )
    pos = task.placements(best)[0]
    info = {"anchor": as_json(pos), "source": str(path), "sweep_accuracy": rec["summary"].get("best"),
            "sweep_model": rec["config"].get("model")}
    return pos, info


def check_data(task: Task, k: int, skip: int) -> None:
    """The questions and placements a run asks for exist: k placements besides the anchor, examples after skip."""
    others = len(task.all_placements()) - 1
    if not 1 <= k <= others:
        raise PosbiasError(f"`k`={k} trivial placements, but this task has {others} besides the anchor",
                           f"use `k` between 1 and {others}")
    pool = task.pool_size
    if pool is not None and skip >= pool:
        raise PosbiasError(f"task {task.name} has {pool} examples, none after `skip={skip}`", f"use `skip` below {pool}")


def sample_trivial(options: list[Placement] | int, anchor: Placement, k: int, seed: int, example_id: str) -> list:
    """K distinct trivial placements for one question (all `options` but the anchor; an int n means slots
    0..n-1), seeded by (seed, example id)."""
    pool = list(range(options)) if isinstance(options, int) else options
    others = [p for p in pool if p != anchor]
    if not 1 <= k <= len(others):
        raise PosbiasError(f"`k`={k} trivial placements, but this task has {len(others)} besides the anchor",
                           f"use `k` between 1 and {len(others)}")
    return random.Random(f"pos2distill/{seed}/{example_id}").sample(others, k)


def _prompt_json(p: Prompt) -> dict:
    return {"position": as_json(p.position), "user": p.user, "answer_prefix": p.answer_prefix}


def make_record(task: Task, ex: Any, index: int, anchor: Placement, k: int, seed: int, gen: dict) -> dict:
    """One JSON-able training question (see the module docstring)."""
    a = task.build(ex, anchor)
    trivial = sample_trivial(task.all_placements(), anchor, k, seed, a.example_id)
    prompts = [a] + [task.build(ex, p) for p in trivial]
    return {"example_id": a.example_id, "index": index, "anchor": as_json(anchor), "trivial": [as_json(p) for p in trivial],
            "response": gen["prediction"], "anchor_correct": bool(gen["correct"]), "answers": list(a.answers),
            "gold_target": task.gold_target(a), "prompts": [_prompt_json(p) for p in prompts]}


def record_prompts(rec: dict) -> list[Prompt]:
    """The record's prompts (anchor first) as tasks.Prompt objects."""
    return [Prompt(rec["example_id"], placement_key(q["position"]), q["user"], q["answer_prefix"], tuple(rec["answers"]))
            for q in rec["prompts"]]


def _draw_sizes(n: int, kept: int, drawn: int, limit: int) -> int:
    """How many more examples to look at: enough for n kept at the accuracy seen so far."""
    rate = max(kept / drawn, 0.1) if drawn else 1.0
    return max(0, min(limit - drawn, math.ceil((n - kept) / rate)))


def build_records(loaded: Loaded, task: Task, *, n: int, k: int, anchor: Placement, seed: int, skip: int, chat: bool,
                  correct_only: bool, max_draw: int, max_new_tokens: int, batch_tokens: int = BATCH_TOKENS,
                  max_batch: int = MAX_BATCH, progress: bool = False) -> tuple[list[dict], dict]:
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
        raise PosbiasError(f"the model answered none of the {drawn} examples correctly at placement {label(anchor)}",
                           "use `correct_only=False`, another `anchor`, or an easier task")
    summary = {"questions": len(records), "asked": n, "looked_at": drawn, "anchor_accuracy": n_correct / drawn,
               "correct_only": correct_only, "train_split": {"task": task.name, "seed": seed, "skip": skip, "n": drawn}}
    return records, summary


def expand_selftrain(loaded: Loaded, task: Task, records: list[dict], *, chat: bool, max_new_tokens: int,
                     batch_tokens: int = BATCH_TOKENS, max_batch: int = MAX_BATCH, progress: bool = False) -> tuple[list[dict], dict]:
    """Self-training data on the same questions and placements: one record per (question, trivial placement)
    whose own greedy response there is correct; that placement is the record's anchor and its only row."""
    scorer = Scorer(loaded, task, "generate", max_new_tokens, chat, batch_tokens, max_batch)
    jobs = [(rec, q) for rec in records for q in rec["prompts"][1:]]
    prompts = [Prompt(rec["example_id"], placement_key(q["position"]), q["user"], q["answer_prefix"],
                      tuple(rec["answers"])) for rec, q in jobs]
    bar = progress_bar(len(prompts), "own responses", "row", enabled=progress)
    rows = scorer.prompt_rows(prompts)
    got = {r["example_id"] + "@" + label(r["position"]): r for r in scorer.score(rows, on_batch=lambda b: bar.update(len(b)))}
    bar.close()
    out = []
    for (rec, q), p in zip(jobs, prompts):
        g = got[p.example_id + "@" + label(p.position)]
        if g["correct"]:
            out.append({**rec, "anchor": q["position"], "trivial": [], "response": g["prediction"], "prompts": [q]})
    summary = {"rows": len(jobs), "kept": len(out), "own_accuracy": len(out) / max(len(jobs), 1)}
    if not out:
        raise PosbiasError(f"the model answered none of the {len(jobs)} training rows correctly at their own placement",
                           "self-training needs some correct answers: use a larger `n` or an easier task")
    return out, summary


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
