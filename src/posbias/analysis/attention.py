"""Attention per document: how much attention the answer-producing rows put on each item, by gold position.

Pos2Distill Sec. 4 ("Mechanistic Insights", Fig. 7) shows the attention over 20 documents as the gold moves;
LPES Appendix A (Fig. 5) the attention to the middle third of the context as a uniform RoPE scale factor
grows. This pipeline measures both on a real model, cheaply (models/attention.py reduces the attention to
per-span masses inside the attention computation), under any RoPE-rescaling method, and puts beside them
the model's accuracy on the same rows (the task's engine, through the Scorer) and, for short prompts, the
real-model rollout's predicted gold share (theory next to measurement).

Files in OUT (runs.RunFolder protocol): run.json; rows.jsonl, one tidy row per example x placement (x scale)
x layer, appended per batch (a resume skips the rows done and gives identical numbers); attention.json, the
record (written last); figures attention_heatmap.png, attention_gold.png, attention_scales.png (with
`scales`), attention_rollout.png (with the rollout).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..backends import open_model
from ..errors import PosbiasError
from ..eval.config import ModelChoice, TaskChoice, check_split, config_dict
from ..methods import Method, UniformScaling, get_method
from ..models.load import Loaded
from ..runs import JsonlLog, RunFolder, versions
from ..runs import progress as progress_bar
from ..scoring.encode import plan_batches
from ..scoring.scorer import Scorer
from ..scoring.spans import item_spans
from ..tasks import as_json, get_task, label, placement_key, positions_spec
from .attention_measure import ROWS, Item, measure_batch
from .attention_summary import summarize

FILES = ("rows.jsonl", "attention_heatmap.png", "attention_gold.png", "attention_scales.png", "attention_rollout.png")
ROW_KEYS = ("example_id", "position", "layer", "items", "gold", "correct")
ROLLOUT_AUTO_TOKENS = 1000  # rollout=None: on when every prompt has at most this many tokens
_REFUSED = {"mspoe": "it installs its own attention function (per-head rotation inside it), which the capture would "
                     "see un-rotated", "buckets": "it runs several copies of every sequence"}


@dataclass
class AttentionConfig(TaskChoice, ModelChoice):
    """Attention per document by gold position and layer (Pos2Distill Fig. 7), with accuracy and the real-model
    rollout beside it.

    n: examples.
    seed: example selection / generation seed.
    skip: start offset in the example order (disjoint splits).
    positions: the placements measured: a list of slots, one slot, or a string as a sweep takes (0,4,9 |
        0%,50%,100% | all); None: the task's.
    method: a RoPE-rescaling method spec (none | pi:1.2 | layers:... | lpes:DIR).
    rows: last: the last prompt token | answer: every row that predicts an answer token, averaged.
    heads: also store the per-head masses.
    scales: uniform RoPE factors for the LPES Fig. 5 study, e.g. 1.0,1.2,1.5 (replaces method).
    rollout: the real-model rollout beside the accuracy; None: on for prompts <= 1000 tokens.
    residual: rollout: A' = a I + (1 - a) A (0 = attention alone, the emergence paper's setting).
    batch_tokens: padded tokens per capture batch.
    max_batch: rows per batch at most.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    n: int = 20
    seed: int = 0
    skip: int = 0
    positions: str | None = None
    method: str | Method = "none"
    rows: str = "last"
    heads: bool = False
    scales: tuple[float, ...] | None = None
    rollout: bool | None = None
    residual: float = 0.5
    batch_tokens: int = 8192
    max_batch: int = 16

    def validate(self) -> "AttentionConfig":
        self._validate_task()
        self._validate_model()
        check_split(self.n, self.skip)
        self.positions = positions_spec(self.positions)
        if self.rows not in ROWS:
            raise PosbiasError(f"unknown `rows` {self.rows!r}", "use last or answer")
        if self.scales is not None:
            bad = [s for s in self.scales if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0)]
            if not self.scales or bad:
                raise PosbiasError(f"`scales` must be positive numbers, got {list(self.scales)}", "e.g. `scales=1.0,1.2,1.5`")
            if len(set(self.scales)) != len(self.scales):
                raise PosbiasError(f"`scales` repeats a factor: {list(self.scales)}", "give each factor once")
            if get_method(self.method).name != "none":
                raise PosbiasError("`scales` and `method` both set the RoPE scaling", "pass one of them")
        if not 0 <= self.residual < 1:
            raise PosbiasError(f"`residual` must be in [0, 1), got {self.residual}", "use 0 or 0.5")
        if self.batch_tokens < 1 or self.max_batch < 1:
            raise PosbiasError("`batch_tokens` and `max_batch` must be at least 1", "pass positive batch sizes")
        return self

    def methods(self) -> list[tuple[float | None, Method]]:
        """(scale, method) pairs to measure: one per scale, else the one method (scale None)."""
        if self.scales is not None:
            return [(float(s), UniformScaling(float(s))) for s in self.scales]
        method = get_method(self.method)
        if method.name in _REFUSED:
            raise PosbiasError(f"the attention capture cannot run under {method.name}: {_REFUSED[method.name]}",
                               "use none or a RoPE-rescaling method (pi, layers, lpes)")
        return [(None, method)]

    def to_dict(self) -> dict:
        d = config_dict(self)
        d["scales"] = list(self.scales) if self.scales is not None else None
        return d


