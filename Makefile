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
HARNESS_SRC := $(wildcard harness/*.cpp)
HARNESS_HDR := $(wildcard harness/*.hpp)
ASAN_FLAGS := -std=c++20 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined \
	-fno-omit-frame-pointer -fno-sanitize-recover=all

.PHONY: all setup gen check-gen fixtures build build-asan lint test fuzz demo bench clean

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

# ---- golden fixtures (deterministic; tests prove a rerun is byte-identical)
fixtures: setup
	$(PY) fixtures/generate.py

# ---- C++ (built on the generated header only)
$(BUILD)/layout_test: harness/tests/layout_test.cpp $(GEN_HEADER)
	@mkdir -p $(BUILD)
	$(CXX) $(CXXFLAGS) -Igenerated/cpp $< -o $@

$(BUILD)/smoe-stream: $(HARNESS_SRC) $(HARNESS_HDR) $(GEN_HEADER)
	@mkdir -p $(BUILD)
	$(CXX) $(CXXFLAGS) -Igenerated/cpp -Iharness $(HARNESS_SRC) -o $@ -pthread

$(BUILD)/asan/smoe-stream: $(HARNESS_SRC) $(HARNESS_HDR) $(GEN_HEADER)
	@mkdir -p $(BUILD)/asan
	$(CXX) $(ASAN_FLAGS) -Igenerated/cpp -Iharness $(HARNESS_SRC) -o $@ -pthread

build: $(BUILD)/layout_test $(if $(HARNESS_SRC),$(BUILD)/smoe-stream)

build-asan: $(if $(HARNESS_SRC),$(BUILD)/asan/smoe-stream)

lint: setup
	$(PY) -m ruff check .

test: setup check-gen build build-asan lint
	$(PY) -m fuzz.campaign --quick
	$(PY) -m pytest -q

# ---- robustness campaign (time-boxed, seeded): build/fuzz.json
fuzz: setup build-asan
	$(PY) -m fuzz.campaign

# ---- the main job on the bundled tiny checkpoint (transformers-made qwen3_moe)
DEMO_MODEL := fixtures/checkpoints/qwen3_moe
DEMO_OUT := build/demo
demo: setup build
	@echo "== 1. sculpt $(DEMO_MODEL) -> $(DEMO_OUT)"
	$(PY) -m smoe.cli sculpt $(DEMO_MODEL) $(DEMO_OUT) --jobs 2
	@echo "== 2. verify (deep)"
	$(PY) -m smoe.cli verify --deep $(DEMO_OUT)/qwen3_moe.smoe
	@echo "== 3. dump"
	$(PY) -m smoe.cli dump $(DEMO_OUT)/qwen3_moe.smoe
	@echo "== 4. stream it the way an engine does (C++)"
	build/smoe-stream check $(DEMO_OUT)/qwen3_moe.smoe
	$(PY) -c "import numpy as np; np.random.default_rng(0).standard_normal(64).astype('<f4').tofile('$(DEMO_OUT)/x.f32')"
	build/smoe-stream forward $(DEMO_OUT)/qwen3_moe.smoe 1 3 $(DEMO_OUT)/x.f32 $(DEMO_OUT)/y.f32
	$(PY) -c "import numpy as np; y = np.fromfile('$(DEMO_OUT)/y.f32', '<f4'); print('expert (layer 1, expert 3) SwiGLU output:', y.shape, 'first values', y[:4])"
	build/smoe-stream bench $(DEMO_OUT)/qwen3_moe.smoe --pattern random --topk 2 --seconds 1

bench: setup build
	$(PY) -m bench

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -not -path './.venv/*' -prune -exec rm -rf {} +
