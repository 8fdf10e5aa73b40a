"""Fixed RoPE position scaling (LPES eq. 2, f'(x, i) = f(x, i / s)): one factor for every layer
(Positional Interpolation, Chen et al. 2023a) or one factor per layer (LPES factors, or any list).

The LPES paper's PI baseline uses the mean of the searched per-layer factors (Sec. 4.1):
`pi:DIR/factors.json` (or `pi:source=DIR/factors.json`) does exactly that; `pi:1.2` (`pi:factor=1.2`) takes
the factor directly. The key=value forms: `pi:factor=F | pi:source=FILE`, `layers:factors=F1,F2,...`,
`lpes:source=FILE`.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager
from pathlib import Path

from ..errors import PosbiasError
from ..models.load import Loaded
from .base import Active, Method, active_while
from .registry import register_method


def read_factors(path: str | Path) -> dict:
    """A factors.json written by an LPES search (a directory means DIR/factors.json)."""
    p = Path(path)
    if p.is_dir():
        p = p / "factors.json"
    if not p.exists():
        raise PosbiasError(f"no factors file at {p}", "run an LPES search first, then pass its DIR/factors.json")
    try:
        rec = json.loads(p.read_text())
        factors = [float(x) for x in rec["factors"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, UnicodeDecodeError) as e:
        raise PosbiasError(f"{p} is not a factors.json ({e})", "pass the factors.json an LPES search wrote") from None
    return {**rec, "factors": factors, "path": str(p)}


def _positive(values: list[float], what: str) -> list[float]:
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise PosbiasError(f"{what} must be finite positive numbers, got {values[:8]}", "e.g. pi:1.2 or layers:1,1.1,1.2")
    return values


@register_method
class LayerScaling(Method):
    """Per-layer factors s_h, layer h sees positions i / s_h (LPES eq. 2)."""

    name = "layers"
    usage = "layers:F1,F2,..."
    prefix_safe = True  # keys are cached at their own scaled positions: a shared prefix is exact

    def __init__(self, factors: list[float], source: str | None = None, extra: dict | None = None):
        self.factors = _positive([float(f) for f in factors], "per-layer factors")
        self.source, self.extra = source, extra or {}

    @classmethod
    def from_spec(cls, arg: str) -> "LayerScaling":
        try:
            return cls([float(x) for x in arg.split(",")])
        except ValueError:
            raise PosbiasError(f"bad per-layer factors {arg!r}", "write them as layers:1,1.1,1.2,... (one per layer)") from None

    @classmethod
    def from_params(cls, factors: list[float]) -> "LayerScaling":
        """`layers:factors=1,1.1,1.2,...` (one per layer)."""
        return cls(factors)

    @property
    def label(self) -> str:
        curve = self.extra.get("curve")
        return f"{self.name} ({curve})" if curve and curve != "bezier" else self.name

    def config(self) -> dict:
        return {"name": self.name, "factors": self.factors, "source": self.source, **self.extra}

    def check(self, loaded: Loaded) -> None:
        from ..models.rope import check_layer_factors

        check_layer_factors(loaded.model, self.factors)

    def apply(self, loaded: Loaded) -> AbstractContextManager[Active]:
        from ..models.rope import layer_rope_scaling

        return active_while(layer_rope_scaling(loaded.model, self.factors))


@register_method
class LPES(LayerScaling):
    """The per-layer factors an LPES search found (its factors.json)."""

    name = "lpes"
    usage = "lpes:FACTORS.json"

    @classmethod
    def from_spec(cls, arg: str) -> "LPES":
        if not arg:
            raise PosbiasError("lpes needs the factors of a search", f"write it as {cls.spec_forms()}")
        return cls.from_params(arg)

    @classmethod
    def from_params(cls, source: str) -> "LPES":
        """`lpes:source=DIR/factors.json`: the factors (and the search split) a search wrote."""
        rec = read_factors(source)
        extra = {k: rec[k] for k in ("control_points", "curve", "space") if k in rec}
        method = cls(rec["factors"], source=rec["path"], extra=extra)
        method.fitted_on = rec.get("search_split")
        return method

    @property
    def label(self) -> str:
        """`lpes:<search folder>`, so two searches in one comparison stay apart."""
        where = Path(self.source).parent.name if self.source else ""
        return super().label.replace(self.name, f"{self.name}:{where}" if where else self.name, 1)


@register_method
class UniformScaling(Method):
    """Positional Interpolation: the same factor on every layer."""

    name = "pi"
    usage = "pi:FACTOR|pi:FACTORS.json"
    prefix_safe = True  # keys are cached at their own scaled positions: a shared prefix is exact

    def __init__(self, factor: float, source: str | None = None):
        self.factor = _positive([float(factor)], "the PI factor")[0]
        self.source = source

    @classmethod
    def from_spec(cls, arg: str) -> "UniformScaling":
        if not arg:
            raise PosbiasError("pi needs a factor", f"write it as {cls.spec_forms()}")
        try:
            return cls(float(arg))
        except ValueError:
            return cls.from_params(source=arg)

    @classmethod
    def from_params(cls, factor: float | None = None, source: str | None = None) -> "UniformScaling":
        """`pi:factor=1.2`, or `pi:source=DIR/factors.json` (the mean of a search's factors)."""
        if (factor is None) == (source is None):
            raise PosbiasError("pi takes a factor or the factors.json of a search, one of them",
                               "write it as pi:factor=1.2 or pi:source=DIR/factors.json")
        if source is None:
            return cls(factor)
        rec = read_factors(source)
        method = cls(sum(rec["factors"]) / len(rec["factors"]), source=rec["path"])
        method.fitted_on = rec.get("search_split")
        return method

    @property
    def label(self) -> str:
        return f"pi:{self.factor:g}"

    def config(self) -> dict:
        return {"name": "pi", "factor": self.factor, "source": self.source}

    def check(self, loaded: Loaded) -> None:
        from ..models.rope import rope_info

        rope_info(loaded.model)

    def apply(self, loaded: Loaded) -> AbstractContextManager[Active]:
        from ..models.rope import uniform_rope_scaling

        return active_while(uniform_rope_scaling(loaded.model, self.factor))
