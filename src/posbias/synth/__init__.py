"""Controlled synthetic experiments on position bias (Wu et al. 2025, Sec. 5 and App. J-L): Reddy (2024)'s in-context
classification task, attention-only networks, swap tests, sinks (docs/synth.md).

    import posbias

    runs = posbias.synth.grid_runs("depth", "quick", seeds=1)  # the grid's configurations x seeds
    res = posbias.synth.run_grid("depth", runs, "runs/synth-depth-quick", workers=2)
    print(res.format())

    one = posbias.synth.run_single(posbias.synth.one_run_config(depth=2, pe="rope", iters=500), "runs/synth-train")

`GRIDS` names the three grids (depth, bias, sinks), `PRESETS` their sizes (quick, medium, paper). The modules
(data, model, train, evaluate, multi, experiments) are internal.
"""

from .experiments import GRIDS as GRIDS
from .experiments import PRESETS as PRESETS
from .experiments import grid_runs as grid_runs
from .experiments import one_run_config as one_run_config
from .experiments import run_grid as run_grid
from .experiments import run_single as run_single
from .results import GridResult as GridResult
from .results import RunResult as RunResult
from .train import RunConfig as RunConfig

__all__ = ["GRIDS", "GridResult", "PRESETS", "RunConfig", "RunResult", "grid_runs", "one_run_config", "run_grid",
           "run_single"]
