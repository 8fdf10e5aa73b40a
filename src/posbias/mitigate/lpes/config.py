"""LPES search configuration and its presets (library objects: the CLI and the API share them).

  cpu    sized by benchmarks/lpes_speed.py for 2 cores (docs/lpes.md): 24 search examples, 5
         generations, factors 1.0-1.5 in steps of 0.05 starting at 1.1 (SmolLM2 collapses under
         uniform scaling >= 1.25, so the paper's 1-2 range is mostly a dead zone for it)
  paper  Sec. 4.1 (200 search examples) and Table 12 / Table 9 (20 generations, 1.0-2.0 step 0.1,
         eq. 8's initial factor 1.5, M_y 0.2)

`SearchConfig()` is the cpu preset; `SearchConfig.from_preset("paper", n=100, ga={"generations": 10})`
the paper's with changes. Population, parents, crossover and mutation counts are Table 12's in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...core.ga import GAConfig
from ...errors import PosbiasError
from ...eval.config import ModelChoice, Scoring, TaskChoice, check_split, config_dict
from ...tasks import positions_spec

SPACES = ("curve", "layers", "random")  # GA over control points | GA over per-layer factors (brute force) | random search
PRESETS: dict[str, dict] = {
    "cpu": {"n": 24, "generations": 5, "y_min": 1.0, "y_max": 1.5, "y_step": 0.05, "y_init": 1.1, "my": 0.1},
    "paper": {"n": 200, "generations": 20, "y_min": 1.0, "y_max": 2.0, "y_step": 0.1, "y_init": 1.5, "my": 0.2},
}


def _ga(preset: str) -> GAConfig:
    return GAConfig(**{k: v for k, v in PRESETS[preset].items() if k != "n"})


@dataclass
class SearchConfig(Scoring, TaskChoice, ModelChoice):
    """An LPES search: per-layer RoPE factors found by a constrained genetic algorithm (LPES Sec. 4).
    `SearchConfig()` is the cpu preset; `SearchConfig.from_preset("paper", ...)` the paper's.

    n: search examples, each scored at 3 positions per individual.
    seed: example seed (the GA has its own, ga.seed; the CLI's --seed sets both).
    skip: the search split starts here; None: 1000, or a file task's last n examples (sweeps use 0..).
    positions: beginning, middle, end slots ([0, 5, 9] or "0,5,9"); None: 0, n_slots // 2, n_slots - 1.
    weights: lambda_B,lambda_M,lambda_E: the weights of the beginning, middle and end accuracies in the fitness
        (Sec. 4.1).
    space: what the search explores: curve (GA over Bezier control points) | layers (GA over per-layer factors,
        brute force) | random.
    budget: random search: individuals to draw (default: what the GA evaluates at most).
    ga: the genetic algorithm's settings (GAConfig; the preset's).
    engine, max_new_tokens, batch_tokens, max_batch, prefix_sharing, prefix_attention: see `Scoring`.
    task, task_options, data_dir: see `TaskChoice`.
    model, dtype, device, chat, device_map: see `ModelChoice`.
    """

    n: int = PRESETS["cpu"]["n"]
    seed: int = 0
    skip: int | None = None
    positions: tuple[int, int, int] | None = None
    weights: tuple[float, float, float] = (0.2, 0.3, 0.5)
    space: str = "curve"
    budget: int | None = None
    ga: GAConfig = field(default_factory=lambda: _ga("cpu"))

    @classmethod
    def from_preset(cls, preset: str = "cpu", ga: dict | None = None, **overrides) -> "SearchConfig":
        """The preset's values with `overrides` of SearchConfig fields and `ga` overrides of GAConfig
        fields (None values keep the preset's)."""
        if preset not in PRESETS:
            raise PosbiasError(f"unknown preset {preset!r}", f"use `preset` {' or '.join(PRESETS)}")
        ga_over = {k: v for k, v in (ga or {}).items() if v is not None}
        over = {k: v for k, v in overrides.items() if v is not None}
        return cls(**{"n": PRESETS[preset]["n"], **over, "ga": replace(_ga(preset), **ga_over)})

    def validate(self) -> "SearchConfig":
        self._validate_task()
        self._validate_model()
        self._validate_scoring()
        check_split(self.n, 0 if self.skip is None else self.skip)
        if self.space not in SPACES:
            raise PosbiasError(f"unknown search `space` {self.space!r}", f"use one of {', '.join(SPACES)}")
        w = self.weights
        if len(w) != 3 or min(w) < 0 or abs(sum(w) - 1) > 1e-9:
            raise PosbiasError(f"`weights` must be three non-negative numbers summing to 1, got {w}",
                               "e.g. `weights=0.2,0.3,0.5`")
        if self.positions is not None:  # "0,5,9" or [0, 5, 9] -> (0, 5, 9)
            spec = positions_spec(self.positions)
            try:
                self.positions = tuple(int(p) for p in spec.split(","))
            except ValueError:
                raise PosbiasError(f"`positions` must be three slots (beginning, middle, end), got {spec!r}",
                                   "name three slots, e.g. `positions=[0, 5, 9]`") from None
        if self.positions is not None and len(self.positions) != 3:
            raise PosbiasError(f"`positions` must be three slots (beginning, middle, end), got {self.positions}",
                               "name three, e.g. `positions=0,MIDDLE,LAST` (the task's middle and last slots)")
        self.ga.validate()
        return self

    def to_dict(self) -> dict:
        return config_dict(self)

    def split_start(self, pool: int | None) -> int:
        """Where the search split starts for a task with `pool` examples (None: generated, unlimited): `skip`,
        else 1000 for generated tasks and the last n examples of a file task, so held-out sweeps (0..) stay clear."""
        if self.skip is not None:
            return self.skip
        return 1000 if pool is None else max(pool - self.n, 0)
