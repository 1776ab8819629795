#!/bin/sh
# The checks of the CUDA backend that need an NVIDIA GPU, in one run, over
# what scripts/gpu_bundle.sh prepared (run from the repository root):
#   sh scripts/gpu_check.sh [BUNDLE [OUT_DIR]]
# - the conformance suite on cuda:0 (every op against the reference kernels),
# - the PyTorch training goldens on cuda:0 (test_backward),
# - the trainer on cuda:0 against the CPU (test_train), NEFTune's goldens
#   (test_train_neftune),
# - greedy generation of the demo model on cuda:0 equal to the CPU's, in
#   f32 and with q8_0 weights (anytune infer), and DPO's losses (anytune rlhf),
# - bench_qgemv_gpu: decoding matmuls with quantized weights, the fused
#   dequantize-GEMV against the tile path (a few seconds),
# - bench_train_gpu: tokens/s and MFU against PyTorch + PEFT on the same GPU.
# Writes one log per step into OUT_DIR (at most 8 files); exits non-zero when
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
{ nvidia-smi; "$BUNDLE/anytune" env; } > "$OUT/machine.txt" 2>&1
sed -n '/devices:/,/^$/p' "$OUT/machine.txt"
rc=0
for t in test_conformance test_backward test_train test_train_neftune; do
    start=$(date +%s)
    timeout 300 "$BUNDLE/$t" > "$OUT/$t.log" 2>&1
    r=$?
    echo "$t: exit $r in $(($(date +%s) - start)) s"
    grep -E "cuda:0|GPU runs|checks" "$OUT/$t.log" | grep -vE "^\[cuda:0 *\] [a-z]" | tail -8
    [ $r -eq 0 ] || rc=1
done
# greedy decoding is deterministic: the GPU must tell the CPU's story
for q in 0 8; do
    for d in cpu cuda; do
        timeout 60 "$BUNDLE/anytune" infer --device $d --quant_bits $q --torch_dtype float32 --template none \
            --prompt "Once upon a time" --max_new_tokens 96 --stream false > "$OUT/infer-$d-q$q.txt" 2>&1
    done
    if cmp -s "$OUT/infer-cpu-q$q.txt" "$OUT/infer-cuda-q$q.txt"; then
        echo "infer (quant_bits $q): cuda:0 generates what the CPU generates"
    else
        echo "infer (quant_bits $q): cuda:0 and the CPU differ:"; cat "$OUT/infer-cpu-q$q.txt" "$OUT/infer-cuda-q$q.txt"
        rc=1
    fi
    cat "$OUT/infer-cpu-q$q.txt" "$OUT/infer-cuda-q$q.txt" >> "$OUT/infer.txt"
    rm -f "$OUT/infer-cpu-q$q.txt" "$OUT/infer-cuda-q$q.txt"
done
# DPO (one pass over the vocabulary with per-row weights) on cuda:0 against the CPU, f32
for d in cpu cuda; do
    rm -rf "$OUT/dpo-$d"
    timeout 120 "$BUNDLE/anytune" rlhf --rlhf_type dpo --device $d --torch_dtype float32 --model demo/stories260K \
        --dataset tests/data/dpo/dpo_en_demo_8.json --max_steps 3 --logging_steps 1 --max_length 96 \
        --truncation_strategy left --per_device_train_batch_size 1 --lora_dropout 0 --output_dir "$OUT/dpo-$d" \
        > /dev/null 2>&1
    grep -ho '"loss":[^,]*' "$OUT"/dpo-$d/v*/logging.jsonl | cut -d: -f2 > "$OUT/dpo-$d.txt"
    rm -rf "$OUT/dpo-$d"
done
if paste "$OUT/dpo-cpu.txt" "$OUT/dpo-cuda.txt" | awk 'NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d;
        if (d > 1e-4 * ($1 < 0 ? -$1 : $1) + 1e-6) bad++ } END { exit !(n == 3 && !bad) }'; then
    echo "dpo: cuda:0 losses equal the CPU's (3 steps):" $(cat "$OUT/dpo-cuda.txt")
else
    echo "dpo: cuda:0 and the CPU differ:"; paste "$OUT/dpo-cpu.txt" "$OUT/dpo-cuda.txt"; rc=1
fi
cat "$OUT/dpo-cpu.txt" "$OUT/dpo-cuda.txt" >> "$OUT/infer.txt"
rm -f "$OUT/dpo-cpu.txt" "$OUT/dpo-cuda.txt"
if [ -x "$BUNDLE/bench_qgemv_gpu" ]; then
    timeout 60 "$BUNDLE/bench_qgemv_gpu" --ms 5 > "$OUT/bench_qgemv_gpu.txt" 2>&1
    echo "bench_qgemv_gpu: exit $?"
    cat "$OUT/bench_qgemv_gpu.txt"
else
    echo "bench_qgemv_gpu: not in $BUNDLE (scripts/gpu_bundle.sh PROGRAMS)"
fi
timeout 420 "$BUNDLE/bench_train_gpu" ${BENCH_ARGS:-} > "$OUT/bench_train_gpu.txt" 2>&1
echo "bench_train_gpu: exit $?"
cat "$OUT/bench_train_gpu.txt"
exit $rc
