"""MoICE training (Lin et al. 2024): per-head routers that mix attention over several RoPE bases, trained with
the model frozen. The model-side hook is models/moice.py, the method that applies trained routers
methods/moice.py (`moice:DIR`); this package trains them: config.py (presets), train.py."""

from .config import PRESETS, MoICEConfig
from .train import MoICEResult, train_moice

__all__ = ["PRESETS", "MoICEConfig", "MoICEResult", "train_moice"]
