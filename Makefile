# Quick start: `make demo` (set up .venv and run the main job), `make test` (set up and run the tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint gpu-check

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

# On a CUDA machine (torch with CUDA installed first): the CUDA tests, then the small-graph benchmarks
# docs/benchmarks.md records, their JSON under bench-out/gpu. With PEPTIDES_ROOT=<local LRGB copy>, also
# two real Peptides-func epochs of the shipped recipe and of its `attention: none` ablation.
gpu-check: setup
	$(PY) -m pytest -q -m cuda
	$(VENV)/bin/kmipgt bench ragged --device cuda --out bench-out/gpu/ragged
	$(VENV)/bin/kmipgt bench step --config peptides_func --device cuda --out bench-out/gpu/step-kmip
	$(VENV)/bin/kmipgt bench step --config peptides_func --device cuda --set model.attention=none \
		--out bench-out/gpu/step-none
	$(if $(PEPTIDES_ROOT),for attention in kmip none; do $(VENV)/bin/kmipgt train --config peptides_func \
		--set data.options.root=$(PEPTIDES_ROOT) --set optim.epochs=2 --set device=cuda \
		--set model.attention=$$attention --set out_dir=bench-out/gpu/epochs-$$attention --overwrite \
		--no-progress || exit 1; done)
