# Entry points: `make demo`, `make test`, and `make bench` (not run by CI). Each creates .venv if needed, installs the
# project with pinned dependencies, then runs.
#
# What gets installed is what pyproject.toml declares, nothing else: requirements-lock.txt only
# constrains versions (-c for the packages, --build-constraint for the build backend), so a
# run-time dependency missing from pyproject.toml is missing here too and the tests fail.
# A .venv made by an older recipe may hold more; `make clean` first to start from scratch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean bench bench-matcher bench-threads bench-bridge bench-models \
	bench-epilogue bench-zoo bench-serving bench-aot bench-dynamic bench-conv-chain \
	bench-conv-pairs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=25.3"

LOCK := -c requirements-lock.txt --build-constraint requirements-lock.txt

$(STAMP): $(BIN)/python pyproject.toml requirements-lock.txt
	$(BIN)/python -m pip install --quiet $(LOCK) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	cd /tmp && $(abspath $(BIN))/python -m tir_byoc.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --numprocesses=auto --maxprocesses=4 --dist=loadfile tests

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(LOCK) -e ".[dev,bench]"
	touch $(BENCH_STAMP)

# Every implementation side by side; results in benchmarks/results/ (table, CSV, PNG).
bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# Whole models: torch eager, torch.compile, ONNX Runtime, TVM and tir_byoc side by side.
bench-models: $(BENCH_STAMP)
	$(BIN)/python benchmarks/models.py $(BENCH_ARGS)

# The matcher's own speed (scan time per PrimFunc).
bench-matcher: $(STAMP)
	$(BIN)/python benchmarks/run.py --matcher

# tir_byoc's oneDNN intrinsics against direct oneDNN calls, interleaved in one process.
bench-bridge: $(STAMP)
	$(BIN)/python benchmarks/run.py --bridge

# How TVM's, OpenMP's and OpenBLAS's thread pools get along, with and without tir_byoc's settings.
bench-threads: $(STAMP)
	$(BIN)/python benchmarks/threads.py

# The C epilogue alone (one op over a GEMM output) against torch eager's op, at 1 and 2 threads.
bench-epilogue: $(STAMP)
	$(BIN)/python benchmarks/epilogue.py $(BENCH_ARGS)

# A model served from a pool of threads: 2 callers x 1 thread against 1 caller x 2 threads;
# BENCH_ARGS=--overhead times a small model's per-call overhead instead.
bench-serving: $(BENCH_STAMP)
	$(BIN)/python benchmarks/serving.py $(BENCH_ARGS)

# A model as plain C (tir_byoc.aot) against the Relax VM build and torch eager, at one thread.
bench-aot: $(BENCH_STAMP)
	$(BIN)/python benchmarks/aot.py $(BENCH_ARGS)

# MobileNetV2's convolutions as oneDNN primitives, with and without the 1 x 1 + depthwise
# fusion (benchmarks/conv_chain.py).
bench-conv-chain: $(BENCH_STAMP)
	$(BIN)/python benchmarks/conv_chain.py $(BENCH_ARGS)

# MobileNetV2 built with and without its fused 1 x 1 + depthwise pairs, beside ONNX Runtime
# (benchmarks/conv_pairs.py).
bench-conv-pairs: $(BENCH_STAMP)
	$(BIN)/python benchmarks/conv_pairs.py $(BENCH_ARGS)

# One BERT-like build with batch and sequence dynamic against a static build per size, ONNX
# Runtime with dynamic axes and torch eager; the build times too (benchmarks/dynamic.py).
bench-dynamic: $(BENCH_STAMP)
	$(BIN)/python benchmarks/dynamic.py $(BENCH_ARGS)

# 28 transformers architectures through build_model: agreement, GEMM FLOPs offloaded, gaps.
bench-zoo: $(STAMP)
	$(BIN)/python benchmarks/zoo.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
