"""posbias: measure, explain and mitigate position bias in transformer LLMs."""

__version__ = "0.1.0"

from .errors import PosbiasError  # noqa: E402
from .eval.sweep import SweepConfig, SweepResult, run_sweep  # noqa: E402
from .models.load import Loaded, load_model  # noqa: E402
from .tasks import get_task, resolve_positions  # noqa: E402

__all__ = [
    "Loaded", "PosbiasError", "SweepConfig", "SweepResult", "__version__",
    "get_task", "load_model", "resolve_positions", "run_sweep",
]
