"""Why a model fails where it fails: the graph-theoretic rollout and its theorem checks, and analyses of a real
model (docs/theory.md, docs/analyses.md, docs/attention.md). The synthetic experiments are `posbias.synth`.

    import posbias

    res = posbias.explain.run_attention(posbias.explain.AttentionConfig(positions=[0, 5, 9], n=4), "runs/attention")
    print(res.format())

- `run_theory` / `TheoryConfig`: rollout over masks, decay masks and RoPE (figures, theorem checks), and with
  `real=RealRollout(...)` the same rollout on a real model; `check_all()` runs the theorem checks alone;
- `run_attention` / `AttentionConfig`: attention per document as the gold item moves, with accuracy and rollout;
- `run_shifting` / `ShiftingConfig`: token and thought shifting (where the answer leaves the advantageous one);
- `run_prior` / `PriorConfig`: the positional attention prior per slot (what `calib:DIR` calibrates with).
"""

from .analysis.attention import AttentionConfig as AttentionConfig
from .analysis.attention import AttentionResult as AttentionResult
from .analysis.attention import run_attention as run_attention
from .analysis.checks import check_all as check_all
from .analysis.prior import PriorConfig as PriorConfig
from .analysis.prior import PriorResult as PriorResult
from .analysis.prior import run_prior as run_prior
from .analysis.shifting import ShiftingConfig as ShiftingConfig
from .analysis.shifting import ShiftingResult as ShiftingResult
from .analysis.shifting import run_shifting as run_shifting
from .analysis.theory import RealRollout as RealRollout
from .analysis.theory import TheoryConfig as TheoryConfig
from .analysis.theory import TheoryResult as TheoryResult
from .analysis.theory import run_theory as run_theory

__all__ = ["AttentionConfig", "AttentionResult", "PriorConfig", "PriorResult", "RealRollout", "ShiftingConfig",
           "ShiftingResult", "TheoryConfig", "TheoryResult", "check_all", "run_attention", "run_prior", "run_shifting",
           "run_theory"]
