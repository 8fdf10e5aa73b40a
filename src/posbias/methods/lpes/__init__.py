"""LPES (layer-specific positional embedding scaling): per-layer RoPE factors on a Bezier curve
whose control points a constrained genetic algorithm searches (Sec. 3, Algorithm 1).

The maths lives in core/bezier.py and core/ga.py, the model hook in models/rope.py; this folder
runs the search on a real model and task (search.py) and draws its result (plots.py).
"""

from .search import SearchConfig, run_search

__all__ = ["SearchConfig", "run_search"]
