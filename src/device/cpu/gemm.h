/* The CPU GEMM engine.
 *
 *   C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C
 *
 * Row-major with leading dimensions (elements between consecutive rows as
 * stored: for A with trans_a, stored rows are K rows of M elements, so
 * lda >= M). A and B are f32, bf16 or f16 independently; C is f32 or bf16.
 * Accumulation is in f32. beta == 0 ignores C's old contents. Threads with
 * OpenMP inside; call it from one thread. Picks its kernel at run time
 * (scalar, AVX2+FMA, AVX-512, AVX512_BF16) and may hand large problems to a
 * library when that measured faster here. */
#ifndef AT_DEVICE_CPU_GEMM_H
#define AT_DEVICE_CPU_GEMM_H

#include <stdint.h>
#include "device/dtype.h"

void at_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const void *A, at_dtype a_type, int64_t lda,
                 const void *B, at_dtype b_type, int64_t ldb,
                 float beta, void *C, at_dtype c_type, int64_t ldc);

/* Name of the engine in use for f32 and for bf16 ("anytune avx512", "oneDNN", ...). */
const char *at_cpu_gemm_engine(at_dtype compute);

#endif
