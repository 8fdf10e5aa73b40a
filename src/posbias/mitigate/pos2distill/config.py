"""Pos2Distill configuration and its presets (library objects: the CLI and the API share them).

Two stages: r1 (retrieval, Sec. 4.2: one gold item, KL from the anchor slot) and r2 (reasoning, Sec.
4.3: two hops, CE on the anchor placement's chain of thought). Their methods:

  r1  pos2distill (KL + alignment + anchoring) | seqkd (CE on the anchor response) | sft (CE on the gold)
  r2  pos2distill (CE on the anchor response at K placements) | sft (CE on the gold answer) |
      selftrain (CE on the model's own correct response at each of those placements)

Every method of a stage trains on the same questions and placements (Sec. 5.2.1's "identical data
compositions"): in r1 the CE baselines also get the anchor-slot copy Pos2Distill anchors on, as the
released code feeds every method (`anchor_copy=False` restores the earlier baselines without it).

Presets, per stage:
  cpu    (the default) SmolLM2 on 2 cores, sized by measurement (docs/pos2distill.md): a 30-row step of
         kv-lookup costs ~25 s at one thread, so 64 questions x 2 epochs = 26 steps take ~12 min. Its lr
         1e-4 (full fine-tuning) is chosen, not swept: the paper's 3e-6 suits 7-8B models and 4.6x more
         steps; at 1e-4 the trivial-slot KL fell 0.19 -> 0.013 in 26 steps without the anchor drifting.
  paper  Appendix C: r1 300 questions, K = 5 (Sec. 5.2.2: 4-6); r2 500 questions, K = 4; lr 3e-6
         (batch 32 and 2 epochs are the defaults of both).

LoRA takes lr 1e-4 in both unless `lr` is given. `DistillConfig.from_preset("paper", stage="r2", n=100)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import PosbiasError
from ...eval.config import ModelChoice, TaskChoice, config_dict
from ...scoring.encode import BATCH_TOKENS, MAX_BATCH
from ...tasks import Placement, Task, as_json
from .data import default_skip
from .trainer import ABLATIONS, LossSpec

LORA_LR = 1e-4
STAGES = ("r1", "r2")
METHODS = {"r1": ("pos2distill", "seqkd", "sft"), "r2": ("pos2distill", "sft", "selftrain")}
PRESETS: dict[str, dict[str, dict]] = {
    "r1": {"paper": {"n": 300, "k": 5, "lr": 3e-6}, "cpu": {"n": 64, "k": 5, "lr": 1e-4}},
    "r2": {"paper": {"n": 500, "k": 4, "lr": 3e-6}, "cpu": {"n": 64, "k": 4, "lr": 1e-4}},
}
# options that do not change the result: a resumed run may change them
OPERATIONAL = ("device", "save_steps", "save_total_limit", "gen_batch_tokens", "gen_max_batch")


@dataclass
class DistillConfig(TaskChoice, ModelChoice):
    """Pos2Distill fine-tuning (r1: retrieval, r2: two-hop reasoning) and its SFT / SeqKD / self-training
    baselines. `DistillConfig()` is the r1 cpu preset; `DistillConfig.from_preset("paper", stage="r2")` another.

    stage: r1 (retrieval: one gold item) | r2 (reasoning: two hops).
    method: r1: pos2distill | sft (gold answers) | seqkd (teacher responses, CE); r2: pos2distill (the anchor's
        chain of thought, CE) | sft (gold answers) | selftrain (own correct response at each placement).
    ablation: r1 pos2distill: kl | kl+align | full (kl + align + anchoring).
    preset: cpu (64 questions, lr 1e-4; docs/pos2distill.md) | paper (r1 300 / r2 500 questions, lr 3e-6):
        `from_preset` takes n and k from it, and a full fine-tuning its learning rate when lr is None.
    n: training questions (Appendix C: 300 for r1, 500 for r2).
    k: trivial placements per question (r1 5, Sec. 5.2.2: 4-6; r2 4).
    anchor: the advantageous placement: a slot (r1) or i:j (r2), or auto:PATH (the best placement of a
        sweep.json); None: the task's advantageous placement (slot 0; two hops: the last two slots).
    correct_only: keep only questions answered correctly at the anchor (released code).
    max_draw: examples looked at for n kept (default 10 n).
    skip: the training split starts here; None: 2000, or the middle of a file task's pool (sweeps use 0..).
    seed: example selection seed; also the LoRA adapters' initialisation and Trainer's seed.
    max_new_tokens: anchor response length; None: the task's.
    lora: train LoRA adapters (merged into the saved model) instead of every weight (full fine-tuning: the
        paper's).
    lora_r: LoRA rank.
    lora_alpha: LoRA alpha.
    lora_dropout: LoRA dropout.
    lora_targets: the modules LoRA adapts (peft's target_modules).
    lr: the learning rate; None: the preset's for full fine-tuning, 1e-4 for LoRA.
    batch_size: training sequences per optimizer step (paper 32; whole questions kept).
    micro_batch: questions per forward; 0: a whole step (smaller saves memory: gradients accumulate).
    epochs: passes over the training records (paper 2).
    max_steps: stop after this many optimizer steps; 0: train for epochs.
    lam: lambda, the weight of the anchoring loss (Pos2Distill eq. 9; paper 1).
    count_factor: the released code's P/|B_i| factor on alpha.
    anchor_copy: r1 seqkd/sft: also train on the anchor-slot copy (identical data with Pos2Distill).
    eos: append the end-of-turn token to every target.
    scheduler: the learning-rate schedule (transformers' lr_scheduler_type).
    min_lr_ratio: cosine_with_min_lr: the final learning rate as a share of lr.
    warmup: ratio of the steps (< 1) or a number of steps.
    weight_decay: AdamW weight decay.
    adam_beta2: AdamW beta2.
    max_grad_norm: gradient clipping norm.
    gradient_checkpointing: recompute activations in the backward pass (less memory, ~30% slower).
    padding_side: where training batches are padded: left | right.
    save_steps: checkpoint every this many steps (resume reads them).
    save_total_limit: checkpoints kept.
    gen_batch_tokens: padded tokens per batch when generating the anchor responses.
    gen_max_batch: rows per batch at most when generating the anchor responses.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    stage: str = "r1"
    method: str = "pos2distill"
    ablation: str = "full"
    preset: str = "cpu"
    n: int = PRESETS["r1"]["cpu"]["n"]
    k: int = 5
    anchor: str | None = None
    correct_only: bool = True
    max_draw: int | None = None
    skip: int | None = None
    seed: int = 0
    max_new_tokens: int | None = None
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"
    lr: float | None = None
    batch_size: int = 32
    micro_batch: int = 0
    epochs: float = 2.0
    max_steps: int = 0
    lam: float = 1.0
    count_factor: bool = False
    anchor_copy: bool = True
    eos: bool = True
    scheduler: str = "cosine_with_min_lr"
    min_lr_ratio: float = 0.1
    warmup: float = 0.05
    weight_decay: float = 0.01
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = False
    padding_side: str = "left"
    save_steps: int = 10
    save_total_limit: int = 2
    gen_batch_tokens: int = BATCH_TOKENS
    gen_max_batch: int = MAX_BATCH

    @classmethod
    def from_preset(cls, preset: str = "cpu", stage: str = "r1", **overrides) -> "DistillConfig":
        """The preset's values for `stage` with `overrides` (None = keep)."""
        if stage not in STAGES:
            raise PosbiasError(f"unknown `stage` {stage!r}", f"use {' or '.join(STAGES)}")
        if preset not in PRESETS[stage]:
            raise PosbiasError(f"unknown preset {preset!r}", f"use `preset` {' or '.join(PRESETS[stage])}")
        over = {k: v for k, v in overrides.items() if v is not None}
        p = PRESETS[stage][preset]
        return cls(**{"stage": stage, "preset": preset, "n": p["n"], "k": p["k"], **over})

    def spec(self) -> LossSpec:
        """The loss: r2 trains with cross-entropy on its targets (the anchor's response, the gold answer, or the
        model's own correct response), on the K placements only (self-training: each record's own one)."""
        if self.stage == "r2":
            return LossSpec("sft" if self.method == "sft" else "seqkd", "full", 0.0, False, self.method == "selftrain")
        return LossSpec(self.method, self.ablation, self.lam, self.count_factor, self.anchor_copy)

    def validate(self) -> "DistillConfig":
        self._validate_task()
        self._validate_model()
        if self.stage not in STAGES:
            raise PosbiasError(f"unknown `stage` {self.stage!r}", f"use {' or '.join(STAGES)}")
        if self.preset not in PRESETS[self.stage]:
            raise PosbiasError(f"unknown preset {self.preset!r}", f"use `preset` {' or '.join(PRESETS[self.stage])}")
        if self.method not in METHODS[self.stage]:
            raise PosbiasError(f"unknown `method` {self.method!r} for {self.stage}",
                               f"use one of {', '.join(METHODS[self.stage])}")
        if self.ablation not in ABLATIONS:
            raise PosbiasError(f"unknown `ablation` {self.ablation!r}", f"use one of {', '.join(ABLATIONS)}")
        for name in ("n", "k", "batch_size", "save_steps"):
            if getattr(self, name) < 1:
                raise PosbiasError(f"`{name}` must be at least 1", f"pass `{name}=1` or more")
        if self.epochs <= 0 and self.max_steps <= 0:
            raise PosbiasError("`epochs` must be positive", "pass e.g. `epochs=2`")
        if self.lr is not None and not self.lr > 0:
            raise PosbiasError(f"`lr` must be positive, got {self.lr}", "pass e.g. `lr=3e-6`")
        if self.lam < 0:
            raise PosbiasError(f"`lam` must be >= 0, got {self.lam}", "pass e.g. `lam=1`")
        if self.skip is not None and self.skip < 0:
            raise PosbiasError(f"`skip` must be >= 0, got {self.skip}", "pass `skip=2000` (sweeps use examples 0..)")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise PosbiasError(f"`max_new_tokens` must be at least 1, got {self.max_new_tokens}", "pass e.g. `max_new_tokens=12`")
        return self

    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return LORA_LR if self.lora else PRESETS[self.stage][self.preset]["lr"]

    def resolved(self, task: Task, anchor: Placement, chat: bool) -> dict:
        """Every setting with the defaults filled in (distill.json's "config")."""
        return {**config_dict(self), "skip": default_skip(task) if self.skip is None else self.skip, "anchor": as_json(anchor),
                "chat_used": chat, "lr": self.learning_rate(), "max_new_tokens": self.max_new_tokens or task.max_new_tokens,
                "max_draw": self.max_draw or 10 * self.n}
