"""Hidden-channel search configuration and its presets (library objects: the CLI and the API share them).

  paper  the public code (PositionalHidden: scripts/search_dimension.sh, search_dims.py, eval_on_valid_set.py):
         hidden states averaged over 200 random-text samples of 1000 tokens, the 10 smoothest monotone channels
         as candidates, layers 10..25 of 32 (here the same span proportionally, models/hidden.middle_layers),
         candidates judged on a 60-example calibration set by the answer loss (teacher forcing, the last
         prompt token and the answer scaled). The public code scores scale 0 and fixes the scale per model by
         hand (0 for most, -1 for LLaMA-2-7B); this preset scores the paper's four values 0.5, 0, -0.5, -1.
  cpu    the same rules sized for 2 shared CPU cores: 48 samples of 384 tokens, 4 candidates, scales 0 and -1,
         16 calibration examples at the beginning, middle and end slots, chosen by accuracy (answer loss
         breaks ties; accuracy is what compare reports).

`HiddenSearchConfig()` is the cpu preset; `HiddenSearchConfig.from_preset("paper", n=30)` the paper's with changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import PosbiasError
from ...eval.config import ModelChoice, Scoring, TaskChoice, check_split, config_dict

SELECT = ("accuracy", "loss")  # mean accuracy over the calibration slots (loss breaks ties) | mean answer NLL
PRESETS: dict[str, dict] = {
    "cpu": {"samples": 48, "length": 384, "top_k": 4, "scales": (0.0, -1.0), "n": 16, "select": "accuracy"},
    "paper": {"samples": 200, "length": 1000, "top_k": 10, "scales": (0.5, 0.0, -0.5, -1.0), "n": 60, "select": "loss"},
}


@dataclass
class HiddenSearchConfig(Scoring, TaskChoice, ModelChoice):
    """The positional hidden-channel search: hidden states averaged over random text, the smoothest monotone
    channels as candidates, each scored with each scale on a calibration split. `HiddenSearchConfig()` is the cpu
    preset; `HiddenSearchConfig.from_preset("paper", ...)` the paper's.

    samples: random-text sequences the hidden states are averaged over (paper 200).
    length: tokens per sequence (paper 1000; random token ids, no BOS: the public code adds none).
    stats_seed: seed of the random token ids.
    top_k: candidate channels (the smoothest monotone ones) scored on the task (paper 10).
    mono_skip: monotonicity is fitted from this fraction of the positions on (paper: 300 of 1000).
    smooth_skip: smoothness is fitted from this fraction of the positions on (paper: 200 of 1000).
    scales: the factors tried on each candidate, e.g. 0,-1 (paper 0.5,0,-0.5,-1).
    layers: decoder layers scaled, a-b or a,b,c; None: the paper's middle layers (models/hidden.middle_layers).
    select: how the channel and scale are chosen: accuracy (mean over the calibration slots; the loss breaks ties)
        | loss (mean answer NLL; paper).
    n: calibration examples, each at every calibration slot (paper 60).
    seed: example seed.
    skip: the calibration split starts here; None: 1500, or a file task's last n examples (sweeps use 0..).
    positions: calibration slots; None: 0, the middle slot, the last.
    engine, max_new_tokens, batch_tokens, max_batch, prefix_sharing, prefix_attention: see `Scoring`.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    samples: int = PRESETS["cpu"]["samples"]
    length: int = PRESETS["cpu"]["length"]
    stats_seed: int = 0
    top_k: int = PRESETS["cpu"]["top_k"]
    mono_skip: float = 0.3
    smooth_skip: float = 0.2
    scales: tuple[float, ...] = PRESETS["cpu"]["scales"]
    layers: tuple[int, ...] | None = None
    select: str = PRESETS["cpu"]["select"]
    n: int = PRESETS["cpu"]["n"]
    seed: int = 0
    skip: int | None = None
    positions: tuple[int, ...] | None = None

    @classmethod
    def from_preset(cls, preset: str = "cpu", **overrides) -> "HiddenSearchConfig":
        """The preset's values with `overrides` (None values keep the preset's)."""
        if preset not in PRESETS:
            raise PosbiasError(f"unknown preset {preset!r}", f"use `preset` {' or '.join(PRESETS)}")
        over = {k: v for k, v in overrides.items() if v is not None}
        return cls(**{**PRESETS[preset], **over})

    def validate(self) -> "HiddenSearchConfig":
        self._validate_task()
        self._validate_model()
        self._validate_scoring()
        check_split(self.n, 0 if self.skip is None else self.skip)
        if self.samples < 1 or self.length < 32 or self.top_k < 1:
            raise PosbiasError(f"need samples >= 1, length >= 32, top_k >= 1; got {self.samples}, {self.length}, "
                               f"{self.top_k}", "e.g. `samples=48`, `length=384`, `top_k=4`")
        if not (0 <= self.mono_skip < 0.9 and 0 <= self.smooth_skip < 0.9):
            raise PosbiasError(f"`mono_skip` and `smooth_skip` are fractions of the length below 0.9, got "
                               f"{self.mono_skip}, {self.smooth_skip}", "e.g. `mono_skip=0.3`, `smooth_skip=0.2`")
        if not self.scales or any(not math.isfinite(s) or s == 1.0 for s in self.scales):
            raise PosbiasError(f"`scales` must be finite factors other than 1, got {self.scales}", "e.g. `scales=0,-1`")
        if self.select not in SELECT:
            raise PosbiasError(f"unknown `select` {self.select!r}", f"use one of {', '.join(SELECT)}")
        if self.layers is not None and (not self.layers or min(self.layers) < 0):
            raise PosbiasError(f"`layers` must name decoder layers, got {self.layers}", "e.g. `layers=9-23`")
        return self

    def to_dict(self) -> dict:
        return config_dict(self)

    def split_start(self, pool: int | None) -> int:
        """Where the calibration split starts: `skip`, else 1500 for generated tasks (sweeps use 0.., LPES 1000..,
        distillation 2000..) and the last n examples of a file task."""
        if self.skip is not None:
            return self.skip
        return 1500 if pool is None else max(pool - self.n, 0)
