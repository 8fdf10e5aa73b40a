"""Token and thought shifting, measured by perplexity (Pos2Distill Sec. 3 and Appendix D, Fig. 9).

For each example the model answers greedily at the advantageous placement (the sink for retrieval, the
recent pair for two hops). At every other placement of the sweep we then measure, under that placement's
prompt, the perplexity of

  anchor  the advantageous response (what Pos2Distill trains towards)
  gold    the gold answer as the task writes a correct response (what SFT trains towards)

Low perplexity of the anchor response under a trivial prompt means the two placements' responses differ
at a few decisive tokens only (token shifting, retrieval); a high one means the response space itself
moved (thought shifting, reasoning with a chain of thought). Perplexity = exp(mean negative log-likelihood
of the target tokens), teacher-forced through the same engine as a sweep.

Files in OUT: shifting.json (config, per-placement and overall summaries; written last), rows.jsonl (one row
per example x placement), shifting.png.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..eval.config import ModelChoice, TaskChoice, check_split, config_dict
from ..eval.scorer import Scorer
from ..models.load import Loaded, load_model
from ..runs import JsonlLog, RunFolder, versions
from ..tasks import Prompt, as_json, get_task, label, placement_key


@dataclass
class ShiftingConfig(TaskChoice, ModelChoice):
    n: int = 20  # examples
    seed: int = 0
    skip: int = 0
    positions: str | None = None  # the placements measured (default: the task's, all slots / the three modes)
    max_new_tokens: int | None = None  # anchor response length (default: the task's)

    def validate(self) -> "ShiftingConfig":
        self._validate_model()
        check_split(self.n, self.skip)
        return self

    def to_dict(self) -> dict:
        return config_dict(self)


@dataclass
class ShiftingResult:
    summary: dict  # anchor_response / gold_answer: overall median and mean perplexity; anchor_accuracy
    per_position: list[dict]
    record: dict = field(repr=False)


def _ppl(row: dict, n_tokens: int) -> float:
    return math.exp(-row["logprob"] / max(n_tokens, 1))


def measure(loaded: Loaded, cfg: ShiftingConfig) -> tuple[list[dict], dict]:
    """(rows, summary): per example x placement, the perplexity of the anchor response and of the gold answer."""
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    anchor = task.advantageous()
    positions = [p for p in task.placements(cfg.positions) if p != anchor]
    examples = task.examples(cfg.n, cfg.seed, cfg.skip)
    gen = Scorer(loaded, task, "generate", cfg.max_new_tokens, cfg.chat)
    responses = {r["example_id"]: r for r in gen.score(gen.rows(examples, [anchor]))}
    tf = Scorer(loaded, task, "teacher-forced", chat=cfg.chat)
    rows = []
    for target in ("anchor", "gold"):
        prompts = [_target(task.build(ex, p), responses[ex.id]["prediction"] if target == "anchor" else None, task)
                   for ex in examples for p in positions]
        prompts = [p for p in prompts if p.answers[0].strip()]  # an empty anchor response has no perplexity
        encoded = tf.prompt_rows(prompts, continuation=target == "anchor")  # a response carries its own leading space
        n_tok = {e.key: len(e.answer_ids[0]) for e in encoded}
        for r in tf.score(encoded):
            k = n_tok[(r["example_id"], placement_key(r["position"]))]
            rows.append({"example_id": r["example_id"], "position": r["position"], "target": target, "ppl": _ppl(r, k),
                         "tokens": k})
    return rows, _summarize(rows, positions, responses, task)


def _target(prompt: Prompt, response: str | None, task) -> Prompt:
    """The prompt with the response to score as its only answer (the gold target when response is None)."""
    return replace(prompt, answers=(task.gold_target(prompt) if response is None else response,))


def _summarize(rows: list[dict], positions: list, responses: dict, task) -> dict:
    def stats(sel):
        v = [r["ppl"] for r in sel]
        return {"median": statistics.median(v), "mean": statistics.fmean(v), "n": len(v)} if v else None

    per = [{"position": as_json(p), **{t: stats([r for r in rows if r["target"] == t and placement_key(r["position"]) == p])
                                       for t in ("anchor", "gold")}} for p in positions]
    acc = sum(bool(r["correct"]) for r in responses.values()) / max(len(responses), 1)
    return {"task": task.name, "anchor_placement": as_json(task.advantageous()), "anchor_accuracy": acc,
            "per_position": per, "anchor_response": stats([r for r in rows if r["target"] == "anchor"]),
            "gold_answer": stats([r for r in rows if r["target"] == "gold"])}


def run_shifting(cfg: ShiftingConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | None = None,
                 overwrite: bool = False, progress: bool = True) -> ShiftingResult:
    """Measure the perplexities; with `out`, write rows.jsonl, the figure and shifting.json (last). A run takes
    minutes and keeps no partial state: a killed one is rerun with `overwrite=True`."""
    cfg = (cfg or ShiftingConfig()).validate()
    get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options).examples(cfg.n, cfg.seed, cfg.skip)  # fail early
    folder = RunFolder(out, "shifting analysis", "shifting.json", ("rows.jsonl", "shifting.png"))
    folder.check(False, overwrite)
    loaded = loaded or load_model(cfg.model, cfg.dtype, cfg.device, progress)
    with folder.open({"config": cfg.to_dict(), "model": loaded.info}, False, overwrite):
        rows, summary = measure(loaded, cfg)
        record = {"config": cfg.to_dict(), "model": loaded.info, "versions": versions(), **summary}
        if folder.path is not None:
            from ..report.plots import plot_shifting

            JsonlLog(folder.file("rows.jsonl")).append(rows)
            plot_shifting(summary, f"{summary['task']} on {cfg.model}", folder.file("shifting.png"))
        folder.finish(record)
    return ShiftingResult({k: summary[k] for k in ("anchor_response", "gold_answer", "anchor_accuracy")},
                          summary["per_position"], record)


def format_shifting(res: ShiftingResult) -> str:
    s, lines = res.record, []
    lines.append(f"{s['task']}: anchor placement {label(s['anchor_placement'])} (accuracy {s['anchor_accuracy']:.3f})")
    lines.append(f"{'placement':>9}  {'ppl anchor response':>19}  {'ppl gold answer':>15}   (medians)")
    for p in res.per_position:
        a, g = p["anchor"], p["gold"]
        lines.append(f"{label(p['position']):>9}  {a['median'] if a else float('nan'):>19.3f}  "
                     f"{g['median'] if g else float('nan'):>15.3f}")
    a, g = s["anchor_response"], s["gold_answer"]
    lines.append(f"all: anchor response median {a['median']:.3f} (mean {a['mean']:.3f}, {a['n']} rows); "
                 f"gold answer median {g['median']:.3f} (mean {g['mean']:.3f})")
    return "\n".join(lines)
