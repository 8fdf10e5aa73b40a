"""The positional attention prior (Found-in-the-Middle, Hsieh et al. 2024, Sec. 3.2): a content-free item put in each
slot in turn, and the attention it receives from the last prompt token (per token, scoring/relevance.py), per slot and
layer. Whatever that attention varies with is position alone: the model's positional prior, the curve the paper
subtracts to calibrate. Beside it, on the same examples with the gold at each slot in turn: the unmodified model's
accuracy, the attention real items receive at each slot (is the content-free item's curve the positional part of
it?), the gold item's own attention, and how often the most attended item is the gold, before and after the prior
is subtracted (recall@1 of the relevance signal calibration and attention sorting rely on).

The examples are `n` from offset `skip` (disjoint from an evaluation that starts at 0); example i has its gold at slot
i mod n_slots and the dummy, in turn, at every slot, and the gold in turn at every slot (2 x n x n_slots capture
forwards). Resumable: one line per example in
rows.jsonl. Files: prior.json (the record `calib:DIR` reads: model, task, chat, the prior per slot and per layer, the
examples it used), rows.jsonl, prior.png.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backends import open_model
from ..errors import PosbiasError
from ..eval.config import ModelChoice, TaskChoice, check_split, config_dict, jsonable
from ..models.load import Loaded
from ..runs import JsonlLog, RunFolder, versions
from ..runs import progress as bar
from ..scoring.encode import BATCH_TOKENS, MAX_BATCH
from ..scoring.relevance import item_attention
from ..scoring.scorer import Scorer
from ..tasks import Task, get_task
from ..tasks.arrange import with_dummy

FILES = ("rows.jsonl", "prior.png")
BANDS = ("first third", "middle third", "last third")


@dataclass
class PriorConfig(TaskChoice, ModelChoice):
    """Where and how the positional prior is measured: `n` examples from `skip`, off the examples an evaluation
    uses.

    n: examples, each measured with the content-free item at every slot.
    seed: example selection / generation seed.
    skip: start offset in the seeded example order (a comparison evaluates examples 0..n-1: the prior is
        measured elsewhere).
    batch_tokens: padded tokens per batch.
    max_batch: rows per batch at most.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    n: int = 20
    seed: int = 0
    skip: int = 1000
    batch_tokens: int = BATCH_TOKENS
    max_batch: int = MAX_BATCH

    def validate(self) -> "PriorConfig":
        self._validate_task()
        self._validate_model()
        check_split(self.n, self.skip)
        return self

    def to_dict(self) -> dict:
        return config_dict(self)


@dataclass
class PriorResult:
    """The positional prior: `record` is prior.json; `rows` has one flat dict per example x slot x layer: example_id,
    slot, layer, attention (the content-free item's own attention at that slot and layer), correct (the gold at that
    slot answered right); `format()` is what `posbias analyze prior` prints."""

    record: dict
    path: Path | None
    rows: list[dict] = field(default_factory=list, repr=False)  # one per example x slot x layer

    def format(self) -> str:
        """One line per slot: the prior (all layers, and relative to its mean) per layer band, and the accuracy."""
        return format_prior(self)


def tidy(rows: list[dict]) -> list[dict]:
    """rows.jsonl's rows (one per example: attention [layer][slot], correct [slot]) as one row per example x slot x layer."""
    return [{"example_id": r["example_id"], "slot": k, "layer": i, "attention": a, "correct": bool(r["correct"][k])}
            for r in rows for i, layer in enumerate(r["dummy"]) for k, a in enumerate(layer)]


def _one(scorer: Scorer, task: Task, ex, gold: int) -> dict:
    """One example: the dummy's attention at every slot per layer; with the gold at every slot in turn, the accuracy
    and every item's attention (items[g][k]: item k's, all layers, the gold at g)."""
    n = task.n_slots
    base = task.prompt(ex, gold)
    if not base.items:
        raise PosbiasError(f"task {task.name} does not list its items", "use kv-lookup, kv-uuid, nq or jsonl:PATH")
    dummies = [with_dummy(base, k, task.slot_label, task.dummy) for k in range(n)]
    by_layer = item_attention(scorer.loaded, dummies, scorer.chat, scorer.batch_tokens, scorer.max_batch, by_layer=True)
    dummy = by_layer.diagonal(dim1=0, dim2=2)  # [L, n]: the dummy's own attention at its slot, per layer
    rows = scorer.rows([ex], list(range(n)))
    acc = scorer.accuracy(rows)
    items = item_attention(scorer.loaded, [r.prompt for r in rows], scorer.chat, scorer.batch_tokens, scorer.max_batch)
    return {"example_id": base.example_id, "gold": gold, "dummy": dummy.tolist(), "correct": [acc[s] for s in range(n)],
            "items": items}


