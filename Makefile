# Quick start: `make demo` (set up .venv and run the main job), `make test` (set up and run the tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint compat gpu-bundle gpu-site gpu-check lrgb-table

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

# kmipgt's wheel beside one PyTorch release (TORCH=2.14.1), in a fresh venv under .compat/: the install must
# leave torch as it was; then a quick test subset and the main job. One line, recorded in
# docs/data/torch_compat.csv (docs/compatibility.md). Several GB per release, removed after the check.
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=VERSION (e.g. TORCH=2.14.1)"; exit 2; }
	$(PYTHON) tools/torch_compat.py $(TORCH)

# The GPU machine's own Python (torch with CUDA, Triton), and where the carried wheels go there.
GPU_PYTHON ?= python3
GPU_SITE ?= /tmp/kmipgt-gpu-site
# The GPU targets' kmipgt cache: inside the checkout (ignored), so that it can be carried there with what
# `make gpu-bundle PEPTIDES_ROOT=...` converted here.
GPU_CACHE ?= .gpu-cache
GPU_ENV = PYTHONPATH=src:$(GPU_SITE) KMIPGT_CACHE=$(abspath $(GPU_CACHE))
# What kmipgt imports at run time that the GPU machine's image lacks (pygsp: the Minnesota graph), for its
# CPython 3.12; and what converts the original Peptides CSV (ogb, its needs outdated and littleutils, and
# rdkit: 32 MB), needed there only where no converted copy is carried.
GPU_WHEELS := pygsp==0.6.1
LRGB_WHEELS := ogb==1.3.6 outdated==0.2.2 littleutils==0.2.4 rdkit==2026.9.1
WHEEL_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64

# Where a package registry is reachable: those wheels into .whl/ (ignored), to travel with the checkout.
# With PEPTIDES_ROOT=<folder holding peptides-functional/>, the CSV is converted here instead, into
# GPU_CACHE (4 MB, compressed), and the converter's wheels are left out: carry .whl and GPU_CACHE.
gpu-bundle: $(if $(PEPTIDES_ROOT),setup)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(WHEEL_PLATFORMS) -d .whl $(GPU_WHEELS) $(if $(PEPTIDES_ROOT),,$(LRGB_WHEELS))
	$(if $(PEPTIDES_ROOT),rm -f $(foreach wheel,$(LRGB_WHEELS),.whl/$(firstword $(subst ==, ,$(wheel)))-*.whl))
	$(if $(PEPTIDES_ROOT),KMIPGT_CACHE=$(abspath $(GPU_CACHE)) $(VENV)/bin/kmipgt data info lrgb \
		--root $(PEPTIDES_ROOT) --set name=Peptides-func)

# On a CUDA machine that reaches no registry: the carried wheels installed offline into GPU_SITE, which
# the GPU targets below put on PYTHONPATH. GPU_CACHE made private whatever mode a copy gave it: kmipgt
# reads a cache only where no one else may write.
gpu-site:
	@mkdir -p $(GPU_CACHE) && chmod 700 $(GPU_CACHE)
	@if ls .whl/*.whl >/dev/null 2>&1; then \
		$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
			--target $(GPU_SITE) .whl/*.whl; \
	else echo "no wheels in .whl/: run make gpu-bundle where a registry is reachable, and carry .whl"; fi

# Every GPU measurement (kmipgt.bench.gpu_check), each with its own time limit, within 10 minutes; JSON
# under bench-out/gpu, one summary line per target last. PEPTIDES_ROOT=<local LRGB copy> adds two real
# Peptides-func epochs of the shipped recipe and of its `attention: none` ablation. GPU_TARGETS=WORD,...
# runs only the targets whose name holds one of the words, GPU_BUDGET=SECONDS within that many seconds
# (GPU_TARGETS=pytest,epochs GPU_BUDGET=300: a 15-minute loan keeps time for make lrgb-table).
gpu-check: gpu-site
	$(GPU_ENV) $(GPU_PYTHON) -m kmipgt.bench.gpu_check --out bench-out/gpu \
		$(if $(PEPTIDES_ROOT),--peptides-root $(PEPTIDES_ROOT)) $(if $(GPU_TARGETS),--only "$(GPU_TARGETS)") \
		$(if $(GPU_BUDGET),--budget $(GPU_BUDGET))

# The k-MIP paper's Peptides-func table (sweeps/lrgb_peptides_table) on a CUDA machine, as gpu-check runs.
# PEPTIDES_ROOT: the folder holding peptides-functional/, the same path every time (the runs keep it in
# their configs). The CSV is converted once on every core (where GPU_CACHE holds no converted copy); then
# the cells train JOBS at a time (each one CPU thread, so that the cells' host work does not contend for the
# cores) and stop at an epoch boundary within TIME_LIMIT seconds, which leaves a 10-minute command about a
# minute for the rest. LRGB_OUT gets summary.md (printed last), results.csv and runs.tar.gz (parts
# runs.tar.gz.000, ... above 15 MiB); RESUME=<that archive, brought to the next machine> continues its
# cells there. SWEEP_SET: more overrides for every cell (KEY=VALUE ...).
# JOBS 6: each cell stopped by the limit packs its checkpoints (6.5 MiB for the paper's model), and what one
# device command brings back, and the next one carries with the checkout, is 64 MiB; `auto` (as many as the
# GPU's memory holds, one per core at most) where the archive need not travel.
TIME_LIMIT ?= 540
JOBS ?= 6
LRGB_OUT ?= bench-out/lrgb
LRGB_RUNS := runs/sweeps/lrgb_peptides_table

lrgb-table: gpu-site
	@test -n "$(PEPTIDES_ROOT)" || { echo "PEPTIDES_ROOT=<folder holding peptides-functional/> is needed"; \
		exit 2; }
	$(GPU_ENV) $(GPU_PYTHON) -m kmipgt data info lrgb --root $(PEPTIDES_ROOT) \
		--set name=Peptides-func
	mkdir -p $(LRGB_OUT)
	$(GPU_ENV) $(GPU_PYTHON) -m kmipgt sweep sweeps/lrgb_peptides_table --out $(LRGB_RUNS) \
		--set data.options.root=$(PEPTIDES_ROOT) --set threads=1 $(foreach s,$(SWEEP_SET),--set $(s)) \
		--jobs $(JOBS) \
		--time-limit $(TIME_LIMIT) $(if $(RESUME),--unpack $(RESUME)) --pack $(LRGB_OUT)/runs.tar.gz; \
	status=$$?; cp $(LRGB_RUNS)/summary.md $(LRGB_RUNS)/results.csv $(LRGB_OUT)/ && \
		cat $(LRGB_OUT)/summary.md; exit $$status
