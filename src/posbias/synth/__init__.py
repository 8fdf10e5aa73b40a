"""Controlled synthetic experiments on position bias (Wu et al. 2025, Sec. 5 and App. J-L):
Reddy (2024)'s in-context classification task, attention-only networks, swap tests, sinks."""

from .data import BIASES, DataConfig, SynthTask
from .evaluate import PAIRS, EvalConfig, evaluate
from .experiments import (
    GRIDS,
    PRESETS,
    grid_runs,
    one_run_config,
    one_run_path,
    parse_mask,
    run_grid,
    run_one,
    run_single,
)
from .model import MASKS, PES, AttentionOnlyNet, ModelConfig
from .multi import run_group, train_group
from .results import GridResult, RunResult, format_run, format_summary
from .train import RunConfig, TrainConfig, train

__all__ = [
    "BIASES", "GRIDS", "MASKS", "PAIRS", "PES", "PRESETS", "AttentionOnlyNet", "DataConfig", "EvalConfig", "GridResult",
    "RunResult", "run_single",
    "ModelConfig", "RunConfig", "SynthTask", "TrainConfig", "evaluate", "format_run", "format_summary", "grid_runs",
    "one_run_config", "one_run_path", "parse_mask", "run_grid", "run_one", "train",
    "run_group", "train_group",
]
