"""posbias: measure, explain and mitigate position bias in transformer LLMs.

The public API (docs/python-api.md); the command line (`posbias ...`) uses nothing else.

    import posbias

    res = posbias.run_sweep(posbias.SweepConfig(task="kv-lookup", positions=[0, 5, 9], n=20), "runs/x")
    print(res.format())  # the table `posbias sweep` prints; res.record is sweep.json, res.rows one dict per row

Measure, at the top level: `run_sweep`, `run_compare` (several methods / models on the same examples) and `run_grid`
(depth x length), each with its config and typed result; models (`load_model`, `wrap_model`, `MODELS`, or a served
one through `open_backend` and `BACKENDS`); tasks (`get_task`, `register_task`, `TASKS`, a `Task` subclass building
`Prompt`s); training-free methods (`get_method`, `register_method`, `METHODS`, a `Method` subclass yielding an
`Active`); `build_report` (one HTML page from finished runs). Other packages add tasks, methods, backends, model
names, scoring engines and server dialects as plugins (entry-point group "posbias", loaded on import:
posbias/plugins.py; `PLUGINS` names those loaded); `posbias.measure` has `register_backend`, `register_model`,
`register_engine` and `register_dialect`, registering as register_task and register_method do (a taken name refused).

Sub-namespaces, each a pipeline's config, run function, result and presets under short names:
`posbias.lpes` (the LPES search), `posbias.hidden` (the positional hidden-channel search), `posbias.moice` (MoICE
router training), `posbias.distill` (Pos2Distill and its baselines), `posbias.explain` (theory, attention per
document, token shifting, the positional prior), `posbias.synth` (the synthetic experiments), and `posbias.measure`
(the measuring core's building blocks: the Scorer, spec parsing, data schemas, model export).

Every pipeline writes one output folder (create / resume / overwrite, result file written last) and returns a typed
result: `.record` (that file's content), `.rows` (tidy rows, one flat dict each) and `.format()` (the printed text).
"""

from . import distill as distill
from . import explain as explain
from . import hidden as hidden
from . import lpes as lpes
from . import measure as measure
from . import moice as moice
from . import synth as synth
from .backends import BACKENDS as BACKENDS
from .backends import open_backend as open_backend
from .errors import PosbiasError as PosbiasError
from .eval.compare import CompareResult as CompareResult
from .eval.compare import run_compare as run_compare
from .eval.grid import GridConfig as GridConfig
from .eval.grid import GridResult as GridResult
from .eval.grid import run_grid as run_grid
from .eval.sweep import SweepConfig as SweepConfig
from .eval.sweep import SweepResult as SweepResult
from .eval.sweep import run_sweep as run_sweep
from .methods import METHODS as METHODS
from .methods import Active as Active
from .methods import Method as Method
from .methods import get_method as get_method
from .methods import register_method as register_method
from .models.load import MODELS as MODELS
from .models.load import Loaded as Loaded
from .models.load import load_model as load_model
from .models.load import wrap_model as wrap_model
from .report.html import ReportResult as ReportResult
from .report.html import build_report as build_report
from .tasks import TASKS as TASKS
from .tasks import Prompt as Prompt
from .tasks import Task as Task
from .tasks import get_task as get_task
from .tasks import register_task as register_task
from .plugins import PLUGINS as PLUGINS  # last: importing it loads the installed plugins, which import the names above
from .version import __version__ as __version__

__all__ = [
    # measure
    "SweepConfig", "run_sweep", "SweepResult", "run_compare", "CompareResult", "GridConfig", "run_grid", "GridResult",
    # models and backends
    "load_model", "wrap_model", "Loaded", "MODELS", "open_backend", "BACKENDS",
    # tasks and methods
    "Task", "Prompt", "get_task", "register_task", "TASKS", "Method", "Active", "get_method", "register_method", "METHODS",
    # report, errors, version, plugins
    "build_report", "ReportResult", "PosbiasError", "__version__", "PLUGINS",
    # sub-namespaces
    "lpes", "hidden", "moice", "distill", "explain", "synth", "measure",
]
