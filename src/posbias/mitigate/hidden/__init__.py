"""Positional hidden-channel scaling (Yu et al. 2025): find the hidden channel that varies monotonically with
position and the scale that cuts position bias on a calibration split (search.py, presets in config.py).

The statistics live in core/positional_channels.py, the model hook in models/hidden.py, the method that
applies a found channel in methods/hidden.py (`hidden:OUT`).
"""

from .config import PRESETS, SELECT, HiddenSearchConfig
from .search import HiddenSearchResult, calibration_positions, run_hidden_search

__all__ = ["PRESETS", "SELECT", "HiddenSearchConfig", "HiddenSearchResult", "calibration_positions",
           "run_hidden_search"]