def run_prior(cfg: PriorConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | None = None,
              resume: bool = False, overwrite: bool = False, progress: bool = True) -> PriorResult:
    """Measure (or resume) the positional prior of `cfg.model` on `cfg.task`; out=None writes nothing."""
    cfg = (cfg or PriorConfig()).validate()
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    if not isinstance(task.all_placements()[0], int):
        raise PosbiasError(f"the prior moves one item; task {task.name} places two", "use a one-gold task")
    examples = task.examples(cfg.n, cfg.seed, cfg.skip)
    task.items(examples[0], 0)  # a task without items fails here, before anything loads
    folder = RunFolder(out, "prior", "prior.json", FILES)
    folder.check(resume, overwrite)
    loaded = loaded or open_model(cfg.model, cfg.dtype, cfg.device, progress, cfg.device_map, needs="the positional prior")
    scorer = Scorer(loaded, task, chat=cfg.chat, batch_tokens=cfg.batch_tokens, max_batch=cfg.max_batch)
    fingerprint = {"config": cfg.to_dict(), "task": task.config(), "model": loaded.info.get("name"),
                   "chat": scorer.chat, "dummy": task.dummy}
    with folder.open(fingerprint, resume, overwrite):
        log = JsonlLog(folder.file("rows.jsonl")) if out is not None else None
        rows = log.read(("example_id", "dummy", "correct")) if (log is not None and folder.resuming) else []
        done = {r["example_id"] for r in rows}
        t0 = time.perf_counter()
        todo = [(i, ex) for i, ex in enumerate(examples) if task.prompt(ex, 0).example_id not in done]
        pbar = bar(len(examples), "prior", "example", initial=len(examples) - len(todo), enabled=progress)
        for i, ex in todo:
            row = _one(scorer, task, ex, i % task.n_slots)
            rows.append(row)
            if log is not None:
                log.append([row])
            pbar.update()
        pbar.close()
        record = {**fingerprint, **summarize(rows), "versions": versions(), "seconds_this_run": time.perf_counter() - t0,
                  "fitted_on": {"task": jsonable(cfg.task), "seed": cfg.seed, "skip": cfg.skip, "n": cfg.n}}
        if out is not None:
            from ..report.plots import plot_prior

            plot_prior(record, f"{record['model']} on {jsonable(cfg.task)} (n={cfg.n})", folder.file("prior.png"))
            folder.finish(record)
    return PriorResult(record, folder.path, tidy(rows))


def summarize(rows: list[dict]) -> dict:
    """The prior per slot (all layers), per layer and per layer band, and the accuracy per slot."""
    dummy = torch.tensor([r["dummy"] for r in rows]).mean(0)  # [L, n]
    n_layers = dummy.shape[0]
    thirds = [range(i * n_layers // 3, (i + 1) * n_layers // 3) for i in range(3)]
    accuracy = torch.tensor([r["correct"] for r in rows], dtype=torch.float).mean(0)
    out = {"prior": dummy.mean(0).tolist(), "by_layer": dummy.tolist(),
           "bands": {b: dummy[list(t)].mean(0).tolist() for b, t in zip(BANDS, thirds)},
           "accuracy": accuracy.tolist(), "examples": len(rows)}
    with_items = [r["items"] for r in rows if "items" in r]  # rows of an older posbias lack them
    return {**out, **(_signal(torch.tensor(with_items), dummy.mean(0)) if with_items else {})}


def _signal(items: torch.Tensor, prior: torch.Tensor) -> dict:
    """items [E, gold slot, item slot]: real items' attention per slot relative to the prompt's mean (averaged over
    examples and gold slots), the gold's own attention at each slot (relative), and per gold slot how often the most
    attended item is the gold, on attention alone and on attention - prior (Eq. 4's relevance)."""
    n = items.shape[-1]
    rel = items / items.mean(-1, keepdim=True)
    gold = torch.arange(n)
    return {"items": rel.mean((0, 1)).tolist(), "gold_attention": rel[:, gold, gold].mean(0).tolist(),
            "recall_attention": (items.argmax(-1) == gold).float().mean(0).tolist(),
            "recall_relevance": ((items - prior).argmax(-1) == gold).float().mean(0).tolist()}


def format_prior(res: PriorResult) -> str:
    """One line per slot: the prior (all layers, relative to its mean) per band, and the accuracy."""
    r = res.record
    mean = sum(r["prior"]) / len(r["prior"])
    signal = "items" in r
    head = f"{'slot':>4} {'prior':>10} {'/ mean':>7} " + " ".join(f"{b:>13}" for b in BANDS) + f" {'accuracy':>9}"
    head += f" {'items/mean':>10} {'gold/mean':>9} {'top=gold':>8} {'rel top=gold':>12}" if signal else ""
    lines = [head]
    for k, p in enumerate(r["prior"]):
        bands = " ".join(f"{r['bands'][b][k]:>13.2e}" for b in BANDS)
        line = f"{k:>4} {p:>10.2e} {p / mean:>7.2f} {bands} {r['accuracy'][k]:>9.3f}"
        if signal:
            line += (f" {r['items'][k]:>10.2f} {r['gold_attention'][k]:>9.2f} {r['recall_attention'][k]:>8.2f}"
                     f" {r['recall_relevance'][k]:>12.2f}")
        lines.append(line)
    if signal:
        lines.append("items/mean: real items' attention at the slot; gold/mean: the gold's, at the slot; top=gold: the most "
                     "attended item is the gold (rel: after subtracting the prior), with the gold at the slot")
    return "\n".join(lines)
