# Two commands do all set-up: `make demo` and `make test`. Both create .venv when it is
# missing, install torch (the CPU build on a machine without an NVIDIA GPU, so no CUDA
# packages are pulled), then the package with every extra and the test extras.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.divergence-installed
# The CPU build of torch; on machines whose package index serves a CUDA build under this
# pin, point pip at a CPU index, e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_CPU ?= torch==2.13.0
TORCH_GPU ?= torch
DEMO_DIR ?= demo
PYTEST_ARGS ?=

.PHONY: install demo test bench gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "installing $(TORCH_GPU) (NVIDIA GPU found)"; $(PY) -m pip install -q "$(TORCH_GPU)"; \
	else \
		echo "installing $(TORCH_CPU) (no NVIDIA GPU: CPU build)"; $(PY) -m pip install -q "$(TORCH_CPU)"; \
	fi
	$(PY) -m pip install -q -e '.[all,dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/divergence study --out $(DEMO_DIR)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# On a CUDA machine: every GPU-only part once, into gpu-check/ (report.md, results.json). No pip,
# no venv needed: the machine's own python3 and torch with this project on PYTHONPATH. Without a
# GPU it prints one line and exits 0. Split over two calls: GPU_CHECK_ARGS="--parts study ddp-watch".
GPU_CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_CHECK_ARGS ?=

gpu-check:
	@PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_CHECK_PY) benchmarks/gpu_check.py --out gpu-check $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
