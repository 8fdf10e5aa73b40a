"""Configuration pieces shared by every pipeline that scores a model on a task (sweep, compare,
LPES search, distillation): which model, which task, how to score. Each validates without
loading anything, so bad input fails before a model loads or a file is written."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..backends import parse_spec
from ..errors import PosbiasError
from ..methods import Method
from ..models.load import DEVICES, DTYPES, check_device_map
from ..tasks import Task, split_task
from .engines import ENGINES
from .scorer import CHAT_MODES


@dataclass
class ModelChoice:
    """Which model, and how it is loaded.

    model: a registered name (`posbias.MODELS`), a Hugging Face directory or hub id, a .gguf file, or a served
        model spec `vllm:DIR,key=value,...` | `openai:model=NAME,base_url=URL,tokenizer=DIR,...` (docs/backends.md).
        With `loaded=` the loaded model is used and its name recorded instead.
    dtype: bf16 | fp32.
    device: cpu | cuda | auto.
    chat: use the model's chat template: auto (if it has one) | on | off.
    device_map: auto spreads the model over every visible device (transformers' device_map="auto"); None: all on
        `device`. Recorded only when set, so the fingerprints of runs without it are unchanged.
    """

    model: str = "smollm2-135m"
    dtype: str = "bf16"
    device: str = "cpu"
    chat: str = "auto"
    device_map: str | None = field(default=None, metadata={"record": "if set"})

    def _validate_model(self) -> None:
        if self.dtype not in DTYPES:
            raise PosbiasError(f"unknown dtype '{self.dtype}'", f"use `dtype` {' or '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise PosbiasError(f"unknown device '{self.device}'", f"use `device` {', '.join(DEVICES)}")
        if self.chat not in CHAT_MODES:
            raise PosbiasError(f"unknown `chat` '{self.chat}'", "use auto, on or off")
        check_device_map(self.device_map)
        if isinstance(self.model, str):
            parse_spec(self.model)  # a malformed model spec fails here

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

    task: kv-lookup | kv-uuid | nq | jsonl:PATH | any registered name (`posbias.TASKS`) | a Task object.
    task_options: the task's size and variants, e.g. {"facts": 20} (kv-lookup: facts, digits; nq: docs, answers;
        two-hop: pairs, style / prompt); `posbias tasks` lists each task's options.
    data_dir: where benchmark data is read (default ../shared/data or $POSBIAS_DATA).
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


@dataclass
class Scoring:
    """How rows are scored.

    engine: teacher-forced | generate; None: the task's default.
    max_new_tokens: generate's token limit; None: the task's default.
    batch_tokens: padded tokens per batch.
    max_batch: rows per batch at most.
    prefix_sharing: score each example's shared prompt prefix once and continue every slot from its cache
        (eval/prefix.py; docs/sweep.md, "Prefix sharing"); False: the plain path, every prompt from scratch.
    """

    engine: str | None = None
    max_new_tokens: int | None = None
    batch_tokens: int = 16384
    max_batch: int = 32
    prefix_sharing: bool = True

    def _validate_scoring(self) -> None:
        if self.engine is not None and self.engine not in ENGINES:
            raise PosbiasError(f"unknown engine '{self.engine}'", f"use `engine` {' or '.join(ENGINES)}")
        if self.max_new_tokens is not None and self.engine == "teacher-forced":
            raise PosbiasError("`max_new_tokens` limits generation, and `engine=teacher-forced` generates nothing",
                               "drop `max_new_tokens`, or pass `engine=generate`")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise PosbiasError(f"`max_new_tokens` must be at least 1, got {self.max_new_tokens}",
                               "pass `max_new_tokens=16` or so")
        if self.batch_tokens < 1 or self.max_batch < 1:
            raise PosbiasError("`batch_tokens` and `max_batch` must be at least 1", "pass positive batch sizes")


def check_split(n: int, skip: int) -> None:
    if n < 1:
        raise PosbiasError(f"`n` must be at least 1, got {n}", "use `n=1` or more")
    if skip < 0:
        raise PosbiasError(f"`skip` must be >= 0, got {skip}", "use `skip=0` or more")


def plain(value: Any) -> Any:
    """A config value as JSON: a Task by its name, a Method by its spec (or label)."""
    if isinstance(value, Task):
        return value.name
    if isinstance(value, Method):
        return value.key
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


def config_dict(cfg) -> dict:
    """A dataclass config as a JSON-able dict (field order kept; a field marked record="if set" only when not None)."""
    return {f.name: plain(getattr(cfg, f.name)) for f in fields(cfg)
            if not (f.metadata.get("record") == "if set" and getattr(cfg, f.name) is None)}
