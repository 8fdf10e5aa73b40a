"""Configuration pieces shared by every pipeline that scores a model on a task (sweep, compare,
LPES search, distillation): which model, which task, how to score. Each validates without
loading anything, so bad input fails before a model loads or a file is written."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..backends import ModelSpec, parse_spec
from ..errors import PosbiasError
from ..models.dtype import DTYPE_CHOICES
from ..models.load import DEFAULT_MODEL, DEVICES, check_device_map
from ..scoring.encode import BATCH_TOKENS, MAX_BATCH
from ..scoring.engines import ENGINES
from ..scoring.scorer import CHAT_MODES, PREFIX_ATTENTION
from ..specs import doc_entries
from ..tasks import Task, check_data, split_task


@dataclass
class ModelChoice:
    """Which model, and how it is loaded. A model passed to a run as `loaded=` replaces `model` (the run records
    its name, dtype and device instead: `bound_to`).

    model: a registered name (`posbias models` lists them), a Hugging Face directory or hub id, a .gguf file, or a
        served model spec vllm:DIR,key=value,... | openai:model=NAME,base_url=URL,tokenizer=DIR,... (`posbias
        backends`; docs/backends.md).
    dtype: auto (bf16 where the device computes it natively: a CPU with AVX-512-BF16, AMX or ARM BF16, a CUDA GPU
        with bf16; else fp32; the run records the choice and why) | bf16 | fp32.
    device: cpu | cuda | auto (cuda if visible).
    chat: use the model's chat template: auto (if it has one) | on | off.
    device_map: auto: spread the model over every visible device in one process (transformers' device_map="auto";
        device is then not used); None: all on device.
    """

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: str = "cpu"
    chat: str = "auto"
    device_map: str | None = field(default=None, metadata={"record": "if set"})  # recorded only when set: the
    # fingerprints of runs without it are unchanged

    @property
    def spec(self) -> ModelSpec:
        """The model spec, parsed (backends/spec.py) once per model string: what the pipelines open and record
        (`identity`, `label`)."""
        parsed = self.__dict__.get("_spec")  # not a field: replace() and to_dict() never see it
        if parsed is None or parsed.text != self.model:
            parsed = self.__dict__["_spec"] = parse_spec(self.model)
        return parsed

    def _validate_model(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise PosbiasError(f"unknown dtype '{self.dtype}'", f"use `dtype` {', '.join(DTYPE_CHOICES)}")
        if self.device not in DEVICES:
            raise PosbiasError(f"unknown device '{self.device}'", f"use `device` {', '.join(DEVICES)}")
        if self.chat not in CHAT_MODES:
            raise PosbiasError(f"unknown `chat` '{self.chat}'", "use auto, on or off")
        check_device_map(self.device_map)
        if isinstance(self.model, str):
            self.spec  # a malformed model spec fails here  # noqa: B018

    def bound_to(self, info: dict):
        """This config with the model, dtype and device of a model given as `loaded=` (what the run records and
        its titles show). A dtype or device set to something other than its default that the loaded model
        contradicts is refused; left at its default, the loaded model's value wins."""
        defaults = {f.name: f.default for f in fields(ModelChoice)}
        have = {"dtype": info.get("dtype"), "device": str(info.get("device") or "")}
        for key in ("dtype", "device"):
            asked = getattr(self, key)
            if asked == defaults[key] or not have[key] or asked == "auto" or have[key].split(":")[0] == asked:
                continue
            raise PosbiasError(f"`{key}={asked}` contradicts the loaded model, which is {key} {have[key]}",
                               f"drop `{key}` (the loaded model's is used), or load the model with {key} {asked}")
        device = have["device"].split(":")[0]
        device = device if self.device == defaults["device"] and device in DEVICES else self.device  # auto stays auto
        return replace(self, model=info.get("name", self.model), dtype=have["dtype"] or self.dtype, device=device)


