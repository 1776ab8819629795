#!/bin/sh
# Prepares the GPU checks of the CUDA backend for a machine that has an
# NVIDIA GPU but not the project's Debian libraries nor a network (such as a
# lent GPU machine): builds here, for one CUDA architecture (ARCH, default
# 90-real: H100/H200), without the optional GEMM libraries and the emulator,
# and copies the programs with the shared libraries they use into
# gpu-bundle/ (git ignores it). Then, on the GPU machine, from the repository
# root:   sh scripts/gpu_check.sh gpu-bundle OUT_DIR
set -eu
ARCH=${ARCH:-90-real}
B=build-gpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DANYTUNE_GEMM_LIBS=OFF -DANYTUNE_CUDA_EMULATOR=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > /dev/null
PROGRAMS="anytune test_conformance test_backward test_train test_train_neftune bench_train_gpu bench_qgemv_gpu"
cmake --build $B -j"$(nproc)" --target anytune_cuda $PROGRAMS
rm -rf gpu-bundle
mkdir -p gpu-bundle/lib
for p in $PROGRAMS; do cp $B/$p gpu-bundle/; done
cp $B/libanytune_cuda.so gpu-bundle/
# every shared library they load except glibc's, the GCC runtime, the driver
# and the CUDA toolkit's own (cuBLAS: the GPU machine has the toolkit)
for f in gpu-bundle/*; do [ -f "$f" ] && ldd "$f"; done | awk '/=> \// { print $3 }' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libcudart)\.so' |
    while read -r lib; do cp -L "$lib" gpu-bundle/lib/; done
du -sh gpu-bundle
