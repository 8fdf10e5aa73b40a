#!/usr/bin/env bash
# Issue 49's GPU check: backend_speed.py's in-process paths and the raw-forward floor on a lent GPU machine (no vLLM
# there, no SmolLM2 weights: they are over the 64 MiB a call carries). Run by the device tool from the repo root with
# `.whl` (posbias's wheel, transformers 5.24.0, gguf, rank-bm25) and `.gpu/smollm2-shape` (SmolLM2's config.json and
# tokenizer files, no weights) carried; each run's output lands in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L; nproc
run() { name=$1; shift; echo "=== $name: $*"; timeout 240 python3 benchmarks/backend_speed.py --device cuda "$@" 2>&1 | tee "$OUT/$name.txt" | grep -v "^  (.*round\|^USDT" ; }
run shape-bf16 --model-dir .gpu/smollm2-shape --random-weights --rounds 5 --gpu-busy
run tiny-fp32 --model tiny --dtype fp32 --rounds 5 --gpu-busy
run shape-bf16-b256 --model-dir .gpu/smollm2-shape --random-weights --rounds 5 --gpu-busy --n 50 --max-batch 256 --batch-tokens 262144
run tiny-fp32-b256 --model tiny --dtype fp32 --rounds 5 --gpu-busy --n 50 --max-batch 256 --batch-tokens 262144
