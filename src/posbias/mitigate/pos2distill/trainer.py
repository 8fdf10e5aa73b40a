"""The training loop: a transformers.Trainer whose compute_loss runs teacher and student.

Per batch of questions (collator.py):
  teacher  = the ORIGINAL model on the anchor prompt + response, under torch.no_grad, eval mode.
             Full fine-tuning: a frozen copy of the initial weights (the loaded model itself; the
             student is a float32 copy). LoRA: the same weights under `disable_adapter()` (no copy).
  student  = the trained model on each trivial prompt + the same response, and on the anchor
             prompt + response (anchoring, "full" only).
  loss     = core.losses: L_Act (+ lambda L_Anc) for pos2distill, CE for seqkd / sft.

Only response positions are projected onto the vocabulary (`logits_to_keep` with the collator's
index), so memory grows with the response, not the context.

Batching: `batch_size` counts training sequences per optimizer step, as the released code's
train_batch_size (32 rows of (question, position)); here whole questions stay together (their K+1
rows share one teacher forward and one alignment group), so a step takes
round(batch_size / rows_per_question) questions, split into micro-batches of `micro_batch`
questions with gradient accumulation. alpha_ij is computed over the rows of one forward (the
micro-batch, per process): with micro_batch = 0 (default) that is the whole step, i.e. the paper's
batch B. Teacher logits are not cached: one no-grad teacher forward per question against K+1
student forward+backward passes costs about 1/(3(K+1)) of a step (~6% at K = 5).

Mixed precision: trainable weights are float32 (bf16 master weights would round away updates of
lr 3e-6); a model loaded in bf16 (dtype bf16, or auto on hardware with native bf16) turns on Trainer's bf16 autocast (CPU and CUDA) and keeps the frozen teacher
(or the frozen LoRA base) in bf16. Multi-GPU: `accelerate launch -m posbias.cli distill r1 ...`
(DDP) works through Trainer; the full-fine-tuning teacher is replicated per process.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ...core.losses import ce_loss, pos2distill_loss, token_kl
from ...errors import PosbiasError

METHODS = ("pos2distill", "seqkd", "sft")
ABLATIONS = ("kl", "kl+align", "full")


@dataclass(frozen=True)
class LossSpec:
    """What compute_loss optimises: method, ablation (pos2distill only), lambda, options."""

    method: str = "pos2distill"
    ablation: str = "full"
    lam: float = 1.0
    count_factor: bool = False
    ce_anchor: bool = False

    def __post_init__(self):
        if self.method not in METHODS:
            raise PosbiasError(f"unknown method {self.method!r}", f"use one of {', '.join(METHODS)}")
        if self.ablation not in ABLATIONS:
            raise PosbiasError(f"unknown ablation {self.ablation!r}", f"use one of {', '.join(ABLATIONS)}")

    @property
    def target(self) -> str:
        return "gold" if self.method == "sft" else "response"

    @property
    def align(self) -> bool:
        return self.ablation != "kl"

    @property
    def lam_used(self) -> float:
        return self.lam if self.ablation == "full" else 0.0

    @property
    def with_anchor(self) -> bool:
        """Whether the anchor prompt is also a student row."""
        if self.method == "pos2distill":
            return self.lam_used != 0.0
        return self.ce_anchor


def logits_of(model, inputs: dict, prefix: str) -> torch.Tensor:
    """Logits [rows, R, V] at the target positions of the `prefix` rows (t_ teacher, s_ student)."""
    out = model(input_ids=inputs[prefix + "input_ids"], attention_mask=inputs[prefix + "attention_mask"],
                position_ids=inputs[prefix + "position_ids"], logits_to_keep=inputs[prefix + "index"], use_cache=False)
    return out.logits


@contextmanager
def eval_mode(model):
    """Eval mode inside (no dropout for the teacher), the previous mode restored after."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


