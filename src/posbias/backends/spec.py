"""Model specs, parsed once for the CLI and the Python API alike (lm-evaluation-harness's model_args habit).

    smollm2-135m | DIR | FILE.gguf | hub-id      in process (hf), as before
    hf:DIR                                        the same, spelled out
    vllm:DIR,tensor_parallel_size=2,max_model_len=4096     vLLM's offline engine; every key goes to vllm.LLM
    vllm:smollm2-135m                             the same on a registered name's weights (de-quantized once, cached)
    openai:model=NAME,base_url=http://127.0.0.1:8000/v1,tokenizer=DIR     an OpenAI-compatible server

The pairs are read by posbias/specs.py, the parser method and task specs use too; values are ints, floats,
true/false or strings, and no key takes a list. A served backend's API key is read from the environment variable
named by `api_key_env` (default OPENAI_API_KEY) and is never written to disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PosbiasError
from ..registry import Registry
from ..specs import guess, split_pairs
from .base import Backend, Capabilities
from .hf import HFBackend
from .openai import OpenAIBackend
from .vllm import VLLMBackend

BACKENDS = Registry("backend")  # name -> Backend class: what a spec's `NAME:` prefix opens


def register_backend(cls: type) -> type:
    """Make a Backend class openable as `NAME:model,key=value,...` (also a class decorator). A new backend is one
    file with its class and this one line; the CLI, the configs and the protocols read only its capabilities."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)) or not getattr(cls, "name", ""):
        raise PosbiasError(f"register_backend takes a Backend subclass with a name, got {cls!r}",
                           "subclass posbias.backends.Backend (or ServedBackend) and set `name`")
    return BACKENDS.add(cls.name, cls)


for _cls in (HFBackend, VLLMBackend, OpenAIBackend):
    register_backend(_cls)


@dataclass(frozen=True)
class ModelSpec:
    backend: str  # a key of BACKENDS
    args: dict = field(default_factory=dict)  # "model" first, then the backend's own keys
    text: str = field(default="", compare=False)  # the spec as written

    @property
    def identity(self) -> str:
        """The spec less the keys that only say how requests travel (the backend's TRANSPORT: timeout, retries,
        concurrency, ...): what makes two runs' rows comparable, so a resume may change the others."""
        if self.backend == "hf":
            return self.text or str(self.args["model"])  # as in-process runs always recorded it
        keep = [f"{k}={v}" for k, v in self.args.items() if k != "model" and k not in self.cls.TRANSPORT]
        return ",".join([f"{self.backend}:{self.args['model']}", *keep])

    @property
    def label(self) -> str:
        """A short name for tables and progress bars: the spec as written in process, else BACKEND:MODEL (a
        path's last part)."""
        if self.backend == "hf":
            return self.text or str(self.args["model"])
        return f"{self.backend}:{str(self.args['model']).rstrip('/').rsplit('/', 1)[-1]}"

    @property
    def cls(self) -> type:
        return BACKENDS[self.backend]

    @property
    def caps(self) -> Capabilities:
        return self.cls.capabilities(self.args)


def parse_spec(spec: str) -> ModelSpec:
    """`BACKEND:model,key=value,...` (or a plain in-process model name / path) -> ModelSpec; unknown backends (a
    `NAME:` head that is no registered backend, where the spec is no existing path), malformed pairs and keys a
    backend does not take are refused in one line."""
    head, sep, rest = spec.partition(":")
    if sep and head.isidentifier() and head not in BACKENDS and not Path(spec).expanduser().exists():
        raise PosbiasError(f"unknown backend '{head}' in model spec '{spec}' (nor is it a file or folder)",
                           f"name one of the backends: {', '.join(BACKENDS)} (`posbias backends`), as NAME:MODEL,..., "
                           "or pass a registered model name (`posbias models`), a model directory or a .gguf file")
    if not sep or head not in BACKENDS:  # a registered name, a path, a hub id: in process
        return ModelSpec("hf", {"model": spec}, spec)
    cls = BACKENDS[head]
    fix = f"write it as {head}:MODEL,key=value,... (see `posbias backends`)"
    model, pairs = split_pairs(rest, f"model spec '{spec}'", fix, head=True)  # the first item may name the model
    args: dict = {} if model is None else {"model": model}
    for k, raw in pairs.items():
        if len(raw) > 1:  # no backend key takes a list
            raise PosbiasError(f"'{raw[1]}' in model spec '{spec}' is not key=value", fix)
        args[k] = guess(raw[0])
    cls.check_args(args, spec)
    return ModelSpec(head, args, spec)


def split_models(text: str) -> list[str]:
    """A comma list of model specs, where a spec's own key=value items stay with it:
    `a,openai:model=m,base_url=U,b` -> [a, openai:model=m,base_url=U, b]."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if out and "=" in part and parse_spec(out[-1]).backend != "hf":
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def open_backend(spec: str | ModelSpec, dtype: str = "bf16", device: str = "cpu", progress: bool = True,
                 device_map: str | None = None) -> Backend:
    """Start (or load) what the spec names: the hf backend loads the model in process (models.load.load_model)."""
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    return spec.cls.open(spec.args, dtype=dtype, device=device, progress=progress, device_map=device_map)


def open_model(spec: str | ModelSpec, dtype: str = "bf16", device: str = "cpu", progress: bool = True,
               device_map: str | None = None, *, needs: str):
    """The model in process (a `Loaded`) for a pipeline that changes or reads its weights, `needs` naming it ("the
    LPES search"): every such pipeline opens its model here. A backend whose declared capabilities serve the model
    as it is (`methods` False: vLLM, an OpenAI-compatible server) is refused in one line before anything starts."""
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    if not spec.caps.methods:
        raise PosbiasError(f"{needs} changes or reads the model's weights in process, and backend '{spec.backend}' "
                           f"serves the model as it is ('{spec.text or spec.identity}')",
                           "pass a registered model name (`posbias models`), a model directory or a .gguf file; a served "
                           "model works with posbias sweep, compare and grid")
    return open_backend(spec, dtype, device, progress, device_map).loaded


def as_backend(model) -> Backend:
    """A Backend as it is; an in-process Loaded model wrapped in the hf backend."""
    return model if isinstance(model, Backend) else HFBackend(model)
