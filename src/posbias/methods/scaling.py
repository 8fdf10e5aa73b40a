"""Fixed RoPE position scaling (LPES eq. 2, f'(x, i) = f(x, i / s)): one factor for every layer
(Positional Interpolation, Chen et al. 2023a) or one factor per layer (LPES factors, or any list).

The LPES paper's PI baseline uses the mean of the searched per-layer factors (Sec. 4.1):
`pi:DIR/factors.json` does exactly that; `pi:1.2` takes the factor directly.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path

from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Method


def read_factors(path: str | Path) -> dict:
    """A factors.json written by `posbias lpes search` (a directory means DIR/factors.json)."""
    p = Path(path)
    if p.is_dir():
        p = p / "factors.json"
    if not p.exists():
        raise PosbiasError(f"no factors file at {p}", "run `posbias lpes search --out DIR` first, then pass DIR/factors.json")
    try:
        rec = json.loads(p.read_text())
        factors = [float(x) for x in rec["factors"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise PosbiasError(f"{p} is not a factors.json ({e})", "pass the factors.json that `posbias lpes search` wrote") from None
    return {**rec, "factors": factors, "path": str(p)}


def _positive(values: list[float], what: str) -> list[float]:
    if not values or any(not v > 0 for v in values):
        raise PosbiasError(f"{what} must be positive numbers, got {values}", "e.g. pi:1.2 or layers:1,1.1,1.2")
    return values


class LayerScaling(Method):
    """Per-layer factors s_h (LPES when they come from a search)."""

    def __init__(self, factors: list[float], name: str = "layers", source: str | None = None, extra: dict | None = None):
        self.factors = _positive([float(f) for f in factors], "per-layer factors")
        self.name, self.source, self.extra = name, source, extra or {}

    @property
    def label(self) -> str:
        curve = self.extra.get("curve")
        return f"{self.name} ({curve})" if curve and curve != "bezier" else self.name

    def config(self) -> dict:
        return {"name": self.name, "factors": self.factors, "source": self.source, **self.extra}

    def apply(self, loaded: Loaded) -> AbstractContextManager:
        from ..models.rope import layer_rope_scaling

        return layer_rope_scaling(loaded.model, self.factors)


class UniformScaling(Method):
    """Positional Interpolation: the same factor on every layer."""

    name = "pi"

    def __init__(self, factor: float, source: str | None = None):
        self.factor = _positive([float(factor)], "the PI factor")[0]
        self.source = source

    @property
    def label(self) -> str:
        return f"pi:{self.factor:g}"

    def config(self) -> dict:
        return {"name": "pi", "factor": self.factor, "source": self.source}

    def apply(self, loaded: Loaded) -> AbstractContextManager:
        from ..models.rope import uniform_rope_scaling

        return uniform_rope_scaling(loaded.model, self.factor)


def lpes_method(path: str) -> LayerScaling:
    rec = read_factors(path)
    extra = {k: rec[k] for k in ("control_points", "curve", "space") if k in rec}
    return LayerScaling(rec["factors"], name="lpes", source=rec["path"], extra=extra)


def pi_method(arg: str) -> UniformScaling:
    try:
        return UniformScaling(float(arg))
    except ValueError:
        rec = read_factors(arg)
        return UniformScaling(sum(rec["factors"]) / len(rec["factors"]), source=rec["path"])
