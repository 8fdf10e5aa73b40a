"""vLLM's offline engine (`vllm:NAME`, backends/vllm.py) run for real in the vLLM venv: a registered model name is one
flag (its GGUF package de-quantized once into posbias's cache, which vLLM reads as a plain model directory), the KV
cache sized without the user's VLLM_CPU_KVCACHE_SPACE, and the rows those of the in-process sweep, near ties aside.
The engine runs with enforce_eager=true (a spec key passed through to vllm.LLM): its compiled default takes the
suite's two cores for about 95 s more before the first request (this test: 168 s against 73 s on an AVX2-only CPU,
2026-11-29) and would test vLLM's compiler, not posbias; benchmarks/backend_speed.py keeps the compiled default."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from served import VLLM_PY, vllm_missing

pytestmark = [pytest.mark.real, pytest.mark.served, pytest.mark.skipif(vllm_missing() is not None,
                                                                         reason=str(vllm_missing()))]


def test_a_registered_name_runs_on_vllms_offline_engine_in_one_flag(tmp_path, smollm2):
    from posbias import SweepConfig, run_sweep

    argv = ["sweep", "--model", "vllm:smollm2-135m,enforce_eager=true", "--facts", "6", "--positions", "0,5", "--n", "3",
            "--engine", "generate", "--quiet", "--out", str(tmp_path / "v")]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}  # the backend's default must do
    run = subprocess.run([str(VLLM_PY), "-m", "posbias.cli", *argv], env=env, capture_output=True, text=True,
                         timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "v" / "sweep.json").read_text())
    model = record["model"]
    assert (model["backend"], model["source"], model["cpu_kv_cache_gib"]) == ("vllm", "smollm2-135m", "2")
    assert model["engine_args"]["enforce_eager"] is True  # the spec's key reached vLLM as a bool
    assert (Path(model["model_dir"]) / "config.json").exists()  # the cached plain directory vLLM read
    served = {(r["example_id"], r["position"]): r for r in map(json.loads, (tmp_path / "v" / "examples.jsonl").open())}
    local = run_sweep(SweepConfig(task_options={"facts": 6}, positions="0,5", n=3, engine="generate"), loaded=smollm2,
                      progress=False)  # the session's SmolLM2 in load_model's default dtype, as a load here would be
    # the same bf16 weights, other kernels: a near tie may flip (docs/backends.md: 96.9% agreement on 1,000 rows)
    assert len(served) == len(local.rows) == 6
    assert sum(served[(r["example_id"], r["position"])]["correct"] == r["correct"] for r in local.rows) >= 5
