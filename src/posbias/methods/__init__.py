"""Training-free mitigations behind one interface (methods.base.Method), selected by a spec string:

  none                      the unmodified model
  pi:1.2 | pi:DIR/factors.json   Positional Interpolation (uniform factor; the mean of an LPES search)
  layers:1,1.1,...          explicit per-layer RoPE factors
  lpes:DIR/factors.json     the per-layer factors an LPES search found
  mspoe | mspoe:1.2-1.8     Ms-PoE per-head scaling
  buckets | buckets:B1,B2   Attention Buckets (several RoPE bases)
"""

from __future__ import annotations

from ..errors import PosbiasError
from .base import Baseline, Method
from .scaling import LayerScaling, UniformScaling, lpes_method, pi_method

SPECS = ("none", "pi:FACTOR|pi:FACTORS.json", "layers:F1,F2,...", "lpes:FACTORS.json", "mspoe[:MIN-MAX]", "buckets[:B1,B2,...]")


def get_method(spec: str) -> Method:
    """Parse a method spec (see the module docstring)."""
    from . import buckets, mspoe

    name, _, arg = spec.strip().partition(":")
    if name in ("none", "baseline", "") and not arg:
        return Baseline()
    if name == "pi" and arg:
        return pi_method(arg)
    if name == "lpes" and arg:
        return lpes_method(arg)
    if name == "layers" and arg:
        try:
            return LayerScaling([float(x) for x in arg.split(",")])
        except ValueError:
            raise PosbiasError(f"bad per-layer factors {arg!r}", "write them as layers:1,1.1,1.2,... (one per layer)") from None
    if name == "mspoe":
        return mspoe.parse(arg)
    if name == "buckets":
        return buckets.parse(arg)
    raise PosbiasError(f"unknown method {spec!r}", f"use one of: {', '.join(SPECS)}")


__all__ = ["Method", "Baseline", "LayerScaling", "UniformScaling", "get_method", "SPECS"]
