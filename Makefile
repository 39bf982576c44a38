# biasviz — `make figures` rebuilds every figure from nothing; `make test` runs the test suite.
# Both install what they need into .venv first (Python 3.10+ and pip are all that must exist).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BIASVIZ := $(BIN)/biasviz
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install test lint figures clean distclean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# torch is pinned exactly (pyproject.toml): a looser pin would pull the CUDA build on CPU machines.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)  ## create .venv and install biasviz with its test tools

test: $(STAMP)  ## run the test suite (CPU; CUDA tests skip without a GPU)
	$(BIN)/python -m pytest tests biasviz

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check biasviz tests

clean:  ## remove built checkpoints, HDF5 files and figures (keeps .venv)
	rm -rf runs data

distclean: clean  ## also remove .venv
	rm -rf $(VENV)
