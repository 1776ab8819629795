#!/bin/sh
# The checks of the CUDA backend that need an NVIDIA GPU, in one run, over
# what scripts/gpu_bundle.sh prepared (run from the repository root):
#   sh scripts/gpu_check.sh [BUNDLE [OUT_DIR]]
# - the conformance suite on cuda:0 (every op against the reference kernels),
# - the PyTorch training goldens on cuda:0 (test_backward),
# - the trainer on cuda:0 against the CPU (test_train),
# - bench_train_gpu: tokens/s and MFU against PyTorch + PEFT on the same GPU.
# Writes one log per step into OUT_DIR (at most 7 files); exits non-zero when
# a test fails.
set -u
BUNDLE=${1:-gpu-bundle}
OUT=${2:-${OUT:-gpu-check-out}}
mkdir -p "$OUT"
# the bundle's libraries, then the CUDA toolkit's (cuBLAS) beside nvcc
CUDA_LIB=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/lib64
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for f in "$BUNDLE"/anytune "$BUNDLE"/libanytune_cuda.so; do
    ldd "$f" | grep "not found" && echo "missing libraries for $f (see above)"
done
export ANYTUNE_BIN="$PWD/$BUNDLE/anytune" OMP_WAIT_POLICY=passive PYTHONUNBUFFERED=1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$BUNDLE/anytune" env > "$OUT/env.txt" 2>&1
sed -n '/devices:/,/^$/p' "$OUT/env.txt"
rc=0
for t in test_conformance test_backward test_train; do
    start=$(date +%s)
    timeout 300 "$BUNDLE/$t" > "$OUT/$t.log" 2>&1
    r=$?
    echo "$t: exit $r in $(($(date +%s) - start)) s"
    grep -E "cuda:0|GPU runs|checks" "$OUT/$t.log" | grep -vE "^\[cuda:0 *\] [a-z]" | tail -8
    [ $r -eq 0 ] || rc=1
done
timeout 420 "$BUNDLE/bench_train_gpu" ${BENCH_ARGS:-} > "$OUT/bench_train_gpu.txt" 2>&1
echo "bench_train_gpu: exit $?"
cat "$OUT/bench_train_gpu.txt"
exit $rc
