# The README's commands. CMake does the building; this file only strings the steps together.
#   make        install missing dependencies, build the library, CLI, Python extension, C tests
#   make test   every test: the format check, C tests (plain, under ASan+UBSan, the threaded
#               ones under TSan) and the Python tests
#   make format apply .clang-format (scripts/check-format.sh --fix)
#   make demo   the main job on a generated dataset
#   make fuzz   every libFuzzer target for FUZZ_SECONDS each (default 60; clang, build-fuzz/)
#   make campaign  the damage and kill campaign (scripts/campaign.py) under ASan+UBSan
PY      := .venv/bin/python
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=
ifeq ($(CI),true)
  CMAKE_FLAGS += -DZB_WERROR=ON
endif

FUZZ_SECONDS ?= 60
# make campaign: damaged stores, killed writers, the seed (docs/RELIABILITY.md)
CAMPAIGN_SEED ?= 21
CAMPAIGN_CASES ?= 2000
CAMPAIGN_KILLS ?= 400
# make test runs each fuzz target this long: enough to replay its corpus and mutate a little
FUZZ_SMOKE_SECONDS ?= 10

.PHONY: all deps build asan tsan fuzz-build fuzz test test-c test-asan test-tsan test-fuzz \
        test-python demo format format-check clean campaign-build campaign

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

# ThreadSanitizer over the tests that run threads: the pool (writer), the reader, the loader,
# concatenations (collection), store copies and transforms. ASan and TSan cannot share a build.
TSAN_TESTS := test_reader test_loader test_writer test_collection test_store_copy test_transforms test_cache

tsan: deps
	@cmake -S . -B build-tsan -G Ninja -DZB_SANITIZE=thread -DZB_BUILD_PYTHON=OFF \
	    -DZB_BUILD_CLI=OFF -DZB_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target $(TSAN_TESTS)

test-tsan: tsan
	@cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	    ctest --output-on-failure -j $(JOBS) -R '^($(subst $(eval) ,|,$(TSAN_TESTS)))$$'

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

# the CLI and the Python extension with ASan+UBSan, for the campaign's readers
campaign-build: deps
	@cmake -S . -B build-asan-py -G Ninja -DZB_SANITIZE=ON -DZB_BUILD_TESTS=OFF \
	    -DZB_BUILD_BENCH=OFF -DPython3_EXECUTABLE=$(abspath $(PY)) $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-asan-py -j $(JOBS) --target _zbatch zbatch

campaign: build campaign-build
	@nice -n 10 $(PY) scripts/campaign.py --seed $(CAMPAIGN_SEED) --cases $(CAMPAIGN_CASES) \
	    --kills $(CAMPAIGN_KILLS)

test-python: build
	@$(PY) -m pytest -q tests/python

test: format-check test-c test-asan test-tsan test-fuzz test-python

demo: build
	@$(PY) scripts/demo.py

format:
	@bash scripts/check-format.sh --fix

format-check:
	@bash scripts/check-format.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz
