"""The positional hidden-channel search on a real model (Yu et al. 2025; the public code's
search_dims.py): (a) hidden states averaged over random text -> the smoothest monotone channels
(core/positional_channels.py); (b) each candidate x scale applied through the `hidden` Method on a calibration
split of the task, scored by the same Scorer a sweep uses; the best one is the result.

Files in OUT (runs.RunFolder protocol):
  run.json           the search's fingerprint: config, model, scoring settings (chat template), slots, layers
  stats.npy          running sum of the hidden states, (L + 1, length, H) float32, with stats.json (samples done)
  candidates.json    the candidate channels (written once step (a) is complete)
  evals.jsonl        one line per scored (channel, scale) and the unmodified model (appended; a kill loses one)
  hidden.json        the result (atomic, last): channel, scale, layers, model, every evaluation, `fitted_on`

Resume (`resume=True`) continues the sums from stats.json and re-scores nothing evals.jsonl holds; the result
equals an uninterrupted run. A finished folder resumed returns its result (the cache per model and template).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ...backends import open_model
from ...core.positional_channels import find_candidates
from ...errors import PosbiasError
from ...methods.hidden import RESULT, HiddenScale
from ...models.hidden import middle_layers
from ...models.load import Loaded
from ...runs import JsonlLog, RunFolder, read_json, write_json_atomic
from ...runs import progress as progress_bar
from ...scoring.scorer import Scorer
from ...tasks import Task, get_task
from .config import HiddenSearchConfig

STATS, STATS_STATE, CANDIDATES, EVALS = "stats.npy", "stats.json", "candidates.json", "evals.jsonl"
BATCH = 4  # random-text sequences per forward


@dataclass
class HiddenSearchResult:
    """A hidden-channel search: `record` is hidden.json; `rows` has one flat dict per setting scored on the calibration
    split (the unmodified model first, with channel and scale None; then each candidate channel x scale): channel,
    scale, mean_accuracy, loss, and accuracy_SLOT per calibration slot; `format()` is what `posbias hidden search`
    prints."""

    channel: int
    scale: float
    layers: list[int]  # use them with the method hidden:OUT
    score: dict  # the chosen setting on the calibration split: accuracy per slot, mean accuracy, loss
    baseline: dict  # the unmodified model on the same split
    candidates: list[dict]
    record: dict = field(repr=False)  # the content of hidden.json

    @property
    def rows(self) -> list[dict]:
        return [{"channel": e["channel"], "scale": e["scale"], "mean_accuracy": e["mean_accuracy"], "loss": e["loss"],
                 **{f"accuracy_{k}": v for k, v in e["accuracy"].items()}}
                for e in [self.baseline, *self.record["evaluations"]]]

    def format(self) -> str:
        """The candidate channels, the chosen channel, scale and layers, its calibration accuracy and loss against
        the unmodified model's, and a note when no candidate beat it."""
        rec, s, b = self.record, self.score, self.baseline
        lines = ["candidates (smoothest first): " + ", ".join(f"{c['channel']}{'+' if c['direction'] > 0 else '-'}"
                                                                for c in self.candidates),
                 f"channel {self.channel}, scale {self.scale:g}, layers {self.layers[0]}-{self.layers[-1]} "
                 f"(chosen by {rec['select']})",
                 f"calibration slots {', '.join(s['accuracy'])}: {_accuracies(s)} (loss {_loss(s)})   "
                 f"unmodified: {_accuracies(b)} (loss {_loss(b)})"]
        if not rec["beats_unmodified"]:
            lines.append("note: no candidate beat the unmodified model on the calibration split")
        return "\n".join(lines)


def _accuracies(ev: dict) -> str:
    return " / ".join(f"{v:.3f}" for v in ev["accuracy"].values())


def _loss(ev: dict) -> str:
    return f"{ev['loss']:.3f}" if ev["loss"] is not None else "-"


