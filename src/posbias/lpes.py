"""LPES (layer-specific positional embedding scaling): per-layer RoPE factors on a Bezier curve whose control points
a constrained genetic algorithm searches on a search split (docs/lpes.md).

    import posbias

    res = posbias.lpes.run_search(posbias.lpes.SearchConfig.from_preset("cpu", task="kv-lookup"), "runs/lpes")
    print(res.format())  # then the method "lpes:runs/lpes/factors.json" in run_sweep / run_compare

`run_gain` reads several `run_compare` folders (the same methods at different context lengths) and gives each
method's gain over the first entry against the prompt length.
"""

from .core.ga import GAConfig as GAConfig
from .methods import LPES as LPES
from .mitigate.lpes import PRESETS as PRESETS
from .mitigate.lpes import SPACES as SPACES
from .mitigate.lpes import LPESResult as SearchResult
from .mitigate.lpes import SearchConfig as SearchConfig
from .mitigate.lpes import run_search as run_search
from .mitigate.lpes.length_gain import GainResult as GainResult
from .mitigate.lpes.length_gain import run_length_gain as run_gain

__all__ = ["GAConfig", "GainResult", "LPES", "PRESETS", "SPACES", "SearchConfig", "SearchResult", "run_gain", "run_search"]
