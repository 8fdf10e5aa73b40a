"""MoICE training configuration and its presets (library objects: the CLI and the API share them).

  paper  the public training script (p1nksnow/MoICE training/train.sh): 7 bases (10000, 17500, 18000, 19000,
         20000, 22500, 25000 for Llama-2's theta 1e4, scaled here to the model's theta), top-k 7, router aux loss
         coefficient 0.3, lr 1e-4 constant, 7 optimizer steps of 32 examples (batch 1 x gradient accumulation 32),
         only the routers trainable. Its warmup_ratio 0.2 has no effect: with lr_scheduler_type "constant" the
         Hugging Face scheduler ignores warmup, so the lr is 1e-4 from the first step, as here.
  cpu    the same method sized for 2 shared CPU cores: 6 steps x 4 examples, lr 1e-2 (100x the paper's: at 1e-4 a
         handful of steps cannot move ~255k router weights away from their init). Measured on SmolLM2-135M (bf16,
         1 thread, kv-lookup with 30 facts, ~680-token prompts): one 4-example step (forward + backward through
         seven attentions per layer) takes 70-120 s, so the preset runs in ~8 min (8.0 min measured, 8.5 min
         with loading); per-step CE on fresh examples went 0.730, 0.276, 0.494, 0.474, 0.403, 0.407 (each step sees
         new examples, so the curve is noisy; on the same 4 examples the tiny-model test shows a steady decrease).

`MoICEConfig()` is the cpu preset; `MoICEConfig.from_preset("paper", task="kv-lookup")` the paper's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import PosbiasError
from ...eval.config import ModelChoice, TaskChoice, check_split, config_dict

PRESETS: dict[str, dict] = {
    "paper": {"steps": 7, "batch": 32, "lr": 1e-4, "top_k": 7, "aux_coef": 0.3},
    "cpu": {"steps": 6, "batch": 4, "lr": 1e-2, "top_k": 7, "aux_coef": 0.3},
}

GENERATED_SKIP = 3000  # generated tasks: sweeps use 0.., the LPES search 1000.., distillation 2000..


@dataclass
class MoICEConfig(TaskChoice, ModelChoice):
    """MoICE router training: per-head routers over RoPE bases, the model frozen (the one baseline that trains).
    `MoICEConfig()` is the cpu preset.

    steps: optimizer steps (paper 7).
    batch: examples per optimizer step (paper 32; gradients accumulated over micro-batches).
    micro_batch: examples per forward (memory only: the step's gradient is the same).
    lr: AdamW learning rate, constant (paper 1e-4).
    weight_decay: AdamW weight decay (the released train.sh: 0).
    top_k: experts kept per token and head (paper 7); None: all bases.
    bases: RoPE bases B1,B2,... of the main kind; None: the paper's 7 scaled to the model's theta.
    aux_coef: weight of the load-balancing loss (paper 0.3).
    n: training examples; None: steps * batch (each seen once).
    seed: example seed; also draws each example's gold slot.
    skip: the training split starts here; None: see split_start.
    router_seed: initialisation seed of the routers.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    steps: int = PRESETS["cpu"]["steps"]
    batch: int = PRESETS["cpu"]["batch"]
    micro_batch: int = 4
    lr: float = PRESETS["cpu"]["lr"]
    weight_decay: float = 0.0
    top_k: int | None = PRESETS["cpu"]["top_k"]
    bases: tuple[float, ...] | None = None
    aux_coef: float = PRESETS["cpu"]["aux_coef"]
    n: int | None = None
    seed: int = 0
    skip: int | None = None
    router_seed: int = 0

    @classmethod
    def from_preset(cls, preset: str = "cpu", **overrides) -> "MoICEConfig":
        """The preset's values with `overrides` (None values keep the preset's)."""
        if preset not in PRESETS:
            raise PosbiasError(f"unknown preset {preset!r}", f"use `preset` {' or '.join(PRESETS)}")
        over = {k: v for k, v in overrides.items() if v is not None}
        if over.get("bases") and "top_k" not in over:  # the preset's top-k, at most every base given
            over["top_k"] = min(PRESETS[preset]["top_k"], len(over["bases"]))
        return cls(**{**PRESETS[preset], **over})

    @property
    def examples_needed(self) -> int:
        return self.n if self.n is not None else self.steps * self.batch

    def validate(self) -> "MoICEConfig":
        self._validate_task()
        self._validate_model()
        check_split(self.examples_needed, 0 if self.skip is None else self.skip)
        for name in ("steps", "batch", "micro_batch"):
            if getattr(self, name) < 1:
                raise PosbiasError(f"`{name}` must be at least 1, got {getattr(self, name)}", f"pass `{name}=1` or more")
        if not (math.isfinite(self.lr) and self.lr > 0) or self.weight_decay < 0 or self.aux_coef < 0:
            raise PosbiasError(f"need lr > 0, weight_decay >= 0, aux_coef >= 0; got {self.lr}, {self.weight_decay}, "
                               f"{self.aux_coef}", "e.g. `lr=1e-4`, `aux=0.3`")
        if self.bases is not None and (not self.bases or any(not (math.isfinite(b) and b > 1) for b in self.bases)):
            raise PosbiasError(f"`bases` must be RoPE bases > 1, got {self.bases}", "e.g. `bases=100000,175000,250000`")
        n_bases = len(self.bases) if self.bases else 7
        if self.top_k is not None and not 1 <= self.top_k <= n_bases:
            raise PosbiasError(f"`top_k` must be between 1 and the number of bases ({n_bases}), got {self.top_k}",
                               f"pass `top_k={n_bases}` or fewer")
        return self

    def to_dict(self) -> dict:
        return config_dict(self)

    def split_start(self, pool: int | None) -> int:
        """Where the training examples start: `skip`, else 3000 for a generated task (sweeps use 0.., the LPES
        search 1000.., distillation 2000..) and for a file task the n examples that end at three quarters of the
        pool (sweeps use its start, distillation from its middle, the LPES search its last n)."""
        if self.skip is not None:
            return self.skip
        if pool is None:
            return GENERATED_SKIP
        start = 3 * pool // 4 - self.examples_needed
        if start < 0:
            raise PosbiasError(f"the task has {pool} examples, too few for {self.examples_needed} training examples "
                               "clear of the held-out ones", "pass `n` smaller or an explicit `skip`")
        return start
