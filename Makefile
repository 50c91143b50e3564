# Two entry points: `make demo` and `make test`. Each creates .venv if needed, installs the
# project with pinned dependencies, then runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"

$(STAMP): $(BIN)/python pyproject.toml requirements-lock.txt
	$(BIN)/python -m pip install --quiet -r requirements-lock.txt
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	cd /tmp && $(abspath $(BIN))/python -m tir_byoc.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

clean:
	rm -rf $(VENV) build *.egg-info
