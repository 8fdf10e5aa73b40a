"""The de-quantized GGUF cache: where `load_model` keeps what a GGUF file de-quantized to, under what key, and one
process at a time writing it.

transformers reads a GGUF file's metadata three times (config, tokenizer, weights) and de-quantizes every tensor in
numpy: 26-39 s for SmolLM2-135M and 54-105 s for Gemma-3-270M on these CPUs, on every load. `shared_reads` cuts that
to one parse of the file and one tensor-name map per architecture (2.3x and 2.7x less CPU, the same tensors: see its
docstring). The first load of a file in a dtype writes what it produced (save_pretrained: the same tensors, config,
generation config and tokenizer) to a cache; later loads read that directory in 0.3 s and 5.3 s once the model's code
is imported (benchmarks/load_speed.py). The key is the file (path, size, mtime), the dtype and the transformers
release, so a new file or a new converter never reads a stale copy; tests/test_models_cache.py shows a cached load
gives the same tensors, logits, tokenizer and run record as the GGUF path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Iterator

READY = "posbias-cache-ready"  # written last: a directory without it is incomplete and is not read
CACHE_FORMAT = 1


def cache_root() -> Path | None:
    """Where posbias keeps de-quantized GGUF models: $POSBIAS_CACHE_DIR, else ~/.cache/posbias (or
    $XDG_CACHE_HOME/posbias); None when POSBIAS_NO_CACHE=1 (every load reads the GGUF file)."""
    if os.environ.get("POSBIAS_NO_CACHE", "") not in ("", "0"):
        return None
    if os.environ.get("POSBIAS_CACHE_DIR"):
        return Path(os.environ["POSBIAS_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "posbias"


def gguf_cache_dir(src: str, gguf: str | None, dtype: str) -> Path | None:
    """The cache directory of one GGUF file in one dtype (None: caching off)."""
    root = cache_root()
    if root is None or not gguf:
        return None
    import transformers

    f = (Path(src) / gguf).resolve()
    st = f.stat()
    key = f"{f}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}|{CACHE_FORMAT}"
    return root / "gguf" / f"{f.stem}-{dtype}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def library_bars(enabled: bool) -> Iterator[None]:
    """transformers' and huggingface_hub's own progress bars (writing shards, ...) on or off for a block."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not enabled:
            hf_logging.enable_progress_bar()


def write_cache(d: Path, model, tok) -> None:
    """Save into a private folder, then rename it into place (two processes converting at once both succeed, one
    copy stays). A cache that cannot be written (full disk, read-only home) is skipped: the load already succeeded."""
    tmp = d.with_name(f"{d.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        with library_bars(False):
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / READY).write_text(f"{CACHE_FORMAT}\n")
        os.rename(tmp, d)
    except Exception as e:  # best effort: a full disk, a read-only home, another process that renamed first
        logging.getLogger("posbias").info("de-quantized model not cached in %s: %s", d, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_PATCH = threading.Lock()


@contextlib.contextmanager
def shared_reads() -> Iterator[None]:
    """Within the block, transformers' GGUF loading parses each file once and builds each tensor-name map once.

    Loading a GGUF model, transformers calls load_gguf_checkpoint three times (the config, the tokenizer, the weights),
    each building a fresh gguf.GGUFReader, which parses every metadata field in Python (the vocabulary and merges:
    98,000 strings for SmolLM2, 524,000 for Gemma-3), and each converting every field's values again; its tensor-name
    mapping calls gguf.get_tensor_name_map once per submodule (397 times for SmolLM2), each building the same table.
    All are pure functions of their arguments and transformers looks them up at call time (`from gguf import ...`,
    `from ..modeling_gguf_pytorch_utils import load_gguf_checkpoint` inside its functions), so the block swaps in one
    reader per file (memory-mapped, mode "r": only read), one metadata parse per file (each caller gets its own copy
    of the top two levels of the dicts: the config, the tokenizer, the tokenizer config; the value lists below are
    read only, by one caller each) and a memoised name map, and puts the originals back after. The weights' call
    (return_tensors=True) runs as before, on the shared reader. Measured cold, each load in its own process
    (benchmarks/load_speed.py, bf16, AVX2 EPYC, 2026-11-30): SmolLM2-135M 39.3 -> 17.5 CPU s, Gemma-3-270M 104.7 -> 38.8
    CPU s, every tensor, the logits, the token ids and the run record identical; tests/test_models_cache.py checks a
    tiny GGUF file's.
    A lock keeps two threads of one process from swapping the attributes at once. Why not a converter of our own:
    transformers' mapping (tensor names, permutations, config keys) stays the one place those rules live."""
    with _PATCH:
        try:
            import gguf
            import transformers.modeling_gguf_pytorch_utils as hf_gguf

            reader, names, checkpoint = gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.load_gguf_checkpoint
        except (ImportError, AttributeError):  # another gguf or transformers release: its own path, unchanged
            yield
            return
        readers: dict = {}
        parsed: dict = {}

        def one_reader(path, mode="r"):
            if mode != "r":  # a writable map is not shared
                return reader(path, mode)
            key = os.path.realpath(path)
            if key not in readers:
                readers[key] = reader(path, mode)
            return readers[key]

        def one_parse(path, return_tensors=False, **kw):
            if return_tensors or kw:
                return checkpoint(path, return_tensors=return_tensors, **kw)
            key = os.path.realpath(path)
            if key not in parsed:
                parsed[key] = checkpoint(path)
            return {part: dict(values) for part, values in parsed[key].items()}

        gguf.GGUFReader, gguf.get_tensor_name_map = one_reader, functools.lru_cache(maxsize=None)(names)
        hf_gguf.load_gguf_checkpoint = one_parse
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.load_gguf_checkpoint = reader, names, checkpoint


@contextlib.contextmanager
def converting(d: Path | None, progress: bool = True) -> Iterator[None]:
    """Hold the cache directory d's lock while this process de-quantizes its GGUF file and writes d: another process
    about to do the same waits, then reads what this one wrote (two `posbias` commands started together on a new
    machine, a sweep beside `vllm:` export, test workers: one de-quantization, not one each). d None: no lock. Where
    no lock can be taken (no fcntl, a read-only cache, a file system without locks), each process converts on its
    own, as before."""
    f = None
    if d is not None:
        try:
            import fcntl

            d.parent.mkdir(parents=True, exist_ok=True)
            f = open(d.with_name(d.name + ".lock"), "a")
        except (ImportError, OSError):  # no lock to be had: convert without one
            pass
    if f is None:
        yield
        return
    with f:
        locked = True
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process
            if progress:
                print(f"posbias: another process is de-quantizing this model into {d.parent}; waiting for it",
                      file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some network mounts): convert without one
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(f, fcntl.LOCK_UN)
