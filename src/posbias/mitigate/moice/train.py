"""Train MoICE routers on a task (Lin et al. 2024): the model frozen, only the per-head routers learn.

Data: the task's own examples from a training split (config.py `split_start`: examples 3000.. of a generated task,
the three-quarter mark of a file task's pool), each with its gold item at a slot drawn uniformly (seeded). Loss:
cross-entropy of the gold answer's tokens under teacher forcing, with the Scorer's prompt format (`Scorer.prompt_rows`
tokenises through scoring/encode.py, chat template included), plus aux_coef x the load-balancing loss over all layers'
router logits (core/losses.py; padding masked). Optimiser: torch AdamW over the router parameters only, constant lr.

A plain loop rather than transformers.Trainer: only a few hundred thousand router parameters train, there is no
model to save, and exact resume needs nothing but the routers, the optimiser state and the step (the data order is
a function of the seed and the step; the frozen model has no dropout in eval mode).

Files in OUT (runs.RunFolder protocol):
  run.json             fingerprint (resume compares it)
  checkpoint.pt        after every step, written atomically: routers, optimiser state, step, the loss history
  train_log.jsonl      one row per step: step, loss, ce, aux, seconds (append-only)
  routers.safetensors  the trained routers (bases and top_k in its metadata)
  moice.json           the result, written last: config, bases, top_k, losses, fitted_on, routers file + sha256
Resume after a kill continues from checkpoint.pt and ends with routers bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...backends import open_model
from ...core.losses import load_balancing_loss
from ...methods.moice import RESULT, ROUTERS, sha256
from ...models.load import Loaded
from ...models.moice import Routers, check_routers, moice
from ...runs import JsonlLog, RunFolder, is_main_process
from ...runs import progress as progress_bar
from ...scoring.encode import left_pad
from ...scoring.scorer import Scorer
from ...tasks import get_task
from .config import MoICEConfig

CHECKPOINT = "checkpoint.pt"
LOG = "train_log.jsonl"


@dataclass
class MoICEResult:
    """MoICE router training: `record` is moice.json; `rows` (the same as `losses`) has one flat dict per optimizer
    step: step, loss, ce, aux, seconds; `format()` is what `posbias moice train` prints."""

    routers: Routers  # the trained routers (apply them with the method moice:OUT)
    losses: list[dict]  # one row per step: step, loss, ce, aux, seconds
    record: dict = field(repr=False)  # the content of moice.json

    @property
    def rows(self) -> list[dict]:
        return self.losses

    def format(self) -> str:
        """Steps, minutes, the loss and its cross-entropy part from first to last step, the bases and top-k."""
        rec, first, last = self.record, self.losses[0], self.losses[-1]
        return (f"{rec['steps']} steps of {rec['config']['batch']} examples, {rec['seconds'] / 60:.1f} min; "
                f"loss {rec['first_loss']:.4f} -> {rec['last_loss']:.4f} (ce {first['ce']:.4f} -> {last['ce']:.4f})\n"
                f"bases {', '.join(f'{b:g}' for b in rec['bases'])}; top-k {rec['top_k']}")


def gold_slots(n: int, n_slots: int, seed: int) -> list[int]:
    """The gold slot of each training example: uniform over the slots, seeded."""
    rng = random.Random(f"moice-slots/{seed}")
    return [rng.randrange(n_slots) for _ in range(n)]


def step_examples(step: int, batch: int, n: int, seed: int) -> list[int]:
    """Indices of the examples of optimizer step `step`: a seeded permutation of the n examples per epoch."""
    out = []
    for p in range(step * batch, (step + 1) * batch):
        epoch, i = divmod(p, n)
        order = list(range(n))
        random.Random(f"moice-order/{seed}/{epoch}").shuffle(order)
        out.append(order[i])
    return out


def answer_ce(model, rows, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced CE of each row's first answer (mean over its tokens) -> (CE per row (R,), attention mask (R, T))."""
    seqs = [r.prompt_ids + r.answer_ids[0] for r in rows]
    alen = [len(r.answer_ids[0]) for r in rows]
    a_max = max(alen)
    batch = left_pad(seqs, pad_id)
    dev = next(model.parameters()).device
    out = model(**{k: v.to(dev) for k, v in batch.items()}, use_cache=False, logits_to_keep=a_max + 1)
    logits = out.logits[:, -(a_max + 1) : -1].float()  # (R, a_max, V): column j predicts token j + 1
    ce = []
    for s, n in enumerate(alen):
        gold = torch.tensor(seqs[s][-n:], device=dev)
        ce.append(torch.nn.functional.cross_entropy(logits[s, a_max - n :], gold))
    return torch.stack(ce), batch["attention_mask"]


def train_step(model, state, rows, cfg: MoICEConfig, pad_id: int) -> dict:
    """One optimizer step over `rows` (micro-batches, gradients accumulated): loss = CE + aux_coef * balance."""
    ce_sum = aux_sum = 0.0
    for lo in range(0, len(rows), cfg.micro_batch):
        part = rows[lo : lo + cfg.micro_batch]
        state.logits.clear()
        ce, mask = answer_ce(model, part, pad_id)
        aux = load_balancing_loss(state.logits, state.top_k, mask)
        share = len(part) / len(rows)
        ((ce.mean() + cfg.aux_coef * aux) * share).backward()
        ce_sum, aux_sum = ce_sum + float(ce.detach().sum()), aux_sum + float(aux.detach()) * share
    state.logits.clear()
    ce_mean = ce_sum / len(rows)
    return {"loss": ce_mean + cfg.aux_coef * aux_sum, "ce": ce_mean, "aux": aux_sum}