class DistillLoss:
    """The Pos2Distill / SeqKD / SFT loss as a mixin for transformers.Trainer (see `_trainer_class`);
    `teacher` is None for LoRA."""

    loss_is_scaled_for_ga = False  # compute_loss returns a per-micro-batch mean: Trainer divides by GA

    def __init__(self, *args, spec: LossSpec, teacher=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.spec, self.teacher = spec, teacher
        self._sums: dict[str, float] = {}
        self._count = 0

    def teacher_logits(self, model, inputs: dict) -> torch.Tensor:
        with torch.no_grad():
            if self.teacher is not None:
                dev = inputs["t_input_ids"].device
                if next(self.teacher.parameters()).device != dev:
                    self.teacher.to(dev)
                return logits_of(self.teacher, inputs, "t_")
            base = self.accelerator.unwrap_model(model)
            with eval_mode(base), base.disable_adapter():
                return logits_of(base, inputs, "t_")

    def row_kl(self, model, inputs: dict, s_logits: torch.Tensor) -> torch.Tensor:
        """Per student row KL(teacher on the anchor prompt || student on its prompt), [S]."""
        t_logits = self.teacher_logits(model, inputs)[inputs["s_teacher"]]  # [S, R, V]
        return token_kl(t_logits, s_logits, inputs["s_mask"])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        s_logits = logits_of(model, inputs, "s_")  # [S, R, V]
        if self.spec.method in ("seqkd", "sft"):
            loss = ce_loss(s_logits, inputs["s_targets"], inputs["s_mask"])
            parts = {"ce": float(loss.detach())}
        else:
            kl = self.row_kl(model, inputs, s_logits)
            anc = inputs["s_anchor"]
            loss, parts = pos2distill_loss(kl[~anc], inputs["s_position"][~anc], kl[anc], self.spec.lam_used,
                                           self.spec.align, self.spec.count_factor)
        if model.training:
            self._note(parts)
        return (loss, {"logits": s_logits}) if return_outputs else loss

    @torch.no_grad()
    def measure(self, inputs: dict) -> dict[str, torch.Tensor]:
        """Per-row KL and CE of the current student on a collated batch (no update)."""
        model = self.model
        inputs = self._prepare_inputs(inputs)
        with eval_mode(model), self.accelerator.autocast():  # the training precision
            s_logits = logits_of(model, inputs, "s_")
            kl = self.row_kl(model, inputs, s_logits)
        return {"kl": kl.cpu(), "anchor": inputs["s_anchor"].cpu()}

    def _note(self, parts: dict[str, float]) -> None:
        for k, v in parts.items():
            self._sums[k] = self._sums.get(k, 0.0) + v
        self._count += 1

    def log(self, logs: dict, start_time=None) -> None:
        if "loss" in logs and self._count:
            logs.update({k: round(v / self._count, 6) for k, v in self._sums.items()})
            self._sums, self._count = {}, 0
        if "train_loss" in logs:  # Trainer's mean covers this call's steps only: after a resume, not those before it
            logs["train_loss"] = run_mean_loss(self.state.log_history, logs["train_loss"])
        super().log(logs, start_time)

    def _issue_warnings_after_load(self, load_result) -> None:
        """Resuming, Trainer warns of every key the checkpoint lacks; a tied weight (lm_head.weight, the embeddings'
        tensor) is saved once, under the other name, and loads through it: only the keys truly missing are warned of."""
        tied = loaded_through_a_tie(self.model, load_result.missing_keys)
        super()._issue_warnings_after_load(load_result._replace(
            missing_keys=[k for k in load_result.missing_keys if k not in tied]))


def run_mean_loss(history: list[dict], fallback: float) -> float:
    """The mean training loss over every step of the run: each logged loss (a mean over the steps since the log
    before it) weighted by those steps. The history is the checkpoint's (TrainerState.log_history, restored on
    resume) plus this call's, so a resumed run counts the steps before the kill too, and matches an uninterrupted run
    (logging_steps=1: the same sum in the same order). `fallback` (Trainer's own mean) where nothing was logged."""
    total, last = 0.0, 0
    for h in history:
        if "loss" in h and "step" in h:
            total, last = total + h["loss"] * (h["step"] - last), h["step"]
    return total / last if last else fallback


def loaded_through_a_tie(model, missing: list[str]) -> set[str]:
    """The missing keys whose tensor is shared with a parameter that was loaded (tied weights)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    gone = set(missing)
    return {n for group in names.values() if any(m not in gone for m in group) for n in group if n in gone}



@lru_cache(maxsize=1)
def _trainer_class():
    """DistillLoss on top of transformers.Trainer (imported only when a distillation runs)."""
    from transformers import Trainer

    return type("DistillTrainer", (DistillLoss, Trainer), {})


def make_student(model, lora: dict | None, copy_base: bool, seed: int = 0):
    """(student, teacher). Full: student = float32 copy, teacher = `model` frozen in eval mode.

    LoRA (`lora` = dict(r, alpha, dropout, targets)): student = peft model over `model` (or over a
    copy when copy_base, so a caller's model stays untouched), adapters in float32; teacher None. peft draws
    the A matrices from torch's global generator, so they are drawn under `seed` in a forked generator: the
    same seed gives the same adapters whatever ran before in the process, and the caller's stream is untouched.
    """
    if lora is None:
        student = copy.deepcopy(model).to(torch.float32)
        student.train()
        return student, model.eval()
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(model) if copy_base else model
    cfg = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                     target_modules=lora["targets"], task_type="CAUSAL_LM")
    cuda = sorted({p.device.index or 0 for p in base.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):  # CPU and the model's GPUs: manual_seed seeds both
        torch.manual_seed(seed)
        student = get_peft_model(base, cfg, autocast_adapter_dtype=True)
    student.train()
    return student, None


def step_plan(batch_size: int, rows_per_question: int, micro_batch: int, world: int = 1) -> dict:
    """Questions per optimizer step, per forward, and gradient accumulation (see the module docstring)."""
    per_step = max(1, round(batch_size / rows_per_question))
    micro = per_step if micro_batch <= 0 else min(micro_batch, per_step)
    accum = max(1, math.ceil(per_step / (micro * world)))
    return {"questions_per_step": micro * accum * world, "micro_batch": micro, "grad_accum": accum,
            "rows_per_question": rows_per_question, "sequences_per_step": micro * accum * world * rows_per_question}


def training_args(cfg, out: Path, plan: dict, lr: float, progress: bool, bf16: bool):
    from transformers import TrainingArguments

    sched_kw = {"min_lr_rate": cfg.min_lr_ratio} if cfg.scheduler == "cosine_with_min_lr" else None
    return TrainingArguments(
        output_dir=str(out / "checkpoints"), per_device_train_batch_size=plan["micro_batch"],
        gradient_accumulation_steps=plan["grad_accum"], learning_rate=lr, num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps if cfg.max_steps and cfg.max_steps > 0 else -1,
        lr_scheduler_type=cfg.scheduler, lr_scheduler_kwargs=sched_kw, warmup_steps=cfg.warmup,
        weight_decay=cfg.weight_decay, adam_beta2=cfg.adam_beta2, max_grad_norm=cfg.max_grad_norm,
        logging_steps=1, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
        report_to="none", disable_tqdm=not progress, bf16=bf16, use_cpu=cfg.device == "cpu",
        seed=cfg.seed, data_seed=cfg.seed, remove_unused_columns=False, dataloader_num_workers=0,
        activation_checkpointing=cfg.gradient_checkpointing,
    )


def make_trainer(student, teacher, spec: LossSpec, args, dataset, collator, callbacks=None):
    from transformers import PrinterCallback

    cls = _trainer_class()
    trainer = cls(model=student, args=args, train_dataset=dataset, data_collator=collator, spec=spec, teacher=teacher,
                  callbacks=callbacks)
    if args.disable_tqdm:  # quiet: Trainer would print every log line instead of a bar
        trainer.remove_callback(PrinterCallback)
    return trainer


def final_model(student, lora: bool):
    """A plain transformers model: LoRA merged into float32 base weights, or the student itself."""
    if not lora:
        return student
    return student.to(torch.float32).merge_and_unload()
