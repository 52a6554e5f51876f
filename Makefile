# smoe — spec-first toolchain for .smoe vaults.
# Every target installs what it needs, so `make demo` and `make test` work first on a fresh clone.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CXX ?= g++
CXXFLAGS ?= -std=c++20 -O2 -Wall -Wextra -Werror
BUILD := build

VENV_STAMP := $(VENV)/.installed
NODE_STAMP := codegen/node_modules/.installed
GEN_HEADER := generated/cpp/common.hpp
HARNESS_TESTS := $(BUILD)/layout_test

.PHONY: all setup gen check-gen build lint test demo bench clean

all: test

# ---- setup: Python venv with the package (editable) and dev extras; the pinned compiler
$(VENV_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

$(NODE_STAMP): codegen/package.json codegen/package-lock.json
	cd codegen && npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(VENV_STAMP) $(NODE_STAMP)

# ---- code generation from spec/smoe.ksy
gen: setup
	$(PY) codegen/gen.py

check-gen: setup
	$(PY) codegen/gen.py --check

# ---- C++ (built on the generated header only)
$(BUILD)/layout_test: harness/tests/layout_test.cpp $(GEN_HEADER)
	@mkdir -p $(BUILD)
	$(CXX) $(CXXFLAGS) -Igenerated/cpp $< -o $@

build: $(HARNESS_TESTS)

lint: setup
	$(PY) -m ruff check .

test: setup check-gen build lint
	$(PY) -m pytest -q

demo: setup
	$(PY) -m smoe.cli spec

bench: setup build
	$(PY) -m bench

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache
	find . -name __pycache__ -not -path './.venv/*' -prune -exec rm -rf {} +
