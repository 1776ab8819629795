#!/bin/sh
# Cross-builds anytune for 64-bit ARM Linux and runs tests under qemu's user
# mode emulation (qemu-aarch64-static, whose default CPU has NEON, dot
# products, BF16, I8MM and SVE, so every ISA level is exercised).
# Usage: scripts/test_aarch64.sh [--quick]
#   (none)   the numeric suite: every op at every ISA level (conformance, the
#            kernels, GEMM, quantization), the GEMM engine calibration, the
#            decoder, backward and training goldens at the top level and at
#            plain NEON, the tokenizer vectors, then `anytune env` with the
#            engines timed and a short `anytune sft` demo
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
  # The model tests at the top level (-cpu max: BFMMLA, SDOT) and at plain
  # NEON (the f32 path of CPUs without bf16), not at every level: the kernels
  # of the others (scalar, dotprod) are checked level by level by
  # conformance, cpu_kernels, gemm and quant, and under emulation each model
  # test costs minutes per level.
  levels="(@neon)?"
  names="conformance cpu_kernels gemm gemm_tune quant dropout ops_errors base reference decoder backward lora qlora \
kv_cache generate train train_neftune preference stories tokenizer tokenizer_vectors"
fi
targets="anytune"
for n in $names; do targets="$targets test_$n"; done
# shellcheck disable=SC2086 # one word per target
cmake --build "$BUILD" -j "$JOBS" --target $targets
tests="^test_($(echo "$names" | tr -s ' ' '|'))$levels\$"
start=$(date +%s)
(cd "$BUILD" && QEMU_CPU=max ctest --output-on-failure -j "$JOBS" -R "$tests")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export QEMU_CPU=max OMP_WAIT_POLICY=passive
if [ $quick = 0 ]; then
  # The f32 GEMM engines chosen by timing, as on an ARM machine: every class
  # must get a well-formed choice. The figures time the emulator, not an ARM
  # CPU, so the problems are the tiny ones (ANYTUNE_GEMM_TUNE=tiny, cached
  # under a key of their own) and the demo below does not use them.
  export XDG_CACHE_HOME="$out/cache"
  ANYTUNE_GEMM_TUNE=tiny qemu-aarch64-static "$BUILD/anytune" env | sed -n '1,/^devices:/p' | sed '$d'
  # (read back from the cache just written) each class: an engine of this
  # build, and a figure above 0 for ours and for the one chosen
  ANYTUNE_GEMM_TUNE=tiny qemu-aarch64-static "$BUILD/anytune" env --json > "$out/env.json"
  n=$(tr -d ' \n\t' < "$out/env.json" | grep -oE '"engine":"(anytune|openblas)","from_cache":true,"gflops":\{[^}]*\}' |
    awk -F'[:,{}]+' '{ ok = 0; for (i = 6; i < NF; i += 2) { if ($i == "\"anytune\"" && $(i + 1) > 0) ok++;
      if ($i == $2 && $(i + 1) > 0) ok++ } if (ok == 2) n++ } END { print n + 0 }')
  [ "$n" = 12 ] || { cat "$out/env.json"; echo "test_aarch64: $n of the 12 GEMM classes got a well-formed engine choice" >&2; exit 1; }
  unset XDG_CACHE_HOME
fi
# A short run of the bundled demo, as a user on an ARM machine would start it
# (no engine calibration: under emulation it would time the emulator).
export ANYTUNE_GEMM_TUNE=0
[ $quick = 0 ] || qemu-aarch64-static "$BUILD/anytune" env | sed -n '1,6p'
qemu-aarch64-static "$BUILD/anytune" sft --max_steps 4 --logging_steps 2 --output_dir "$out/run" > "$out/log" 2>&1 ||
  { cat "$out/log"; exit 1; }
grep -q 'logged loss' "$out/log" || { cat "$out/log"; echo "test_aarch64: the demo printed no loss" >&2; exit 1; }
ls "$out"/run/*/checkpoint-4 > /dev/null || { cat "$out/log"; echo "test_aarch64: no checkpoint-4" >&2; exit 1; }
tail -n 3 "$out/log"
echo "test_aarch64: passed in $(( $(date +%s) - start )) s of tests (after the build)"
