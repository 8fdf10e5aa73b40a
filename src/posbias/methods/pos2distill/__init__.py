"""Pos2Distill-R1 (Wang et al. 2025, Sec. 4.2) and its SFT / SeqKD baselines, by training.

    from posbias.methods.pos2distill import DistillConfig, run_distill
    summary = run_distill(DistillConfig(model="smollm2-135m", task="kv-lookup", n=300), "runs/p2d")
    # then: posbias sweep --model runs/p2d/model ...

Pipeline (files in OUT):
  data.jsonl, data.json   training questions: the frozen model's greedy response at the anchor slot
                          and K trivial slots each (data.py); reused on --resume
  checkpoints/            Trainer checkpoints (weights, optimizer, scheduler, RNG): --resume continues
                          from the last one and ends with the same weights as an uninterrupted run
  model/                  the final plain Hugging Face model (LoRA merged) + tokenizer + posbias_distill.json;
                          written to model.tmp/ and renamed, so it exists complete or not at all
  train_log.json          Trainer's log history (loss, act, anc, kl_trivial / ce, lr, grad norm per step)
  distill.json            config + data/training summary, written last (distill.partial.json while running)

Methods: pos2distill with ablation kl (mean trivial KL), kl+align (position-aware alignment, alpha_ij),
full (kl + align + lambda * anchoring, the paper's L = L_Act + lambda L_Anc); seqkd (CE on the
teacher response at trivial slots); sft (CE on the gold answer at trivial slots). All use the same
questions and slots ("identical data compositions", Sec. 5.2.1); ce_anchor adds the anchor copy to
the CE baselines, which is the released code's data (K random slots + 1 "strengthen" copy at 0).

Defaults follow the paper (Appendix C): lr 3e-6, batch 32, 2 epochs, 300 questions, lambda 1,
greedy responses, K = 5 (Sec. 5.2.2: 4-6). Where the paper is silent the released code
(github.com/AMAP-ML/Pos2Distill) sets them: AdamW betas (0.9, 0.95), weight decay 0.01, cosine
schedule to 0.1 lr with 5% warm-up, gradient clipping 1.0, correct-only filtering of questions.
LoRA (lora=True) is a practical option (the paper fine-tunes fully); its default lr is 1e-4.

Where the released code differs from the paper (we follow the paper unless noted):
- anchor responses are sampled (vLLM, temperature 0.7, top-p 0.95), not greedy; for Mistral they are
  generated with the gold document LAST, while the teacher prompt of training puts it first (our
  --anchor N | auto:SWEEP uses one slot for both);
- the student prompts re-shuffle the distractor documents for every row while the teacher keeps the
  original order (our tasks move only the gold item, so the rows differ by its position alone);
- KL is taken on unshifted logits (the distribution after each response token, so the first response
  token is never distilled); ours predicts each response token from the one before it;
- alpha carries an extra P/|B_i| factor (our count_factor option), is computed over the micro-batches of
  all GPUs at once (all_gather), and the anchor copies enter as lambda * SUM of their KLs (ours: the
  paper's lambda * mean);
- the NQ script trains 1 epoch on 400 questions with K = 4 (the paper: 2 epochs, 300 questions).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...errors import PosbiasError
from ...io import write_json_atomic
from ...models.load import Loaded, load_model
from ...tasks import get_task
from .data import build_records, default_skip, read_records, resolve_anchor, write_records
from .trainer import ABLATIONS, METHODS, LossSpec, final_model, make_student, make_trainer, step_plan, training_args

LORA_LR, FULL_LR = 1e-4, 3e-6
# options that do not change the result: a resumed run may change them
_OPERATIONAL = ("device", "save_steps", "save_total_limit", "gen_batch_tokens", "gen_max_batch")


@dataclass
class DistillConfig:
    model: str = "smollm2-135m"
    task: str = "kv-lookup"
    task_options: dict = field(default_factory=dict)  # facts, digits, docs, pairs
    data_dir: str | None = None
    method: str = "pos2distill"  # pos2distill | seqkd | sft
    ablation: str = "full"  # pos2distill: kl | kl+align | full
    n: int = 300  # training questions (Appendix C)
    k: int = 5  # trivial slots per question (Sec. 5.2.2: 4-6)
    anchor: str = "0"  # advantageous slot: a number, or auto:PATH (best slot of a sweep.json)
    correct_only: bool = True  # keep questions whose anchor response is correct (released code)
    max_draw: int | None = None  # examples looked at for n kept (default 10 n)
    skip: int | None = None  # the training split starts here (default: data.default_skip)
    seed: int = 0
    chat: str = "auto"
    max_new_tokens: int | None = None  # anchor response length (default: the task's)
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"
    lr: float | None = None  # default 3e-6 (full) or 1e-4 (LoRA)
    batch_size: int = 32  # training sequences per optimizer step
    micro_batch: int = 0  # questions per forward; 0 = a whole step (gradient accumulation otherwise)
    epochs: float = 2.0
    max_steps: int = 0  # > 0 overrides epochs
    lam: float = 1.0
    count_factor: bool = False  # the released code's P/|B_i| factor on alpha
    ce_anchor: bool = False  # seqkd/sft: also the anchor copy
    eos: bool = True  # append the end-of-turn token to every target
    scheduler: str = "cosine_with_min_lr"
    min_lr_ratio: float = 0.1
    warmup: float = 0.05  # ratio of the steps (< 1) or a number of steps
    weight_decay: float = 0.01
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = False
    padding_side: str = "left"
    dtype: str = "bf16"
    device: str = "cpu"
    save_steps: int = 10
    save_total_limit: int = 2
    gen_batch_tokens: int = 16384
    gen_max_batch: int = 32

    def spec(self) -> LossSpec:
        return LossSpec(self.method, self.ablation, self.lam, self.count_factor, self.ce_anchor)

    def check(self) -> None:
        if self.method not in METHODS:
            raise PosbiasError(f"unknown --method {self.method!r}", f"use one of {', '.join(METHODS)}")
        if self.ablation not in ABLATIONS:
            raise PosbiasError(f"unknown --ablation {self.ablation!r}", f"use one of {', '.join(ABLATIONS)}")
        for name, lo in (("n", 1), ("k", 1), ("batch_size", 1), ("save_steps", 1)):
            if getattr(self, name) < lo:
                opt = "--" + name.replace("_", "-")
                raise PosbiasError(f"{opt} must be at least {lo}", f"pass {opt} {lo} or more")
        if self.epochs <= 0 and self.max_steps <= 0:
            raise PosbiasError("--epochs must be positive", "pass e.g. --epochs 2")
        if self.lr is not None and self.lr <= 0:
            raise PosbiasError(f"--lr must be positive, got {self.lr}", "pass e.g. --lr 3e-6")
        if self.lam < 0:
            raise PosbiasError(f"--lam must be >= 0, got {self.lam}", "pass e.g. --lam 1")


def run_distill(cfg: DistillConfig, out: str | Path, resume: bool = False, overwrite: bool = False,
                progress: bool = True, loaded: Loaded | None = None, callbacks: list | None = None) -> dict:
    """Build the data, train, save OUT/model; returns the content of distill.json.

    loaded: an already loaded base model (API/tests); it is not modified (the student is a copy).
    callbacks: extra transformers TrainerCallbacks.
    """
    cfg.check()
    out = Path(out)
    task = get_task(cfg.task, data_dir=cfg.data_dir, **cfg.task_options)
    anchor, anchor_info = resolve_anchor(cfg.anchor, task, cfg.task)
    _prepare_out(out, resume, overwrite)
    if resume and (out / "distill.json").exists():
        return json.loads((out / "distill.json").read_text())  # already complete
    caller_owned = loaded is not None
    loaded = loaded or load_model(cfg.model, cfg.dtype, cfg.device)
    from ...eval.runner import use_chat

    resolved = _resolve(cfg, task, anchor, use_chat(loaded, cfg.chat))
    fingerprint = {"config": {k: v for k, v in resolved.items() if k not in _OPERATIONAL}, "task": task.config(),
                   "model": loaded.info.get("name")}
    _start(out, fingerprint, resume)
    records, data_summary = _data(loaded, task, resolved, out, progress)
    t0 = time.perf_counter()
    trainer, plan, last = _train(loaded, cfg, resolved, records, out, progress, caller_owned, callbacks, resume)
    seconds = time.perf_counter() - t0
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    record = {**fingerprint, "config": resolved, "anchor": anchor_info, "data": data_summary,
              "train_split": data_summary["train_split"], "base_model": loaded.info,
              "train": {**plan, "steps": trainer.state.global_step, "epochs": trainer.state.epoch,
                        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                        "seconds_this_run": seconds, "resumed_from": last},
              "model_dir": str(out / "model")}
    if _is_main():
        _save_model(trainer, cfg.lora, loaded.tokenizer, out, record)
        write_json_atomic(out / "train_log.json", history, indent=1)
        write_json_atomic(out / "distill.json", record, indent=2)  # last: its presence means "complete"
        (out / "distill.partial.json").unlink(missing_ok=True)
    return record


def _resolve(cfg: DistillConfig, task, anchor: int, chat: bool) -> dict:
    skip = default_skip(task) if cfg.skip is None else cfg.skip
    if skip < 0:
        raise PosbiasError(f"--skip must be >= 0, got {skip}", "pass --skip 2000 (sweeps use examples 0..)")
    return {**asdict(cfg), "skip": skip, "anchor": anchor, "chat_used": chat,
            "lr": cfg.lr if cfg.lr is not None else (LORA_LR if cfg.lora else FULL_LR),
            "max_new_tokens": cfg.max_new_tokens or task.max_new_tokens, "max_draw": cfg.max_draw or 10 * cfg.n}


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


_OURS = ("data.jsonl", "data.json", "checkpoints", "model", "model.tmp", "train_log.json", "distill.json",
         "distill.partial.json")


def _prepare_out(out: Path, resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise PosbiasError("--resume and --overwrite contradict each other", "pass one of them")
    if out.exists() and not out.is_dir():
        raise PosbiasError(f"--out {out} is a file", "pass a directory path")
    if not _is_main():  # under accelerate launch the main process checks and cleans OUT
        return
    started = any((out / f).exists() for f in ("distill.partial.json", "distill.json", "data.jsonl"))
    if started and not (resume or overwrite):
        raise PosbiasError(f"{out} already holds a distillation run", "pass --resume to continue it or --overwrite")
    if resume and not started:
        raise PosbiasError(f"nothing to resume in {out}", "drop --resume to start a new run")
    if overwrite:
        for name in _OURS:
            p = out / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def _start(out: Path, fingerprint: dict, resume: bool) -> None:
    if resume:
        old_path = out / "distill.partial.json"
        old = json.loads(old_path.read_text()) if old_path.exists() else {}
        if old != json.loads(json.dumps(fingerprint)):
            raise PosbiasError(f"{out} holds a run with a different configuration",
                               "rerun it with the same options, or use --overwrite")
    if _is_main():
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "distill.partial.json", fingerprint, indent=2)


def _data(loaded: Loaded, task, r: dict, out: Path, progress: bool) -> tuple[list[dict], dict]:
    """Reuse OUT's data made with the same settings, else generate it (main process first)."""
    keys = ("model", "task", "task_options", "data_dir", "n", "k", "anchor", "correct_only", "max_draw", "skip",
            "seed", "chat_used", "max_new_tokens", "dtype")
    fp = {k: r[k] for k in keys}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        with PartialState().main_process_first():
            return _data_once(loaded, task, r, out, fp, progress)
    return _data_once(loaded, task, r, out, fp, progress)


def _data_once(loaded, task, r: dict, out: Path, fp: dict, progress: bool):
    saved = read_records(out, fp)
    if saved is not None:
        return saved
    records, summary = build_records(loaded, task, n=r["n"], k=r["k"], anchor=r["anchor"], seed=r["seed"],
                                     skip=r["skip"], chat=r["chat_used"], correct_only=r["correct_only"],
                                     max_draw=r["max_draw"], max_new_tokens=r["max_new_tokens"],
                                     batch_tokens=r["gen_batch_tokens"], max_batch=r["gen_max_batch"], progress=progress)
    write_records(out, records, summary, fp)
    return records, summary


def build_trainer(loaded: Loaded, cfg: DistillConfig, records: list[dict], out: str | Path, *, chat: bool, lr: float,
                  progress: bool = False, copy_base: bool = True, callbacks: list | None = None):
    """(trainer, plan): the Trainer over `records` (data.py) with student/teacher set up; not trained yet."""
    from ...eval.generate import eos_ids
    from .collator import Collator, QuestionData

    spec = cfg.spec()
    ends = eos_ids(loaded.model, loaded.tokenizer)
    end = ends[0] if cfg.eos and ends else None
    data = QuestionData(records, loaded.tokenizer, chat, spec.target, spec.with_anchor, end, loaded.context_window)
    plan = step_plan(cfg.batch_size, len(data[0]["students"]), cfg.micro_batch, int(os.environ.get("WORLD_SIZE", "1")))
    lora = {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "dropout": cfg.lora_dropout, "targets": cfg.lora_targets}
    student, teacher = make_student(loaded.model, lora if cfg.lora else None, copy_base=copy_base)
    args = training_args(cfg, Path(out), plan, lr, progress)
    collator = Collator(loaded.tokenizer.pad_token_id, cfg.padding_side)
    return make_trainer(student, teacher, spec, args, data, collator, callbacks), plan


def _train(loaded, cfg, r: dict, records, out: Path, progress, caller_owned, callbacks, resume):
    from transformers.trainer_utils import get_last_checkpoint

    trainer, plan = build_trainer(loaded, cfg, records, out, chat=r["chat_used"], lr=r["lr"], progress=progress,
                                  copy_base=caller_owned, callbacks=callbacks)
    ckpt_dir = out / "checkpoints"
    last = get_last_checkpoint(str(ckpt_dir)) if resume and ckpt_dir.is_dir() else None
    trainer.train(resume_from_checkpoint=last)
    return trainer, plan, last


def _save_model(trainer, lora: bool, tokenizer, out: Path, record: dict) -> None:
    """OUT/model: a plain HF model dir (load_model(DIR) reads it), renamed into place when complete."""
    tmp, final = out / "model.tmp", out / "model"
    shutil.rmtree(tmp, ignore_errors=True)
    model = final_model(trainer.accelerator.unwrap_model(trainer.model), lora)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_json_atomic(tmp / "posbias_distill.json", record, indent=2)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


__all__ = ["DistillConfig", "run_distill", "build_trainer", "LossSpec", "METHODS", "ABLATIONS"]