@dataclass
class AttentionResult:
    """Attention per document: `record` is attention.json; `rows` (rows.jsonl) has one dict per example x placement x
    layer (x scale with `scales`): example_id, position, correct, layer, items (the attention mass on each item),
    gold, first (the first token's), other, and with the rollout its rollout_* masses; `format()` is what
    `posbias analyze attention` prints."""

    summary: dict  # bands, middle slots, per scale: middle-third share and per-placement stats
    rows: list[dict] = field(repr=False)
    record: dict = field(repr=False)  # the content of attention.json
    out: Path | None = None

    def format(self) -> str:
        """Per scale, the middle-third share; per placement, accuracy, gold mass by layer band, rollout share."""
        return format_attention(self)


def _items(loaded: Loaded, task, scorer: Scorer, examples, positions) -> list[Item]:
    rows = scorer.rows(examples, positions)  # refused over the window
    out = []
    for ex, row in zip([ex for ex in examples for _ in positions], rows):  # scorer.rows is example-major
        spans = item_spans(loaded.tokenizer, row.prompt, task.items(ex, row.prompt.position), scorer.chat)
        if spans.ids != row.prompt_ids:
            raise PosbiasError(f"the span tokenisation of example {row.prompt.example_id} differs from the scored one",
                               "use a tokenizer with offset mapping that tokenises text deterministically")
        out.append(Item(row, spans))
    return out


def _done_keys(rows: list[dict], n_layers: int) -> set:
    """(example, placement, scale) keys with every layer's row present."""
    count: dict = {}
    for r in rows:
        k = (r["example_id"], placement_key(r["position"]), r.get("scale"))
        count.setdefault(k, set()).add(r["layer"])
    return {k for k, layers in count.items() if len(layers) == n_layers}


def _measure(cfg, scorer, items, pairs, done, log, rollout, show) -> list[dict]:
    """Every (scale, method) x batch not done: rows appended to `log` batch by batch."""
    batches = plan_batches([len(it.spans.ids) for it in items], cfg.batch_tokens, cfg.max_batch)
    total = len(items) * len(pairs)
    bar = progress_bar(total, f"attention on {cfg.model}", "row", initial=len(done), enabled=show)
    new: list[dict] = []
    try:
        for scale, method in pairs:
            with method.apply(scorer.loaded) as active:
                for idx in batches:
                    batch = [items[i] for i in idx]
                    if all((it.row.prompt.example_id, it.row.prompt.position, scale) in done for it in batch):
                        continue
                    rows = measure_batch(scorer, active, batch, scale, cfg.rows, cfg.heads, rollout)
                    if log is not None:
                        log.append(rows)
                    new.extend(rows)
                    bar.update(len(batch))
    finally:
        bar.close()
    return new


