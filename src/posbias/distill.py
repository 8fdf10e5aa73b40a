"""Pos2Distill (R1 retrieval, R2 reasoning) and its SFT / SeqKD / self-training baselines: train a model to lose its
position bias (docs/pos2distill.md).

    import posbias

    res = posbias.distill.run_distill(posbias.distill.DistillConfig.from_preset("cpu", task="kv-lookup"), "runs/p2d")
    print(res.format())  # res.model_dir is a plain Hugging Face directory: SweepConfig(model=res.model_dir)

`METHODS` are the training methods, `ABLATIONS` Pos2Distill's loss ablations, `PRESETS` the settings by name.
"""

from .mitigate.pos2distill import ABLATIONS as ABLATIONS
from .mitigate.pos2distill import METHODS as METHODS
from .mitigate.pos2distill import PRESETS as PRESETS
from .mitigate.pos2distill import DistillConfig as DistillConfig
from .mitigate.pos2distill import DistillResult as DistillResult
from .mitigate.pos2distill import run_distill as run_distill

__all__ = ["ABLATIONS", "DistillConfig", "DistillResult", "METHODS", "PRESETS", "run_distill"]