def _save_checkpoint(path: Path, routers, opt, step: int, history: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"routers": routers.state_dict(), "optimizer": opt.state_dict(), "step": step, "history": history}, tmp)
    os.replace(tmp, path)


def _resume(folder: RunFolder, routers, opt, log: JsonlLog) -> tuple[int, list[dict]]:
    """Load checkpoint.pt (if any) -> (next step, loss history); rows the log lacks (a kill between the two
    writes) are appended from the checkpoint's history."""
    ckpt = folder.file(CHECKPOINT)
    if not (folder.resuming and ckpt.exists()):
        return 0, []
    state = torch.load(ckpt, weights_only=True)
    routers.load_state_dict(state["routers"])
    opt.load_state_dict(state["optimizer"])
    logged = {r["step"] for r in log.read(("step",))}
    log.append([r for r in state["history"] if r["step"] not in logged])
    return state["step"], list(state["history"])


def _prepare(cfg: MoICEConfig):
    """The task, the config with its split resolved, and the training examples (a clear error if too few)."""
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    cfg = replace(cfg, skip=cfg.split_start(task.pool_size), n=cfg.examples_needed)
    examples = task.examples(cfg.n, cfg.seed, cfg.skip)
    return task, cfg, examples


def train_moice(cfg: MoICEConfig | None = None, out: str | Path | None = None, *, loaded: Loaded | None = None,
                resume: bool = False, overwrite: bool = False, progress: bool = True) -> MoICEResult:
    """Train MoICE routers for `cfg.model` on `cfg.task`; write OUT/moice.json last. out=None: train without files."""
    cfg = (cfg or MoICEConfig()).validate()
    task, cfg, examples = _prepare(cfg)
    folder = RunFolder(out, "moice", RESULT, (ROUTERS, CHECKPOINT, LOG))
    folder.check(resume, overwrite)
    loaded = loaded or open_model(cfg.model, cfg.dtype, cfg.device, progress, cfg.device_map, needs="MoICE router training")
    model = loaded.model
    routers = Routers.for_model(model, cfg.bases, cfg.top_k, seed=cfg.router_seed)
    check_routers(model, routers)
    routers.to(next(model.parameters()).device)
    scorer = Scorer(loaded, task, chat=cfg.chat)
    slots = gold_slots(cfg.n, task.n_slots, cfg.seed)
    rows = scorer.prompt_rows([task.build(ex, s) for ex, s in zip(examples, slots)])
    opt = torch.optim.AdamW(routers.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    fingerprint = {"config": cfg.to_dict(), "model": loaded.info, "bases": list(routers.bases)}
    with folder.open(fingerprint, resume, overwrite):
        log = JsonlLog(folder.file(LOG)) if folder.path is not None else None
        start, history = _resume(folder, routers, opt, log) if log else (0, [])
        history = _loop(cfg, model, routers, opt, rows, scorer, folder, log, start, history, progress)
        record = _record(cfg, task, routers, history, loaded, folder)
        folder.finish(record, indent=1)  # last: its presence means "complete"
    return MoICEResult(routers, history, record)


def _loop(cfg, model, routers, opt, rows, scorer, folder, log, start, history, progress) -> list[dict]:
    pad = scorer.loaded.tokenizer.pad_token_id
    pad = pad if pad is not None else scorer.loaded.tokenizer.eos_token_id
    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)  # frozen: only the routers get gradients
    bar = progress_bar(cfg.steps, "moice train", "step", initial=start, enabled=progress)
    try:
        with torch.enable_grad(), moice(model, routers) as state:
            state.record = True
            for step in range(start, cfg.steps):
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                row = train_step(model, state, [rows[i] for i in step_examples(step, cfg.batch, cfg.n, cfg.seed)], cfg, pad)
                opt.step()
                history.append({"step": step, **row, "seconds": time.perf_counter() - t0})
                if folder.path is not None and is_main_process():
                    _save_checkpoint(folder.file(CHECKPOINT), routers, opt, step + 1, history)
                    log.append([history[-1]])
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.4f}")
    finally:
        bar.close()
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
    return history


def _record(cfg, task, routers, history, loaded, folder: RunFolder) -> dict:
    """moice.json: the routers are saved first, so the record can carry their sha256."""
    routers_info = None
    if folder.path is not None and is_main_process():
        routers.save(folder.file(ROUTERS))
        routers_info = {"file": ROUTERS, "sha256": sha256(folder.file(ROUTERS))}
    first, last = (history[0]["loss"], history[-1]["loss"]) if history else (None, None)
    return {
        "model": cfg.model, "task": task.name, "bases": list(routers.bases), "top_k": routers.top_k,
        "shape": list(routers.shape), "steps": len(history), "losses": history, "first_loss": first, "last_loss": last,
        "seconds": sum(r["seconds"] for r in history),
        "fitted_on": {"task": task.name, "seed": cfg.seed, "skip": cfg.skip, "n": cfg.n},
        "routers": routers_info, "config": cfg.to_dict(), "model_info": loaded.info,
    }