@dataclass
class TaskChoice:
    """Which task.

    task: a registered task, with its argument if it takes one (jsonl:PATH), or a Task object; `posbias tasks`
        lists them and their options.
    task_options: the task's size and variants, e.g. {"facts": 20} (kv-lookup: facts, digits; kv-uuid: pairs; nq: docs,
        answers; kv-2hop: facts, digits, style; musique: docs, prompt); `posbias tasks` lists each task's options.
    data_dir: a folder holding the benchmark data sets (`nq/...`, `kv/...`, `musique/...`); None: $POSBIAS_DATA, else
        the user cache `posbias data fetch` fills, else a development checkout's ../shared/data (docs/data.md).
    """

    task: str | Task = "kv-lookup"
    task_options: dict = field(default_factory=dict)
    data_dir: str | None = None

    def _validate_task(self) -> None:
        """A spec with key=value options (`kv-lookup:facts=30`) becomes the form a run records: the task as `name` or
        `name:PATH`, its options in task_options (the same fingerprint as `task_options={"facts": 30}`); a key given
        both ways with different values is refused."""
        if isinstance(self.task, str):
            self.task, self.task_options = split_task(self.task, self.task_options)
            check_data(self.task, self.task_options, self.data_dir)  # missing data refused before a model loads


@dataclass
class Scoring:
    """How rows are scored.

    engine: how answers are scored (`posbias.ENGINES`); None: the task's default.
    max_new_tokens: generate: the token limit; None: the task's default.
    batch_tokens: padded tokens per batch.
    max_batch: rows per batch at most.
    prefix_sharing: score each example's shared prompt prefix once and continue every slot from its cache
        (docs/sweep.md); False: the plain path, every prompt from scratch.
    prefix_attention: how the prefix-shared path's branches attend to their spine: "split" (a batch of rows that
        continue one spine reads its keys where they lie and its own causally, two attentions merged; batches from
        several spines copy: docs/sweep.md, "Split attention"), "copy" (the spine's keys copied into each branch
        batch, one masked attention); unset: split where it runs and keeps verdicts (fp32 on a CPU,
        full attention in every layer), else copy. The run records which ran.
    """

    engine: str | None = None
    max_new_tokens: int | None = None
    batch_tokens: int = BATCH_TOKENS
    max_batch: int = MAX_BATCH
    prefix_sharing: bool = True
    prefix_attention: str | None = field(default=None, metadata={"record": "if set"})  # recorded only when set

    def prefix(self) -> bool | str:
        """The Scorer's `prefix_sharing` argument: False, True, or the attention asked for ("split", "copy")."""
        return (self.prefix_attention or True) if self.prefix_sharing else False

    def _validate_scoring(self) -> None:
        if self.prefix_attention not in (None, *PREFIX_ATTENTION):
            raise PosbiasError(f"unknown prefix_attention '{self.prefix_attention}'",
                               f"use `prefix_attention` {' or '.join(PREFIX_ATTENTION)}, or leave it unset")
        if self.engine is not None and self.engine not in ENGINES:
            raise PosbiasError(f"unknown engine '{self.engine}'", f"use `engine` {' or '.join(ENGINES)}")
        if self.max_new_tokens is not None and self.engine is not None and ENGINES[self.engine].kind == "teacher-forced":
            raise PosbiasError("`max_new_tokens` limits generation, and `engine=teacher-forced` generates nothing",
                               "drop `max_new_tokens`, or pass `engine=generate`")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise PosbiasError(f"`max_new_tokens` must be at least 1, got {self.max_new_tokens}",
                               "pass `max_new_tokens=16` or so")
        if self.batch_tokens < 1 or self.max_batch < 1:
            raise PosbiasError("`batch_tokens` and `max_batch` must be at least 1", "pass positive batch sizes")


NOT_RECORDED = {"record": "never"}  # a field that never enters to_dict(): not in the recorded config, nor the fingerprint


