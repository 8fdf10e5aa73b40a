"""MoICE: per-head routers that mix attention over several RoPE bases, trained with the model frozen
(docs/mitigations.md).

    import posbias

    res = posbias.moice.run_train(posbias.moice.TrainConfig.from_preset("cpu", task="kv-lookup"), "runs/moice")
    print(res.format())  # then the method "moice:runs/moice"

`MoICE` is the method that applies trained routers (what `get_method("moice:DIR")` builds).
"""

from .methods import MoICE as MoICE
from .mitigate.moice import PRESETS as PRESETS
from .mitigate.moice import MoICEConfig as TrainConfig
from .mitigate.moice import MoICEResult as TrainResult
from .mitigate.moice import train_moice as run_train

__all__ = ["MoICE", "PRESETS", "TrainConfig", "TrainResult", "run_train"]
