# smoe — spec-first toolchain for .smoe vaults.
# Every target installs what it needs, so `make demo` and `make test` work first on a fresh clone.
# Only `make gen` and `make check-gen` (and so `make test`) need node; the rest needs python3 and g++.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CXX ?= g++
CXXFLAGS ?= -std=c++20 -O2 -Wall -Wextra -Werror
BUILD := build

VENV_STAMP := $(VENV)/.installed
FUZZ_STAMP := $(VENV)/.fuzz-tried
NODE_STAMP := codegen/node_modules/.installed
GEN_HEADER := generated/cpp/common.hpp
HARNESS_SRC := $(wildcard harness/*.cpp)
HARNESS_HDR := $(wildcard harness/*.hpp)
ASAN_FLAGS := -std=c++20 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined \
	-fno-omit-frame-pointer -fno-sanitize-recover=all

.PHONY: all setup setup-node gen check-gen fixtures build build-asan lint test fuzz demo bench clean

all: test

# ---- setup: Python venv with the package (editable) and dev extras (no node, no atheris)
$(VENV_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

setup: $(VENV_STAMP)

# The `fuzz` extra (atheris) for `make test`, only where atheris has a wheel (none for macOS
# arm64 or Linux aarch64); without it the campaign skips its atheris target and says why.
# Tried once per venv; `make fuzz` insists.
$(FUZZ_STAMP): $(VENV_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check --only-binary atheris -e '.[fuzz]' \
		>$(VENV)/fuzz-install.log 2>&1 || echo "note: no atheris wheel for this machine \
	(see $(VENV)/fuzz-install.log); make test runs the fuzz campaign without its atheris target"
	touch $@

# The pinned Kaitai Struct compiler (node): only code generation needs it.
$(NODE_STAMP): codegen/package.json codegen/package-lock.json
	cd codegen && npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup-node: $(NODE_STAMP)

gen check-gen: $(NODE_STAMP)

# ---- code generation from spec/smoe.ksy
gen: setup
	$(PY) codegen/gen.py

# Also compiles the .ksy for every target the pinned compiler supports (output under
# build/ksc, not committed): any compiler error fails; docs/KAITAI_TARGETS.md has the matrix.
check-gen: setup
	$(PY) codegen/gen.py --check
	rm -rf $(BUILD)/ksc
	node codegen/ksc.js --all --out $(BUILD)/ksc spec/smoe.ksy

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

CXX_SOURCES := $(wildcard harness/*.cpp harness/*.hpp harness/tests/*.cpp harness/tests/*.c)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/package/test_layers.py  # the layers' import contracts
	@command -v clang-format >/dev/null || { \
		echo "lint: installing clang-format (Debian package)"; \
		(apt-get install -y -q clang-format >/dev/null 2>&1 \
		 || (apt-get update -q >/dev/null && apt-get install -y -q clang-format >/dev/null)); }
	clang-format --dry-run --Werror $(CXX_SOURCES)

test: setup check-gen build build-asan lint $(FUZZ_STAMP)
	$(PY) -m fuzz.campaign --quick
	$(PY) -m pytest -q

# ---- robustness campaign (time-boxed, seeded): build/fuzz.json
fuzz: setup build-asan
	$(PY) -c 'import atheris' 2>/dev/null \
		|| $(PY) -m pip install -q --disable-pip-version-check -e '.[fuzz]'
	$(PY) -m fuzz.campaign

# ---- the main job on the bundled tiny checkpoint (transformers-made qwen3_moe)
DEMO_MODEL := fixtures/checkpoints/qwen3_moe
DEMO_OUT := build/demo
demo: setup build
	@echo "== 1. sculpt $(DEMO_MODEL) -> $(DEMO_OUT)"
	$(PY) -m smoe sculpt $(DEMO_MODEL) $(DEMO_OUT) --jobs 2
	@echo "== 2. verify (deep)"
	$(PY) -m smoe verify --deep $(DEMO_OUT)/qwen3_moe.smoe
	@echo "== 3. dump"
	$(PY) -m smoe dump $(DEMO_OUT)/qwen3_moe.smoe
	@echo "== 4. stream it the way an engine does (C++)"
	build/smoe-stream check $(DEMO_OUT)/qwen3_moe.smoe
	$(PY) -c "import numpy as np; np.random.default_rng(0).standard_normal(64).astype('<f4').tofile('$(DEMO_OUT)/x.f32')"
	build/smoe-stream forward $(DEMO_OUT)/qwen3_moe.smoe 1 3 $(DEMO_OUT)/x.f32 $(DEMO_OUT)/y.f32
	$(PY) -c "import numpy as np; y = np.fromfile('$(DEMO_OUT)/y.f32', '<f4'); print('expert (layer 1, expert 3) SwiGLU output:', y.shape, 'first values', y[:4])"
	build/smoe-stream bench $(DEMO_OUT)/qwen3_moe.smoe --pattern random --topk 2 --seconds 1

# The package's bytecode is compiled first, as `pip install .` does for a regular install
# (an editable one under PYTHONDONTWRITEBYTECODE never writes it): the sculptor's set-up is
# timed as a user's would be.
bench: setup build
	$(PY) -m compileall -q smoe generated/python > /dev/null
	$(PY) -m bench

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -not -path './.venv/*' -prune -exec rm -rf {} +
