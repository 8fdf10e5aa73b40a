"""Plain model directories for engines that read no GGUF package (vLLM, llama.cpp aside): `export_model` writes one
where the user asks, `engine_dir` finds or makes one in posbias's cache for `vllm:NAME`."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import PosbiasError
from ..outdir import check_out_dir
from .dtype import choose_dtype
from .gguf_cache import READY, gguf_cache_dir
from .load import _locate, load_model


def engine_dir(name: str, dtype: str = "auto", progress: bool = True) -> str:
    """A plain model directory of `name` for an engine that reads no GGUF package (vLLM): a model directory or a hub
    id as it is; a registered name or a .gguf file de-quantized once into posbias's cache (the directory an in-process
    load of it caches, reused), or, with caching off, exported to a temporary directory."""
    src, gguf, _ = _locate(name)
    if not gguf:
        return src
    dtype, _ = choose_dtype(dtype, "cuda" if torch.cuda.is_available() else "cpu")
    cached = gguf_cache_dir(src, gguf, dtype)
    if cached is None:  # POSBIAS_NO_CACHE: a private export, gone with the machine's temporary files
        import tempfile

        return str(export_model(name, Path(tempfile.mkdtemp(prefix="posbias-export-")) / "model", dtype))
    if not (cached / READY).exists():
        load_model(name, dtype, "cpu", progress)  # de-quantizes the GGUF file once and writes the cache
    if not (cached / READY).exists():
        raise PosbiasError(f"could not write the plain model directory of '{name}' into {cached.parent}",
                           f"set POSBIAS_CACHE_DIR to a writable folder, or run `posbias export {name} DIR` and pass "
                           "vllm:DIR")
    return str(cached)


def export_model(name: str, out: str | Path, dtype: str = "auto") -> Path:
    """Write a model posbias loads (a registered name, a .gguf, ...) as a plain model directory that any engine
    serves (vLLM does not read our GGUF packages): weights, config, generation config and tokenizer."""
    out = Path(out)
    check_out_dir(out)  # a file, or a place that takes no files: refused before the model loads
    if out.exists() and any(out.iterdir()):
        raise PosbiasError(f"{out} exists and is not empty", "pass a new directory")
    loaded = load_model(name, dtype, "cpu", progress=False)
    loaded.model.save_pretrained(out)
    loaded.tokenizer.save_pretrained(out)
    return out
