"""The measuring core below `run_sweep`: the names a script or the command line needs beside the top level.

- `Scorer` scores prompts on a model (what a sweep runs per batch), `ENGINES` the scoring protocols it can use
  (`register_engine`: an Engine subclass, e.g. of posbias.scoring.engines.Generate, under a new `engine=` name);
- `register_model(name, locate, description)`: a model name `model=` takes (`posbias.MODELS`, `posbias models`);
- `parse_spec` / `ModelSpec` / `split_models`: model specs (`openai:model=NAME,base_url=URL,tokenizer=DIR`) and comma
  lists of them; `split_specs`: a comma list of method specs; `Backend`: what runs a model (docs/backends.md), and
  the backend protocol: `register_backend` (a Backend class openable as `NAME:...`; a taken name is refused),
  `ServedBackend` (the base of served engines), `Capabilities`, `Request` and `Reply`; `DIALECTS` the server families
  an OpenAI-compatible backend speaks (`dialect=`, or detected from GET /models), `register_dialect` one more;
- `resolve_positions(spec, n_slots)`: a positions spec ("all", "0,5,9", "0%,50%,100%") as a sorted slot list;
- `JSONL_SCHEMA` / `ORDER_SCHEMAS`: the formats of your own data (`task="jsonl:PATH"`, `judge:PATH`, `mc:PATH`);
- `COLLAPSE_MARGIN`: `run_compare`'s default collapse guard;
- `export_model`: a model posbias loads, written as a plain Hugging Face directory an engine serves;
- `choose_dtype(dtype, device)` -> (bf16 | fp32, why): what `dtype="auto"` (the default) takes on this machine (bf16
  where the CPU or GPU computes it natively, else fp32), `cpu_kind()` what it read of the CPU, `dtype_note` the line
  the CLI prints;
- `field_docs(Config)`: each field's meaning, as the config's docstring states it (the CLI's option help);
- `set_threads` (honours POSBIAS_THREADS) and `is_main_process` (rank 0 under `accelerate launch`);
- `show_prompt(task, position, example)` -> `ShownPrompt`: one row's prompt exactly as the model receives it (chat
  template, system turn, answer prefix), where its gold item sits and its token count (`posbias show`);
  `show_prompts(task, positions, example)` one per placement a positions spec names ("all", "0,4,9");
- slot policies (docs/rag.md): `read_policy` (a policy file, a finished sweep folder or its sweep.json),
  `policy_from_sweep` (a sweep record's), `check_policy` (refuses another model, task shape or slot count),
  `write_policy`, `apply_ranking(best_first, ranking)` (items placed, the best into the best-read slot) and
  `resampled_ranking(policy, m)` (the curve mapped to m slots by relative depth), `ranking_note(policy)` (a warning
  when the curve's position-effect test finds no difference between the slots, p >= 0.05: the ranking is noise).
"""

from .backends import Backend as Backend
from .backends import Capabilities as Capabilities
from .backends import ModelSpec as ModelSpec
from .backends import Reply as Reply
from .backends import Request as Request
from .backends import ServedBackend as ServedBackend
from .backends import parse_spec as parse_spec
from .backends import register_backend as register_backend
from .backends import split_models as split_models
from .backends.dialects import DIALECTS as DIALECTS
from .backends.dialects import register_dialect as register_dialect
from .eval.compare import COLLAPSE_MARGIN as COLLAPSE_MARGIN
from .eval.config import field_docs as field_docs
from .eval.show import ShownPrompt as ShownPrompt
from .eval.show import show_prompt as show_prompt
from .eval.show import show_prompts as show_prompts
from .methods import split_specs as split_specs
from .models.dtype import choose_dtype as choose_dtype
from .models.dtype import cpu_kind as cpu_kind
from .models.dtype import dtype_note as dtype_note
from .models.export import export_model as export_model
from .models.load import register_model as register_model
from .models.load import set_threads as set_threads
from .policy import apply_ranking as apply_ranking
from .policy import check_policy as check_policy
from .policy import policy_from_sweep as policy_from_sweep
from .policy import ranking_note as ranking_note
from .policy import read_policy as read_policy
from .policy import resampled_ranking as resampled_ranking
from .policy import write_policy as write_policy
from .runs import is_main_process as is_main_process
from .scoring.engines import ENGINES as ENGINES
from .scoring.engines import register_engine as register_engine
from .scoring.scorer import Scorer as Scorer
from .tasks import JSONL_SCHEMA as JSONL_SCHEMA
from .tasks import ORDER_SCHEMAS as ORDER_SCHEMAS
from .tasks import resolve_positions as resolve_positions

__all__ = ["Backend", "COLLAPSE_MARGIN", "Capabilities", "DIALECTS", "ENGINES", "JSONL_SCHEMA", "ModelSpec", "ORDER_SCHEMAS",
           "Reply", "Request", "Scorer", "ServedBackend", "ShownPrompt", "register_backend", "register_dialect",
           "register_engine", "register_model",
           "apply_ranking", "check_policy", "choose_dtype", "cpu_kind", "dtype_note", "export_model", "field_docs", "is_main_process", "parse_spec",
           "policy_from_sweep", "ranking_note", "read_policy", "resampled_ranking", "resolve_positions", "set_threads", "show_prompt", "show_prompts",
           "split_models", "split_specs", "write_policy"]
