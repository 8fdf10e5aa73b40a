"""Positional hidden-channel scaling: find the hidden channel that varies monotonically with position and the scale
that cuts position bias on a calibration split (docs/hidden.md).

    import posbias

    res = posbias.hidden.run_search(posbias.hidden.SearchConfig.from_preset("cpu", task="kv-lookup"), "runs/hidden")
    print(res.format())  # then the method "hidden:runs/hidden"

`HiddenScale` is the method that applies a channel and scale (what `get_method("hidden:DIR")` builds).
"""

from .methods import HiddenScale as HiddenScale
from .mitigate.hidden import PRESETS as PRESETS
from .mitigate.hidden import HiddenSearchConfig as SearchConfig
from .mitigate.hidden import HiddenSearchResult as SearchResult
from .mitigate.hidden import run_hidden_search as run_search

__all__ = ["HiddenScale", "PRESETS", "SearchConfig", "SearchResult", "run_search"]
