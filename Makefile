# The two commands of the README: `make demo` and `make test`. Each creates .venv on first use.
# `make demo` installs the project alone (no torch, no CUDA); `make test` adds the dev tools and,
# where pip would fetch a CPU build, torch for the torch runner's tests (scripts/install_torch.py).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.installed-core
DEV := $(VENV)/.installed-dev

.PHONY: demo test lint format clean

$(CORE): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python scripts/warm_kernels.py
	touch $(CORE)

$(DEV): $(CORE) scripts/install_torch.py
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python scripts/install_torch.py
	touch $(DEV)

demo: $(CORE)
	$(BIN)/collsim demo

test: $(DEV)
	$(BIN)/ruff check collsim tests benchmarks scripts
	$(BIN)/ruff format --check collsim tests benchmarks scripts
	$(BIN)/python -m pytest -n auto; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

lint: $(DEV)
	$(BIN)/ruff check collsim tests benchmarks scripts

format: $(DEV)
	$(BIN)/ruff format collsim tests benchmarks scripts
	$(BIN)/ruff check --fix collsim tests benchmarks scripts

clean:
	rm -rf $(VENV) build *.egg-info
