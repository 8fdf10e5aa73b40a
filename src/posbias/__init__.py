"""posbias: measure, explain and mitigate position bias in transformer LLMs.

The public API; the command line (`posbias ...`) uses nothing else.

    import posbias

    res = posbias.run_sweep(posbias.SweepConfig(task="kv-lookup", positions="0,5,9", n=20), "runs/x")
    print(res.summary["gap"], [p["accuracy"] for p in res.per_position])

Measure: `run_sweep`, `run_compare` (several methods / models on the same examples) on a model in process or a
served one (a model spec such as `openai:model=NAME,base_url=URL,tokenizer=DIR`: `parse_spec`, `open_backend`,
`BACKENDS`; `export_model` writes a model directory an engine serves), with tasks
from the task registry (`get_task`, `register_task`, or a `Task` subclass) and training-free
methods from the method registry (`get_method`, `register_method`, or a `Method` subclass).
Mitigate: `run_search` (LPES), `run_hidden_search` (the positional hidden channel), `run_distill` (Pos2Distill and
its SFT / SeqKD baselines), with
presets as library objects (`SearchConfig.from_preset`, `DistillConfig.from_preset`).
Explain: `run_theory` (rollout figures, theorem checks, a real model's rollout), `run_attention` (attention
per document by gold position, with accuracy and rollout beside it), `run_shifting`
(perplexity of the advantageous response at the other placements: token vs thought shifting) and the synthetic
experiments (`synth_grid_runs`, `run_synth_grid`, `synth_run_config`, `run_synth_one`).
Every pipeline writes one output folder (create / resume / overwrite, result file written last)
and returns a typed result: `record` (that file's content), `rows` (tidy rows, one flat dict each) and `format()`
(the text the command line prints).
"""

from .analysis.attention import AttentionConfig, AttentionResult, format_attention, run_attention  # noqa: E402
from .analysis.checks import check_all  # noqa: E402
from .analysis.checks import format_summary as format_theory_summary
from .analysis.rollout_real import format_real as format_real_rollout  # noqa: E402
from .analysis.shifting import ShiftingConfig, ShiftingResult, format_shifting, run_shifting  # noqa: E402
from .analysis.theory import RealRollout, TheoryConfig, TheoryResult, run_theory  # noqa: E402
from .backends import BACKENDS, Backend, ModelSpec, open_backend, parse_spec, split_models  # noqa: E402
from .core.ga import GAConfig  # noqa: E402
from .errors import PosbiasError  # noqa: E402
from .analysis.prior import PriorConfig, PriorResult, format_prior, run_prior  # noqa: E402
from .eval.compare import COLLAPSE_MARGIN, CompareResult, format_compare, run_compare  # noqa: E402
from .eval.engines import ENGINES  # noqa: E402
from .eval.grid import GridConfig, GridResult, format_grid, run_grid  # noqa: E402
from .eval.length_gain import format_length_gain, run_length_gain  # noqa: E402
from .eval.scorer import Scorer  # noqa: E402
from .eval.sweep import SweepConfig, SweepResult, format_table, run_sweep  # noqa: E402
from .methods import (  # noqa: E402
    LPES,
    METHODS,
    Active,
    Baseline,
    Buckets,
    HiddenScale,
    LayerScaling,
    Method,
    MoICE,
    MsPoE,
    UniformScaling,
    get_method,
    register_method,
    split_specs,
)
from .mitigate.hidden import PRESETS as HIDDEN_PRESETS  # noqa: E402
from .mitigate.hidden import HiddenSearchConfig, HiddenSearchResult, run_hidden_search  # noqa: E402
from .mitigate.lpes import PRESETS as LPES_PRESETS  # noqa: E402
from .mitigate.lpes import SPACES as LPES_SPACES  # noqa: E402
from .mitigate.lpes import LPESResult, SearchConfig, run_search  # noqa: E402
from .mitigate.moice import PRESETS as MOICE_PRESETS  # noqa: E402
from .mitigate.moice import MoICEConfig, MoICEResult, train_moice  # noqa: E402
from .mitigate.pos2distill import ABLATIONS as DISTILL_ABLATIONS  # noqa: E402
from .mitigate.pos2distill import METHODS as DISTILL_METHODS  # noqa: E402
from .mitigate.pos2distill import PRESETS as DISTILL_PRESETS  # noqa: E402
from .mitigate.pos2distill import DistillConfig, DistillResult, run_distill  # noqa: E402
from .models.load import REGISTRY as MODELS  # noqa: E402
from .models.load import Loaded, export_model, load_model, set_threads, wrap_model  # noqa: E402
from .report.html import ReportResult, build_report  # noqa: E402
from .runs import is_main_process  # noqa: E402
from .synth import GRIDS as SYNTH_GRIDS  # noqa: E402
from .synth import PRESETS as SYNTH_PRESETS  # noqa: E402
from .synth import GridResult as SynthGridResult  # noqa: E402
from .synth import RunResult as SynthRunResult  # noqa: E402
from .synth import format_run as format_synth_run  # noqa: E402
from .synth import format_summary as format_synth_summary  # noqa: E402
from .synth import grid_runs as synth_grid_runs  # noqa: E402
from .synth import one_run_config as synth_run_config  # noqa: E402
from .synth import run_grid as run_synth_grid  # noqa: E402
from .synth import run_single as run_synth_one  # noqa: E402
from .tasks import JSONL_SCHEMA, ORDER_SCHEMAS, TASKS, Prompt, Task, get_task, register_task, resolve_positions  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    "BACKENDS", "Backend", "ModelSpec", "open_backend", "parse_spec", "split_models", "export_model",
    "DISTILL_ABLATIONS", "DISTILL_METHODS", "DISTILL_PRESETS", "ENGINES", "JSONL_SCHEMA", "LPES", "ORDER_SCHEMAS", "LPES_PRESETS",
    "LPES_SPACES", "METHODS", "MODELS", "SYNTH_GRIDS", "SYNTH_PRESETS", "TASKS",
    "COLLAPSE_MARGIN", "PriorConfig", "PriorResult", "format_prior", "run_prior", "Active", "Baseline", "Buckets", "CompareResult", "DistillConfig", "DistillResult", "GAConfig", "LPESResult",
    "LayerScaling", "Loaded", "Method", "MsPoE", "PosbiasError", "Prompt", "RealRollout", "Scorer", "SearchConfig",
    "ShiftingConfig", "ShiftingResult", "format_shifting", "run_shifting",
    "ReportResult", "build_report",
    "AttentionConfig", "AttentionResult", "format_attention", "run_attention",
    "SweepConfig", "SweepResult", "SynthGridResult", "SynthRunResult", "Task", "TheoryConfig", "TheoryResult",
    "UniformScaling",
    "GridConfig", "GridResult", "format_grid", "run_grid",
    "MOICE_PRESETS", "MoICE", "MoICEConfig", "MoICEResult", "train_moice",
    "__version__", "check_all", "format_compare", "format_length_gain", "run_length_gain", "format_real_rollout",
    "format_synth_run", "format_synth_summary",
    "format_table", "format_theory_summary", "get_method", "get_task", "load_model", "register_method",
    "register_task", "resolve_positions", "run_compare", "run_distill", "run_search", "run_sweep", "run_synth_grid",
    "run_synth_one", "run_theory", "set_threads", "wrap_model", "split_specs", "synth_grid_runs", "synth_run_config",
    "is_main_process",
    "HIDDEN_PRESETS", "HiddenScale", "HiddenSearchConfig", "HiddenSearchResult", "run_hidden_search",
]