def calibration_positions(cfg: HiddenSearchConfig, task: Task) -> list[int]:
    if task.n_gold != 1:
        raise PosbiasError(f"the hidden-channel search places one gold item per prompt; {task.name} places two",
                           "search on a one-gold task (kv-lookup, kv-uuid, nq, jsonl)")
    positions = list(cfg.positions or (0, task.n_slots // 2, task.n_slots - 1))
    if not positions or any(not 0 <= p < task.n_slots for p in positions):
        raise PosbiasError(f"`positions` must be slots in 0..{task.n_slots - 1}, got {positions}",
                           f"e.g. `positions=0,{task.n_slots // 2},{task.n_slots - 1}`")
    return sorted(set(positions))


def random_tokens(tokenizer, length: int, seed: int, index: int) -> torch.Tensor:
    """(length,) token ids drawn uniformly from the non-special vocabulary; sample `index` of `seed` is the same
    however the samples are batched (resume)."""
    special = set(tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return allowed[torch.randint(len(allowed), (length,), generator=g)]


@torch.inference_mode()
def hidden_means(cfg: HiddenSearchConfig, loaded: Loaded, folder: RunFolder, progress: bool) -> np.ndarray:
    """(L + 1, length, H) float32: every layer's output (0: the embeddings) averaged over cfg.samples random
    sequences (the public code's get_avg_hidden_state.py, on random token ids); checkpointed after each batch."""
    model, files = loaded.model, folder.path is not None
    total, done = None, 0
    if files and folder.resuming and folder.file(STATS_STATE).exists():
        done = int(read_json(folder.file(STATS_STATE), "hidden-state sums")["samples"])
        total = np.load(folder.file(STATS))
    bar = progress_bar(cfg.samples, "hidden states", "seq", initial=done, enabled=progress)
    dev = next(model.parameters()).device
    try:
        while done < cfg.samples:
            idx = range(done, min(done + BATCH, cfg.samples))
            ids = torch.stack([random_tokens(loaded.tokenizer, cfg.length, cfg.stats_seed, i) for i in idx]).to(dev)
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            batch = torch.stack(out.hidden_states).float().sum(1).cpu().numpy()  # (L + 1, length, H)
            total = batch if total is None else total + batch
            done += len(idx)
            if files:
                _save_sums(folder, total, done)
            bar.update(len(idx))
    finally:
        bar.close()
    return total / cfg.samples


def _save_sums(folder: RunFolder, total: np.ndarray, done: int) -> None:
    tmp = folder.file(STATS + ".tmp.npy")
    np.save(tmp, total.astype(np.float32))
    os.replace(tmp, folder.file(STATS))
    write_json_atomic(folder.file(STATS_STATE), {"samples": done})


def _evaluate(scorer: Scorer, rows: list, method, positions: list[int]) -> dict:
    """Accuracy per calibration slot, their mean, and the mean answer NLL per token (teacher forcing; else None)."""
    answer_len = {r.key: len(r.answer_ids[0]) for r in rows}
    scored = scorer.score(rows, method)
    acc = {p: [] for p in positions}
    nll = []
    for s in scored:
        acc[int(s["position"])].append(bool(s["correct"]))
        if s.get("logprob") is not None:
            nll.append(-s["logprob"] / answer_len[(s["example_id"], s["position"])])
    per = [sum(v) / len(v) for v in acc.values()]
    return {"accuracy": dict(zip(map(str, positions), per)), "mean_accuracy": sum(per) / len(per),
            "loss": sum(nll) / len(nll) if nll and len(nll) == len(scored) else None}


def _rank(ev: dict, select: str) -> tuple:
    loss = ev["loss"] if ev["loss"] is not None else float("inf")
    return (-loss,) if select == "loss" else (ev["mean_accuracy"], -loss)


def calibrate(cfg: HiddenSearchConfig, scorer: Scorer, rows: list, positions: list[int], candidates: list[dict],
              layers: list[int], log: JsonlLog | None, progress: bool) -> list[dict]:
    """Score the unmodified model and every candidate x scale on the calibration rows (reusing logged ones)."""
    seen = {e["key"]: e for e in (log.read(("key", "accuracy")) if log else [])}
    settings = [("none", None, None)] + [(f"{c['channel']}:{s:g}", c["channel"], s) for c in candidates for s in cfg.scales]
    bar = progress_bar(len(settings), "calibration", "setting", initial=sum(k in seen for k, _, _ in settings),
                       enabled=progress)
    out = []
    try:
        for key, channel, scale in settings:
            if key not in seen:
                method = "none" if channel is None else HiddenScale(channel, scale, layers)
                seen[key] = {"key": key, "channel": channel, "scale": scale, **_evaluate(scorer, rows, method, positions)}
                if log is not None:
                    log.append([seen[key]])
                bar.update(1)
                bar.set_postfix(last=f"{seen[key]['mean_accuracy']:.3f}")
            out.append(seen[key])
    finally:
        bar.close()
    return out


def run_hidden_search(cfg: HiddenSearchConfig | None = None, out: str | Path | None = None, *,
                      loaded: Loaded | None = None, resume: bool = False, overwrite: bool = False,
                      progress: bool = True) -> HiddenSearchResult:
    """Find the positional hidden channel and its scale; write OUT/hidden.json last. out=None: no files."""
    cfg = (cfg or HiddenSearchConfig()).validate()
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    cfg = replace(cfg, skip=cfg.split_start(task.pool_size))
    positions = calibration_positions(cfg, task)
    examples = task.examples(cfg.n, cfg.seed, cfg.skip)  # enough examples? (a clear error before anything loads)
    folder = RunFolder(out, "hidden-search", RESULT, (STATS, STATS_STATE, CANDIDATES, EVALS))
    folder.check(resume, overwrite)
    if resume and folder.complete():
        return _result(folder.read_result())
    loaded = loaded or open_model(cfg.model, cfg.dtype, cfg.device, progress, cfg.device_map, needs="the hidden-channel search")
    n_layers, hidden = int(loaded.model.config.num_hidden_layers), int(loaded.model.config.hidden_size)
    if n_layers < 4:  # the candidates are read in layers 2 .. L - 2 (core/positional_channels.py)
        raise PosbiasError(f"the hidden-channel search reads layers 2 to L-2, and {loaded.info.get('name')} has {n_layers} "
                           "layers", "use a model with at least 4 layers")
    layers = list(cfg.layers) if cfg.layers else middle_layers(n_layers)
    scorer = Scorer(loaded, task, cfg.engine, cfg.max_new_tokens, cfg.chat, cfg.batch_tokens, cfg.max_batch,
                    cfg.prefix())
    if cfg.select == "loss" and scorer.engine.kind != "teacher-forced":
        raise PosbiasError("`select=loss` needs the answer's logprob", "use `engine=teacher-forced`, or `select=accuracy`")
    HiddenScale(0, cfg.scales[0], layers).check(loaded)  # layers fit the model (one line, before any work)
    model_info = {**loaded.info, "hidden_size": hidden, "n_layers": n_layers}
    fingerprint = {"config": cfg.to_dict(), "model": model_info, "scoring": scorer.settings(), "positions": positions,
                   "layers": layers}
    with folder.open(fingerprint, resume, overwrite):
        t0 = time.perf_counter()
        candidates = _candidates(cfg, loaded, folder, progress)
        if not candidates:
            raise PosbiasError(f"no hidden channel of {cfg.model} is monotone in more than {n_layers // 4} layers",
                               "average over more or longer samples (`samples`, `length`)")
        log = JsonlLog(folder.file(EVALS)) if folder.path is not None else None
        evals = calibrate(cfg, scorer, scorer.rows(examples, positions), positions, candidates, layers, log, progress)
        base, tried = evals[0], evals[1:]
        best = max(tried, key=lambda e: _rank(e, cfg.select))  # the first of equals: smoothest channel, preset order
        result = {
            "channel": best["channel"], "scale": best["scale"], "layers": layers, "select": cfg.select,
            "score": best, "baseline": base, "beats_unmodified": _rank(best, cfg.select) > _rank(base, cfg.select),
            "candidates": candidates, "evaluations": tried, "task": task.name,
            "fitted_on": {"task": task.name, "seed": cfg.seed, "skip": cfg.skip, "n": cfg.n, "positions": positions},
            "seconds_this_call": time.perf_counter() - t0, "config": cfg.to_dict(), "scoring": scorer.settings(),
            "model_info": model_info,
        }
        folder.finish(result, indent=1)  # last: its presence means "complete"
    return _result(result)


def _candidates(cfg: HiddenSearchConfig, loaded: Loaded, folder: RunFolder, progress: bool) -> list[dict]:
    if folder.path is not None and folder.resuming and folder.file(CANDIDATES).exists():
        return read_json(folder.file(CANDIDATES), "candidate list")["candidates"]
    mean = hidden_means(cfg, loaded, folder, progress)  # (L + 1, length, H)
    cands = find_candidates(mean[1:], cfg.top_k, cfg.mono_skip, cfg.smooth_skip)  # decoder layers only
    if folder.path is not None:
        write_json_atomic(folder.file(CANDIDATES), {"candidates": cands}, indent=1)
    return cands


def _result(rec: dict) -> HiddenSearchResult:
    return HiddenSearchResult(rec["channel"], rec["scale"], rec["layers"], rec["score"], rec["baseline"],
                              rec["candidates"], json.loads(json.dumps(rec)))
