# The two commands of the README:
#   make demo   create .venv, install the pinned set, run the main job (phaselab run quickstart)
#   make test   install (if needed), lint (the pinned ruff) and run the whole CPU test suite
# pip (not uv/poetry) with constraints.txt: it keeps the CPU torch wheel and never pulls CUDA torch.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.phaselab-installed
export RAY_USAGE_STATS_ENABLED ?= 0
export MLFLOW_DISABLE_TELEMETRY ?= true
export HF_DATASETS_OFFLINE ?= 1
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.torch_extensions
PYTEST_ARGS ?=

.PHONY: demo test install gpu-test lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[eval,postgres,dev]"
	$(PY) -m phaselab.workloads.train.deepspeed_engine || echo "warning: DeepSpeed's comm op did not build; \
	  a ZeRO run on CPU will try again (it needs a C++ compiler)"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/phaselab run quickstart

# Two pytest processes (pytest-xdist), each test file whole in one of them: most of the suite
# waits on Ray, DeepSpeed and MLflow start-ups and subprocesses, so a second process keeps the
# second core busy. Files keep the collection order (tests/conftest.py puts the slowest first).
# PYTEST_XDIST=0 runs it in one process.
PYTEST_XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder
test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "not gpu" -q -p no:cacheprovider --durations=15 $(if $(filter 0,$(PYTEST_XDIST)),,$(PYTEST_XDIST)) $(PYTEST_ARGS)

# On a CUDA machine: the kernel sweeps and GPU entry points.
gpu-test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m gpu -q $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .phaselab .torch_extensions
