"""Token and thought shifting (Pos2Distill Sec. 3, Fig. 3a, Appendix B/D, Figs. 8 and 9).

For each example the model answers greedily at the advantageous placement (the sink for retrieval, the
recent pair for two hops): the anchor response. At every other (trivial) placement we then measure, with
that placement's prompt:

  response       the greedy answer there, and whether it is correct (the task's metric)
  divergence     teacher-forcing the anchor response: the first step where the greedy token differs from
                 the anchor's token (Fig. 3a), how many steps differ, and at the first one the rank and
                 probability of the anchor's token and the top-10 tokens (Fig. 8)
  perplexity     of the anchor response and of the gold answer as the task writes it (Fig. 9)

Exactly one differing step means one corrected token recovers the whole anchor response (the paper's
"token recovery"): a single-token shift. Low anchor perplexity under a trivial prompt means the two
placements' responses differ at a few decisive tokens (token shifting, retrieval); a high one that the
response space itself moved (thought shifting, reasoning with a chain of thought).

Files in OUT: run.json, rows.jsonl (one row per example x trivial placement, appended per chunk of
examples; a resume skips the finished examples), shifting.json (config, per-placement and overall
summaries; written last), shifting.png (Fig. 9), divergence.png (Fig. 8 / Fig. 3a).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..backends import open_model
from ..errors import PosbiasError
from ..eval.config import ModelChoice, TaskChoice, check_split, config_dict
from ..methods import Method, get_method
from ..models.load import Loaded
from ..runs import JsonlLog, RunFolder, versions
from ..runs import progress as progress_bar
from ..scoring.scorer import Scorer
from ..tasks import Prompt, as_json, get_task, label, placement_key, positions_spec

ROW_KEYS = ("example_id", "position", "correct", "ppl_anchor")
FILES = ("rows.jsonl", "shifting.png", "divergence.png")
CHUNK = 8  # examples per chunk: the unit of progress and of resume


@dataclass
class ShiftingConfig(TaskChoice, ModelChoice):
    """Token shifting: the model's response at each placement against the advantageous one (Pos2Distill Fig. 3a, 8, 9).

    n: examples.
    seed: example selection / generation seed.
    skip: start offset in the example order (disjoint splits).
    positions: the placements measured: a list of slots (or pairs), one slot, or a string as a sweep takes (0,4,9 |
        0%,50%,100% | all; two hops: connected,disconnected,reversed | 0:1,5:13); None: the task's, all slots / the
        three modes.
    max_new_tokens: response length (default: the task's).
    method: a training-free method applied at every placement, the anchor's too: a spec (`posbias.METHODS`) or a
        Method object.
    top: tokens listed at the divergence (Fig. 8).
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    n: int = 20
    seed: int = 0
    skip: int = 0
    positions: str | None = None
    max_new_tokens: int | None = None
    method: str | Method = "none"
    top: int = 10

    def validate(self) -> "ShiftingConfig":
        self._validate_task()
        self._validate_model()
        check_split(self.n, self.skip)
        self.positions = positions_spec(self.positions)
        if self.top < 1:
            raise PosbiasError(f"`top` must be at least 1, got {self.top}", "use `top=10`")
        return self

    def to_dict(self) -> dict:
        return config_dict(self)


@dataclass
class ShiftingResult:
    """Token shifting: `record` is shifting.json; `rows` (rows.jsonl) has one dict per example x placement other than
    the anchor: example_id, position, the anchor's and this placement's responses and verdicts, where the anchor
    response's tokens first diverge (rank and probability of the anchor token there, the top tokens), and the
    perplexities of the anchor response and the gold answer; `format()` is what `posbias analyze shifting` prints."""

    summary: dict  # overall: perplexities, accuracies, divergence and single-token-shift shares
    per_position: list[dict]
    rows: list[dict] = field(repr=False)
    record: dict = field(repr=False)

    def format(self) -> str:
        """Per placement: accuracy, divergence from the anchor response, single-token shifts, perplexities."""
        return format_shifting(self)


def _ppl(logprob: float, n_tokens: int) -> float:
    return math.exp(-logprob / max(n_tokens, 1))


class _Measure:
    """The scorers of one analysis: generation at every placement, token details of the anchor response and
    the perplexity of the gold answer at the trivial ones."""

    def __init__(self, loaded: Loaded, task, cfg: ShiftingConfig, method: Method):
        self.task, self.method, self.top = task, method, cfg.top
        self.anchor = task.advantageous()
        self.positions = [p for p in task.placements(cfg.positions) if p != self.anchor]
        self.gen = Scorer(loaded, task, "generate", cfg.max_new_tokens, cfg.chat)
        self.tf = Scorer(loaded, task, "teacher-forced", chat=cfg.chat)

    def chunk(self, examples: list) -> list[dict]:
        """One row per example x trivial placement."""
        got = {(r["example_id"], placement_key(r["position"])): r
               for r in self.gen.score(self.gen.rows(examples, [self.anchor, *self.positions]), self.method)}
        rows = []
        for ex in examples:
            a = got[(ex.id, self.anchor)]
            for p in self.positions:
                g = got[(ex.id, p)]
                rows.append({"example_id": ex.id, "position": as_json(p), "anchor_response": a["prediction"],
                             "anchor_correct": bool(a["correct"]), "response": g["prediction"], "correct": bool(g["correct"]),
                             "same_response": g["prediction"] == a["prediction"]})
        self._add_details(examples, rows)
        return rows

    def _add_details(self, examples: list, rows: list[dict]) -> None:
        by_key = {(r["example_id"], placement_key(r["position"])): r for r in rows}
        prompts = {(ex.id, p): self.task.build(ex, p) for ex in examples for p in self.positions}
        anchor = [_target(pr, by_key[k]["anchor_response"], self.task) for k, pr in prompts.items()
                  if by_key[k]["anchor_response"].strip()]  # an empty anchor response has no tokens to follow
        for d in self.tf.details(self.tf.prompt_rows(anchor, continuation=True), self.method, self.top):
            r = by_key[(d["example_id"], placement_key(d["position"]))]
            r.update({"ppl_anchor": _ppl(d.pop("logprob"), d["tokens"]), "anchor_tokens": d.pop("tokens"),
                      **{k: v for k, v in d.items() if k not in ("example_id", "position")}})
        gold = self.tf.prompt_rows([_target(pr, None, self.task) for pr in prompts.values()])
        for d in self.tf.details(gold, self.method, 1):
            by_key[(d["example_id"], placement_key(d["position"]))]["ppl_gold"] = _ppl(d["logprob"], d["tokens"])
        for r in rows:
            r.setdefault("ppl_anchor", None)


def _target(prompt: Prompt, response: str | None, task) -> Prompt:
    """The prompt with the response to score as its only answer (the gold target when response is None)."""
    return replace(prompt, answers=(task.gold_target(prompt) if response is None else response,))


def _median_mean(values: list[float]) -> dict | None:
    return {"median": statistics.median(values), "mean": statistics.fmean(values), "n": len(values)} if values else None


def summarize(rows: list[dict]) -> dict:
    """Rates over rows: accuracy, anchor accuracy, how often the response leaves the anchor's, and of those
    divergences, and of the errors (anchor right, this placement wrong), how many are single-token shifts and keep
    the anchor's token in the top 10 (on a task where the anchor is rarely right the divergences are what counts)."""
    n = len(rows)
    diverged = [r for r in rows if r.get("diverge_at") is not None]
    errors = [r for r in rows if r["anchor_correct"] and not r["correct"]]
    err_div = [r for r in errors if r.get("diverge_at") is not None]

    def share(sel, cond):
        return sum(1 for r in sel if cond(r)) / len(sel) if sel else None

    return {
        "n": n, "accuracy": share(rows, lambda r: r["correct"]), "anchor_accuracy": share(rows, lambda r: r["anchor_correct"]),
        "diverged": share(rows, lambda r: r.get("diverge_at") is not None),
        "diverged_single_token": share(diverged, lambda r: r["mismatches"] == 1),  # every divergence, right or wrong
        "diverged_anchor_in_top10": share(diverged, lambda r: r["anchor_rank"] <= 10), "errors": len(errors),
        "errors_single_token": share(err_div, lambda r: r["mismatches"] == 1),
        "errors_anchor_in_top10": share(err_div, lambda r: r["anchor_rank"] <= 10),
        "errors_anchor_rank_median": statistics.median([r["anchor_rank"] for r in err_div]) if err_div else None,
        "errors_anchor_prob_mean": statistics.fmean([r["anchor_prob"] for r in err_div]) if err_div else None,
        "diverge_at_mean": statistics.fmean([r["diverge_at"] for r in diverged]) if diverged else None,
        "ppl_anchor": _median_mean([r["ppl_anchor"] for r in rows if r.get("ppl_anchor") is not None]),
        "ppl_gold": _median_mean([r["ppl_gold"] for r in rows if r.get("ppl_gold") is not None]),
    }


def _summaries(rows: list[dict], positions: list, task) -> dict:
    per = [{"position": as_json(p), **summarize([r for r in rows if placement_key(r["position"]) == p])} for p in positions]
    return {"task": task.name, "anchor_placement": as_json(task.advantageous()), "per_position": per, "all": summarize(rows)}


def run_shifting(cfg: ShiftingConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | None = None,
                 resume: bool = False, overwrite: bool = False, progress: bool = True) -> ShiftingResult:
    """Measure token and thought shifting; with `out`, rows.jsonl (per chunk of examples), the figures and
    shifting.json (last). `resume` continues a killed run from its finished chunks with the same numbers."""
    cfg = (cfg or ShiftingConfig()).validate()
    method = get_method(cfg.method)
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    method = method.for_task(task)  # a task-dependent default resolved once: the fingerprint records what runs
    examples = task.examples(cfg.n, cfg.seed, cfg.skip)  # fails early on a bad split
    if not [p for p in task.placements(cfg.positions) if p != task.advantageous()]:  # before the model loads
        raise PosbiasError(f"`positions` names only the anchor placement {as_json(task.advantageous())}, which the "
                           "others are compared to", "name other placements too, e.g. `positions=all`")
    folder = RunFolder(out, "shifting analysis", "shifting.json", FILES)
    folder.check(resume, overwrite)
    if resume and out is not None:  # a row log a resume cannot read: refused before the model loads
        JsonlLog(folder.file("rows.jsonl")).read(ROW_KEYS)
    loaded = loaded or open_model(cfg.model, cfg.dtype, cfg.device, progress, cfg.device_map, needs="token shifting")
    method.check(loaded)
    m = _Measure(loaded, task, cfg, method)
    fingerprint = {"config": cfg.to_dict(), "model": loaded.info, "task": task.config(), "method": method.config(),
                   **m.gen.settings()}
    with folder.open(fingerprint, resume, overwrite):
        log = JsonlLog(folder.file("rows.jsonl")) if out is not None else None
        rows = log.read(ROW_KEYS) if (log and folder.resuming) else []
        done = {r["example_id"] for r in rows}
        bar = progress_bar(len(examples), f"shifting {task.name} on {cfg.model}", "example", initial=len(done),
                           enabled=progress)
        for i in range(0, len(examples), CHUNK):
            chunk = [ex for ex in examples[i : i + CHUNK] if ex.id not in done]
            if chunk:
                new = m.chunk(chunk)
                rows += new
                if log is not None:
                    log.append(new)
                bar.update(len(chunk))
        bar.close()
        order = {ex.id: i for i, ex in enumerate(examples)}
        rows.sort(key=lambda r: (order[r["example_id"]], m.positions.index(placement_key(r["position"]))))
        summary = _summaries(rows, m.positions, task)
        record = {**fingerprint, "versions": versions(), **summary}
        if folder.path is not None:
            from ..report.plots import plot_divergence, plot_shifting

            title = f"{task.name} on {cfg.model}" + ("" if method.name == "none" else f", {method.label}")
            plot_shifting(summary, title, folder.file("shifting.png"))
            plot_divergence(summary, rows, title, folder.file("divergence.png"))
        folder.finish(record)
    return ShiftingResult(summary["all"], summary["per_position"], rows, record)


def _num(v: float | None, d: int = 3) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def format_shifting(res: ShiftingResult) -> str:
    s, lines, f = res.record, [], _num
    lines.append(f"{s['task']}: anchor placement {label(s['anchor_placement'])} (accuracy {f(s['all']['anchor_accuracy'])})")
    lines.append(f"{'placement':>9}  {'acc':>5}  {'diverged':>8}  {'1-token':>7}  {'errors':>6}  {'1-token':>7}  "
                 f"{'in top10':>8}  {'ppl anchor':>10}  {'ppl gold':>8}")
    for p in [*res.per_position, {"position": "all", **s["all"]}]:
        a, g = p["ppl_anchor"], p["ppl_gold"]
        lines.append(f"{label(p['position']) if p['position'] != 'all' else 'all':>9}  {f(p['accuracy'], 2):>5}  "
                     f"{f(p['diverged'], 2):>8}  {f(p['diverged_single_token'], 2):>7}  {p['errors']:>6}  "
                     f"{f(p['errors_single_token'], 2):>7}  "
                     f"{f(p['errors_anchor_in_top10'], 2):>8}  {f(a and a['median']):>10}  {f(g and g['median']):>8}")
    lines.append("diverged: the greedy response leaves the anchor's; errors: anchor right, here wrong; 1-token: of the "
                 "divergences / of the errors, one corrected token recovers the anchor response; in top10: of the errors, "
                 "the anchor's token is among the 10 most probable at the first divergence; ppl: medians")
    return "\n".join(lines)
