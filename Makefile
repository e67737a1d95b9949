# The README's commands. CMake does the building; this file only strings the steps together.
#   make        install missing dependencies, build the library, CLI, Python extension, C tests
#   make test   every test: C tests (plain and under ASan+UBSan) and the Python tests
#   make demo   the main job on a generated dataset
#   make fuzz   every libFuzzer target for FUZZ_SECONDS each (default 60; clang, build-fuzz/)
PY      := .venv/bin/python
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=
ifeq ($(CI),true)
  CMAKE_FLAGS += -DZB_WERROR=ON
endif

FUZZ_SECONDS ?= 60
# make test runs each fuzz target this long: enough to replay its corpus and mutate a little
FUZZ_SMOKE_SECONDS ?= 10

.PHONY: all deps build asan fuzz-build fuzz test test-c test-asan test-fuzz test-python demo \
        format clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B build -G Ninja -DPython3_EXECUTABLE=$(abspath $(PY)) $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j $(JOBS)
	@$(PY) scripts/dev-install.py build

asan: deps
	@cmake -S . -B build-asan -G Ninja -DZB_SANITIZE=ON -DZB_BUILD_PYTHON=OFF \
	    -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-asan -j $(JOBS)

test-c: build
	@cd build && ctest --output-on-failure -j $(JOBS)

test-asan: asan
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

fuzz-build: deps
	@CC=clang cmake -S . -B build-fuzz -G Ninja -DZB_FUZZ=ON -DZB_BUILD_TESTS=OFF \
	    -DZB_BUILD_CLI=OFF -DZB_BUILD_BENCH=OFF -DZB_BUILD_PYTHON=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-fuzz -j $(JOBS)

fuzz: fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

test-fuzz: fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS) bash scripts/fuzz.sh

test-python: build
	@$(PY) -m pytest -q tests/python

test: test-c test-asan test-fuzz test-python

demo: build
	@$(PY) scripts/demo.py

format:
	@clang-format -i include/*.h $$(find src cli tests/c python -name '*.[ch]')

clean:
	rm -rf build build-asan build-fuzz