def run_attention(cfg: AttentionConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | None = None,
                  resume: bool = False, overwrite: bool = False, progress: bool = True) -> AttentionResult:
    """Measure (or resume) the attention per item; out=None writes nothing; `loaded` reuses a loaded model."""
    cfg = (cfg or AttentionConfig()).validate()
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    pairs = [(s, m.for_task(task)) for s, m in cfg.methods()]  # resolved once, as the fingerprint records them
    positions = task.placements(cfg.positions)
    examples = task.examples(cfg.n, cfg.seed, cfg.skip)
    task.items(examples[0], positions[0])  # a task without items fails here, before anything loads
    folder = RunFolder(out, "attention analysis", "attention.json", FILES)
    folder.check(resume, overwrite)
    loaded = loaded or open_model(cfg.model, cfg.dtype, cfg.device, progress, cfg.device_map, needs="the attention analysis")
    for _, method in pairs:
        method.check(loaded)
    scorer = Scorer(loaded, task, chat=cfg.chat)
    items = _items(loaded, task, scorer, examples, positions)
    longest = max(len(it.spans.ids) for it in items)
    rollout = cfg.rollout if cfg.rollout is not None else longest <= ROLLOUT_AUTO_TOKENS
    n_layers = loaded.model.config.num_hidden_layers
    resolved = {**cfg.to_dict(), **scorer.settings(), "positions_resolved": [as_json(p) for p in positions],
                "rollout_used": rollout, "longest_prompt": longest}
    fingerprint = {"config": resolved, "task": task.config(), "model": loaded.info,
                   "methods": [m.config() for _, m in pairs]}
    with folder.open(fingerprint, resume, overwrite):
        log = JsonlLog(folder.file("rows.jsonl")) if out is not None else None
        old = log.read(ROW_KEYS) if (log is not None and folder.resuming) else []
        done = _done_keys(old, n_layers)
        t0 = time.perf_counter()
        new = _measure(cfg, scorer, items, pairs, done, log, cfg.residual if rollout else None, progress)
        rows = [r for r in old if (r["example_id"], placement_key(r["position"]), r.get("scale")) in done] + new
        summary = summarize(rows, [s for s, _ in pairs], positions, n_layers, task.n_slots)
        record = {**fingerprint, "versions": versions(), "seconds_this_run": time.perf_counter() - t0,
                  "rows_this_run": len(new) // max(n_layers, 1), **summary}
        if out is not None:
            _figures(folder, record)
            folder.finish(record)
    return AttentionResult(summary, rows, record, folder.path)


def _figures(folder: RunFolder, record: dict) -> None:
    from ..report.attention_plots import plot_attention

    plot_attention(record, folder.path)


def format_attention(res: AttentionResult) -> str:
    """Per scale: the middle-third share; per placement: accuracy, gold mass by band, late gold share, rollout."""
    lines = []
    for sc in res.summary["per_scale"]:
        head = f"scale {sc['scale']:g}: " if sc["scale"] is not None else ""
        ms = sc["middle_share"]
        lines.append(f"{head}middle-third share of item attention: early {ms['early']:.3f} | middle {ms['middle']:.3f} | "
                     f"late {ms['late']:.3f} | all {ms['all']:.3f}")
        lines.append(f"{'position':>8}  {'acc':>5}  {'gold early':>10}  {'middle':>7}  {'late':>7}  {'first(late)':>11}  "
                     f"{'gold share(late)':>16}  {'rollout share':>13}")
        for p in sc["per_position"]:
            b = p["bands"]
            roll = p.get("rollout_gold_share")
            lines.append(f"{label(p['position']):>8}  {p['accuracy']:>5.2f}  {b['early']['gold']:>10.4f}  "
                         f"{b['middle']['gold']:>7.4f}  {b['late']['gold']:>7.4f}  {b['late']['first']:>11.3f}  "
                         f"{b['late']['gold_share']:>16.3f}  {'-' if roll is None else f'{roll:.3f}':>13}")
    return "\n".join(lines)
