# Thin wrapper over CMake for the README's commands.
#   make          build build/anytune (release)
#   make run      install what is missing, build, run the bundled demo
#   make run-vision   the same for the vision demo (anytune sft --demo vision)
#   make test     install what is missing, build (release + sanitizers), run the suite
#   make bench-NAME   build and run bench/NAME.c (e.g. make bench-gemm)
#   make test-aarch64 cross-build for 64-bit ARM and run the numeric suite under qemu
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan

.PHONY: all setup setup-test run run-vision test test-release test-asan test-aarch64 clean configure FORCE

all: $(BUILD)/anytune

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

$(BUILD)/anytune: $(BUILD)/CMakeCache.txt FORCE
	cmake --build $(BUILD) -j $(JOBS)

FORCE:

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh --test

run: setup $(BUILD)/anytune
	$(BUILD)/anytune env
	$(BUILD)/anytune sft

run-vision: setup $(BUILD)/anytune
	$(BUILD)/anytune sft --demo vision

test: setup-test
	$(MAKE) test-release
	$(MAKE) test-asan
	scripts/test_aarch64.sh --quick

test-release: $(BUILD)/anytune
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	CC=clang cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANYTUNE_SANITIZE=ON -DANYTUNE_FUZZ=ON

test-asan: $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

test-aarch64:
	scripts/setup.sh --aarch64
	scripts/test_aarch64.sh

bench-%: $(BUILD)/anytune
	$(BUILD)/bench_$* $(ARGS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-aarch64
