"""Pos2Distill configuration and its presets (library objects: the CLI and the API share them).

  cpu    (the default) SmolLM2 on 2 cores, sized by measurement (docs/pos2distill.md): a 30-row step of
         kv-lookup costs ~25 s at one thread, so 64 questions x 2 epochs = 26 steps take ~12 min. Its lr
         1e-4 (full fine-tuning) is chosen, not swept: the paper's 3e-6 suits 7-8B models and 4.6x more
         steps; at 1e-4 the trivial-slot KL fell 0.19 -> 0.013 in 26 steps without the anchor drifting.
  paper  Appendix C: 300 questions, lr 3e-6 (batch 32 and 2 epochs are the defaults of both).

LoRA takes lr 1e-4 in both unless `lr` is given. `DistillConfig.from_preset("paper", n=100)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import PosbiasError
from ...eval.config import ModelChoice, TaskChoice, config_dict
from ...tasks import Task
from .data import default_skip
from .trainer import ABLATIONS, METHODS, LossSpec

LORA_LR = 1e-4
PRESETS: dict[str, dict] = {"paper": {"n": 300, "lr": 3e-6}, "cpu": {"n": 64, "lr": 1e-4}}
# options that do not change the result: a resumed run may change them
OPERATIONAL = ("device", "save_steps", "save_total_limit", "gen_batch_tokens", "gen_max_batch")


@dataclass
class DistillConfig(TaskChoice, ModelChoice):
    method: str = "pos2distill"  # pos2distill | seqkd | sft
    ablation: str = "full"  # pos2distill: kl | kl+align | full
    preset: str = "cpu"  # whose learning rate a full fine-tuning takes when lr is None
    n: int = PRESETS["cpu"]["n"]  # training questions (Appendix C: 300)
    k: int = 5  # trivial slots per question (Sec. 5.2.2: 4-6)
    anchor: str = "0"  # advantageous slot: a number, or auto:PATH (best slot of a sweep.json)
    correct_only: bool = True  # keep questions whose anchor response is correct (released code)
    max_draw: int | None = None  # examples looked at for n kept (default 10 n)
    skip: int | None = None  # the training split starts here (default: data.default_skip)
    seed: int = 0
    max_new_tokens: int | None = None  # anchor response length (default: the task's)
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"
    lr: float | None = None  # None: the preset's for full fine-tuning, LORA_LR for LoRA
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
    save_steps: int = 10
    save_total_limit: int = 2
    gen_batch_tokens: int = 16384
    gen_max_batch: int = 32

    @classmethod
    def from_preset(cls, preset: str = "cpu", **overrides) -> "DistillConfig":
        """The preset's values with `overrides` (None = keep)."""
        if preset not in PRESETS:
            raise PosbiasError(f"unknown preset {preset!r}", f"use `preset` {' or '.join(PRESETS)}")
        over = {k: v for k, v in overrides.items() if v is not None}
        return cls(**{"preset": preset, "n": PRESETS[preset]["n"], **over})

    def spec(self) -> LossSpec:
        return LossSpec(self.method, self.ablation, self.lam, self.count_factor, self.ce_anchor)

    def validate(self) -> "DistillConfig":
        self._validate_model()
        if self.preset not in PRESETS:
            raise PosbiasError(f"unknown preset {self.preset!r}", f"use `preset` {' or '.join(PRESETS)}")
        if self.method not in METHODS:
            raise PosbiasError(f"unknown `method` {self.method!r}", f"use one of {', '.join(METHODS)}")
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
        return LORA_LR if self.lora else PRESETS[self.preset]["lr"]

    def resolved(self, task: Task, anchor: int, chat: bool) -> dict:
        """Every setting with the defaults filled in (distill.json's "config")."""
        return {**config_dict(self), "skip": default_skip(task) if self.skip is None else self.skip, "anchor": anchor,
                "chat_used": chat, "lr": self.learning_rate(), "max_new_tokens": self.max_new_tokens or task.max_new_tokens,
                "max_draw": self.max_draw or 10 * self.n}
