"""Configuration pieces shared by every pipeline that scores a model on a task (sweep, compare,
LPES search, distillation): which model, which task, how to score. Each validates without
loading anything, so bad input fails before a model loads or a file is written."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..backends import parse_spec
from ..errors import PosbiasError
from ..methods import Method
from ..models.load import DEVICES, DTYPES, check_device_map
from ..tasks import Task
from .engines import ENGINES
from .scorer import CHAT_MODES


@dataclass
class ModelChoice:
    model: str = "smollm2-135m"  # a registered name, a Hugging Face directory or hub id, a .gguf file, or a served model
    # spec: vllm:DIR,key=value,... | openai:model=NAME,base_url=URL,tokenizer=DIR,... (backends/spec.py)
    dtype: str = "bf16"  # bf16 | fp32
    device: str = "cpu"  # cpu | cuda | auto
    chat: str = "auto"  # use the chat template: auto (if the model has one) | on | off
    # auto: spread the model over every visible device (transformers' device_map="auto"); None: all on `device`.
    # Recorded only when set, so the configs (fingerprints) of runs without it are unchanged.
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


@dataclass
class TaskChoice:
    task: str | Task = "kv-lookup"  # kv-lookup | kv-uuid | nq | jsonl:PATH | a registered name | a Task object
    task_options: dict = field(default_factory=dict)  # facts, digits, docs, pairs, answers
    data_dir: str | None = None  # benchmark data (default ../shared/data or $POSBIAS_DATA)


@dataclass
class Scoring:
    engine: str | None = None  # teacher-forced | generate; None: the task's default
    max_new_tokens: int | None = None  # generate: token limit; None: the task's default
    batch_tokens: int = 16384  # padded tokens per batch
    max_batch: int = 32  # rows per batch at most
    prefix_sharing: bool = True  # score each example's shared prompt prefix once (eval/prefix.py); False: plain path

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