@dataclass
class Cost:
    """What a run may cost (eval/cost.py; docs/backends.md, "Cost and budget"). Not part of the run's fingerprint: a
    resume may change them (a larger budget).

    price_in: USD per 1M prompt tokens (with `price_out`): the cost estimate and what the run spent, in dollars.
    price_out: USD per 1M completion tokens.
    budget: USD the run may spend (needs the prices): before each further piece of work (served: a window of rows,
        the requests the backend keeps in flight; in process: a batch) the spent cost plus the piece's estimate must
        stay within it, else the run stops, every scored row kept (resume it with a larger budget). None: no limit.
    """

    price_in: float | None = field(default=None, metadata=NOT_RECORDED)
    price_out: float | None = field(default=None, metadata=NOT_RECORDED)
    budget: float | None = field(default=None, metadata=NOT_RECORDED)

    def _validate_cost(self) -> None:
        for name in ("price_in", "price_out", "budget"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not (isinstance(v, (int, float)) and 0 <= v < float("inf"))):
                raise PosbiasError(f"`{name}` must be a number of US dollars of at least 0, got {v}",
                                   f"pass e.g. `{name}={'1.0' if name == 'budget' else '0.15'}`")
        if (self.price_in is None) != (self.price_out is None):
            given, missing = ("price_in", "price_out") if self.price_out is None else ("price_out", "price_in")
            raise PosbiasError(f"`{given}` without `{missing}`", f"pass both (USD per 1M prompt / completion tokens), "
                               f"e.g. `{missing}=0`")
        if self.budget is not None and self.price_in is None:
            raise PosbiasError("a `budget` needs the prices to count dollars", "pass `price_in` and `price_out` (USD per "
                               "1M prompt / completion tokens)")


def spec_identity(model: Any) -> Any:
    """What a run records (and a resume compares) for a model: the spec less its transport keys (timeout, retries,
    concurrency, ...: `ModelSpec.identity`); an in-process spec, or a name no spec parses, as it is."""
    return _spec_part(model, "identity")


def spec_label(model: Any) -> Any:
    """A model's short name for titles, tables and progress bars (`openai:smollm2`; `ModelSpec.label`); an
    in-process spec, or a name no spec parses, as it is."""
    return _spec_part(model, "label")


def _spec_part(model: Any, part: str) -> Any:
    if not isinstance(model, str):
        return model
    try:
        return getattr(parse_spec(model), part)
    except PosbiasError:  # a loaded model's name (`loaded=`) need not be a spec
        return model


def check_split(n: int, skip: int) -> None:
    if n < 1:
        raise PosbiasError(f"`n` must be at least 1, got {n}", "use `n=1` or more")
    if skip < 0:
        raise PosbiasError(f"`skip` must be >= 0, got {skip}", "use `skip=0` or more")


def jsonable(value: Any) -> Any:
    """A config value as JSON: a Task by its name, a Method by its spec (or label)."""
    if hasattr(value, "as_plain"):  # a Task by its name, a Method by its spec
        return value.as_plain()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


def config_dict(cfg) -> dict:
    """A dataclass config as a JSON-able dict (field order kept; a field marked record="if set" only when not None,
    one marked record="never" (NOT_RECORDED: the `Cost` fields) never)."""
    return {f.name: jsonable(getattr(cfg, f.name)) for f in fields(cfg) if f.metadata.get("record") != "never"
            and not (f.metadata.get("record") == "if set" and getattr(cfg, f.name) is None)}


def field_docs(cls: type) -> dict[str, str]:
    """{field: what it means} for a config dataclass, from the `name: text` entries of its docstring and its
    bases' (a field a mixin declares is documented there; the class nearest in the MRO that documents a field
    wins, and an entry "see `Base`" defers to the base). Fields in dataclass order; one without an entry is
    left out (tests/test_cli_help.py requires one for every field of every public config). The CLI's help for
    an option that sets a field is this text."""
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        for names, text in doc_entries(klass):
            if not text.startswith("see `"):
                for name in names:
                    docs.setdefault(name, text)
    return {f.name: docs[f.name] for f in fields(cls) if f.name in docs}
