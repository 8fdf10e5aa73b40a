"""Training-free mitigations behind one interface (`Method`), built from spec strings by the registry:

  none                           the unmodified model
  pi:1.2 | pi:DIR/factors.json   Positional Interpolation (uniform factor; the mean of an LPES search)
  layers:1,1.1,...               explicit per-layer RoPE factors
  lpes:DIR/factors.json          the per-layer factors an LPES search found
  mspoe | mspoe:1.2-1.8          Ms-PoE per-head scaling
  buckets | buckets:B1,B2        Attention Buckets (several RoPE bases)
  moice:DIR                      MoICE routers trained by `posbias moice train` (the model stays frozen)
  hidden:DIR | hidden:C:S[:A-B]  positional hidden-channel scaling (a `posbias hidden search` folder, or explicit)
  swap | aswap[:T] | pride[:0.05]   order tasks only: verdict rules over the candidates' orders (decision.py; aswap
                                 reads the swapped order only where the first verdict is unsure)
  reorder[:bm25|oracle|attention][:litm|first|last]   reordering the items by a relevance signal (reorder.py)
  ensemble[:K][:shift|perm][:adaptive]   the majority answer over K orders of the items (ensemble.py)
  curve:RUN[:bm25|oracle]   the most relevant items into the slots a sweep measured best (curve.py)
  attnsort[:ROUNDS]              attention sorting: most attended item last, repeated
  calib:prompt | calib:DIR       Found-in-the-Middle attention calibration (calibration.py)
  pine[:reversed|fixed|causal|nia|pcw]   PINE: position-invariant attention over the items (pine.py)

`posbias methods` prints the registry itself (tests/test_methods.py checks this list names every built-in).
Every method also takes the generic `name:key=value,...` (posbias/specs.py), its keys the constructor's parameters
(`Method.spec_params()`): `mspoe:min_ratio=1.2,max_ratio=1.8`, `pi:factor=1.2`, `layers:factors=1,1.1,1.2`.
"""

from .base import Active, Baseline, Method
from .buckets import Buckets
from .calibration import Calibration
from .curve import Curve
from .ensemble import Ensemble
from .decision import DecisionRule, PriDe, Swap
from .hidden import HiddenScale
from .moice import MoICE
from .mspoe import MsPoE
from .pine import Pine
from .registry import METHODS, get_method, register_method, split_specs
from .reorder import AttentionSort, Reorder
from .scaling import LPES, LayerScaling, UniformScaling, read_factors

__all__ = [
    "LPES", "METHODS", "Active", "AttentionSort", "Calibration", "Curve", "Ensemble", "Reorder", "Baseline", "Buckets", "DecisionRule", "LayerScaling", "PriDe", "Swap", "Method", "MoICE", "MsPoE", "Pine", "UniformScaling",
    "get_method", "read_factors", "register_method", "split_specs",
    "HiddenScale",
]
