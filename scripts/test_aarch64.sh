#!/bin/sh
# Cross-builds anytune for 64-bit ARM Linux and runs tests under qemu's user
# mode emulation (qemu-aarch64-static, whose default CPU has NEON, dot
# products, BF16, I8MM and SVE, so every ISA level is exercised).
# Usage: scripts/test_aarch64.sh [--quick]
#   (none)   the numeric suite: every op at every ISA level (conformance, the
#            kernels, GEMM, quantization), the decoder, backward and training
#            goldens, the tokenizer vectors, then a short `anytune sft` demo
#   --quick  the part `make test` runs: conformance (every op), the kernels
#            and quantization at every ISA level, the decoder goldens, the
#            tokenizer vectors and the demo (a few minutes on an idle machine)
# The packages come from scripts/setup.sh --aarch64.
set -e
quick=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    *) echo "test_aarch64: unknown option $a (use --quick)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BUILD=${AARCH64_BUILD:-build-aarch64}
JOBS=$(nproc)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DANYTUNE_CUDA_EMULATOR=OFF
fi
# Tests that start the anytune binary themselves (serve, MPI, CLI scripts)
# are left out: only ctest's own command goes through the emulator.
# (the quick part runs each test once, at the best level; conformance,
# cpu_kernels and quant walk the levels themselves)
if [ $quick = 1 ]; then
  names="conformance cpu_kernels quant decoder tokenizer_vectors"
  levels=""
else
  levels="(@.*)?"
  names="conformance cpu_kernels gemm quant dropout ops_errors base reference decoder backward lora qlora kv_cache \
generate train train_neftune preference stories tokenizer tokenizer_vectors"
fi
targets="anytune"
for n in $names; do targets="$targets test_$n"; done
# shellcheck disable=SC2086 # one word per target
cmake --build "$BUILD" -j "$JOBS" --target $targets
tests="^test_($(echo "$names" | tr -s ' ' '|'))$levels\$"
start=$(date +%s)
(cd "$BUILD" && QEMU_CPU=max ctest --output-on-failure -j "$JOBS" -R "$tests")
# A short run of the bundled demo, as a user on an ARM machine would start it.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# (no GEMM engine calibration: under emulation it would time the emulator)
export QEMU_CPU=max OMP_WAIT_POLICY=passive ANYTUNE_GEMM_TUNE=0
qemu-aarch64-static "$BUILD/anytune" env | sed -n '1,4p'
qemu-aarch64-static "$BUILD/anytune" sft --max_steps 4 --logging_steps 2 --output_dir "$out/run" > "$out/log" 2>&1 ||
  { cat "$out/log"; exit 1; }
grep -q 'logged loss' "$out/log" || { cat "$out/log"; echo "test_aarch64: the demo printed no loss" >&2; exit 1; }
ls "$out"/run/*/checkpoint-4 > /dev/null || { cat "$out/log"; echo "test_aarch64: no checkpoint-4" >&2; exit 1; }
tail -n 3 "$out/log"
echo "test_aarch64: passed in $(( $(date +%s) - start )) s of tests (after the build)"
