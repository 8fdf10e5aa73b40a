"""LPES (layer-specific positional embedding scaling): per-layer RoPE factors on a Bezier curve
whose control points a constrained genetic algorithm searches (Sec. 3, Algorithm 1).

The maths lives in core/bezier.py and core/ga.py, the model hook in models/rope.py, the method
that applies found factors in methods/scaling.py (`lpes:FACTORS.json`); this package runs the
search on a real model and task: config.py (presets), fitness.py, search.py.
"""

from .config import PRESETS, SPACES, SearchConfig
from .fitness import Fitness, build_fitness, fitness_key, weighted_fitness
from .search import LPESResult, make_space, run_search

__all__ = ["PRESETS", "SPACES", "Fitness", "LPESResult", "SearchConfig", "build_fitness", "fitness_key", "make_space",
           "run_search", "weighted_fitness"]
