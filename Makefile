# The two commands of the README: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,calib]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/collsim demo

test: $(STAMP)
	$(BIN)/ruff check collsim tests benchmarks
	$(BIN)/ruff format --check collsim tests benchmarks
	$(BIN)/python -m pytest -n auto; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check collsim tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format collsim tests benchmarks
	$(BIN)/ruff check --fix collsim tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
