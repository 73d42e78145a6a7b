# Quick start: `make demo` (set up .venv and run the main job), `make test` (set up and run the tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint

# torch==2.13.0 first: it is the CPU wheel on disk; a looser request would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/kmipgt train --config configs/minnesota.yaml
	@echo "Next: source $(VENV)/bin/activate (or call $(VENV)/bin/kmipgt), then kmipgt --help, kmipgt configs"

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .
