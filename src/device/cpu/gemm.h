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
 * library when that measured faster here.
 *
 * Compute format: where the CPU multiplies bf16 natively (at_cpu_fast_bf16:
 * AVX512_BF16's vdpbf16ps, ARM's BFMMLA) and A or B is bf16, both are
 * rounded to bf16 (the other one converted when packed) and multiplied with
 * f32 accumulation. Elsewhere bf16 and f16 inputs are widened to f32 (exact)
 * and the product runs in f32 FMA: rounding the f32 operand there would
 * cost as much as f32's product and only lose precision, so a bf16 model on
 * such a CPU computes as its f32 copy would, from half the memory.
 * With alpha == 0 or K == 0, A and B are not read (C = beta · C). */
#ifndef AT_DEVICE_CPU_GEMM_H
#define AT_DEVICE_CPU_GEMM_H

#include <stdint.h>
#include "base/status.h"
#include "device/dtype.h"

void at_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const void *A, at_dtype a_type, int64_t lda,
                 const void *B, at_dtype b_type, int64_t ldb,
                 float beta, void *C, at_dtype c_type, int64_t ldc);

/* The same, returning AT_ERR_INVALID (with a message naming the bad
 * argument) for unsupported dtypes, negative sizes, leading dimensions too
 * small, or NULL pointers; C is left untouched then. at_cpu_gemm does the
 * same checks and records the message, but cannot report it. */
at_status at_cpu_gemm_checked(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                              const void *A, at_dtype a_type, int64_t lda,
                              const void *B, at_dtype b_type, int64_t ldb,
                              float beta, void *C, at_dtype c_type, int64_t ldc);

/* at_cpu_gemm_checked plus a low-rank term:
 *   C = alpha · op(A) · op(B) + beta · C + s · U · Vᵀ
 * U [M, r] and V [N, r] f32, row-major with leading dimensions ldu, ldv >= r
 * (LoRA's y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with U = x·Aᵀ, V = B). Where the product
 * runs on our blocked kernels into an f32 C, each tile of C takes the term
 * while the kernel has just written it (not a pass over C from memory);
 * elsewhere the two products. r == 0 or s == 0: at_cpu_gemm_checked. */
at_status at_cpu_gemm_lowrank(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                              at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb, float beta,
                              void *C, at_dtype c_type, int64_t ldc, const float *u, int64_t ldu, const float *v,
                              int64_t ldv, int r, float s);

/* at_cpu_gemm_checked on our kernels, whatever engine the calibration
 * chose for the shape: for a caller inside its own parallel region, where
 * each call runs on the calling thread (a library would start threads of
 * its own there). */
at_status at_cpu_gemm_ours(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                           at_dtype a_type, int64_t lda, const void *B, at_dtype b_type, int64_t ldb, float beta,
                           void *C, at_dtype c_type, int64_t ldc);

/* Small products in bf16, as attention's tiles take them:
 *   C[m, :N] += Σ_k bf16(A(m, k)) · bf16(B[k, :N])   for m < M, k < K,
 * with A(m, k) = a[m·a_rs + k·a_cs] (a_cs == 1, or a transposed A with
 * a_rs == 1), B's rows ldb apart, bf16() rounding to nearest even. Each
 * product is exact in f32 and the sums are f32, in an order that depends on
 * the ISA level (vdpbf16ps adds pairs of k). Any sizes; no allocation. */
void at_cpu_gemm_acc_bf16(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                          int64_t ldb, int64_t M, int64_t N, int64_t K);
/* 1 when at_cpu_gemm_acc_bf16 runs on bf16 dot-product instructions at the
 * current ISA level (vdpbf16ps); 0 when it rounds copies of its operands and
 * runs the f32 kernel, which a caller holding operands already rounded can
 * skip (gemm_acc of the simd table gives the same products). */
int at_cpu_gemm_acc_bf16_native(void);

/* Pair panels, for a caller that multiplies the same bf16 operand several
 * times (attention's blocks): packed once, then taken by
 * at_cpu_gemm_acc_bf16_pairs without further conversion. A panel is 32-bit
 * words, word [p·ld + lane] holding two values rounded to bf16 (to nearest
 * even), the first in its low half. Of a block X[r][c] (r < rows, c < cols,
 * rows rs apart, each row's cols values contiguous):
 *   pairs in rows:  word [p·ld + r] = (X[r][2p], X[r][2p + 1])  (k along c, lanes r)
 *   pairs of rows:  word [p·ld + c] = (X[2p][c], X[2p + 1][c])  (k along r, lanes c)
 * for p < ceil(k / 2); a missing second value is 0, and so are the lanes
 * from the last one up to the next multiple of 16 (ld must reach it). */
void at_cpu_bf16_pairs_in_rows(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows, int64_t cols);
void at_cpu_bf16_pairs_of_rows(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows, int64_t cols);

/* C[m, n] = (acc ? C[m, n] : 0) + Σ_{p < kp} (a[p·lda + m] · b[p·ldb + n]
 * summed over both halves of the words), m < M, n < N: the product of two
 * pair panels, each product exact in f32 and the sums f32 (vdpbf16ps where
 * at_cpu_gemm_acc_bf16_native(), else plain f32 arithmetic on the same
 * values). */
void at_cpu_gemm_acc_bf16_pairs(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *b,
                                int64_t ldb, int64_t M, int64_t N, int64_t kp, int acc);

/* The engine keeps its packing buffers per thread between calls (a few MB
 * at most per thread), and so do the quantized matmuls (cpu_qmatmul.c) and
 * the bf16 kernels. This frees the calling thread's; the next call
 * allocates again. */
void at_cpu_gemm_release_buffers(void);

/* Marks the calling thread as holding such buffers, so they are freed when
 * it ends (a pthread key's destructor calls at_cpu_gemm_release_buffers in
 * the ending thread). Threads come and go under the CPU kernels: a server's
 * connection thread that runs a forward starts its own OpenMP team, whose
 * workers end with it. Every allocation of a per-thread buffer calls this. */
void at_cpu_thread_buffers_held(void);

/* Name of the engine in use for f32 and for bf16 ("anytune avx512", "oneDNN",
 * "measured per shape class (...)"; static storage). */
const char *at_cpu_gemm_engine(at_dtype compute);

/* Pins the engine for f32 x f32 -> f32 problems: "anytune" (our kernels),
 * "onednn" (dnnl_sgemm) or "openblas" (cblas_sgemm), where the build has
 * them, or "auto" (the default: measured per class of problem on this
 * machine, see gemm_tune.h). The environment variable ANYTUNE_GEMM_F32 sets
 * the same at start. bf16 accepts only "anytune". Returns
 * AT_ERR_UNSUPPORTED for an engine this build lacks (nothing changes then). */
at_status at_cpu_gemm_use_engine(at_dtype compute, const char *name);

/* Measures (or reads from the cache) the f32 engine of every problem class,
 * when measuring is on and no engine is pinned; returns 0 otherwise. Then
 * at_gemm_tune_result_of (gemm_tune.h) has the figures. */
int at_cpu_gemm_tune_all(void);

#endif
