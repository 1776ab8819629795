/* The GEMM engine's insides: what the driver (gemm.c) asks of each
 * instruction-set file (gemm_avx2.c, gemm_avx512.c, gemm_avx512bf16.c).
 * Only src/device/cpu/gemm*.c (and tests/test_gemm.c, for the rule of
 * at_gemm_sized_for_caches) include this.
 *
 * Blocked path (GotoBLAS/BLIS): op(A) is cut into panels of mr rows and op(B)
 * into panels of nr columns, each packed k-major so the microkernel reads
 * both with unit stride:
 *   kp == 1 (f32 panels):  panel[k*w + x]                      (f32)
 *   kp == 2 (bf16 pairs):  panel[(k/2)*2w + 2x + (k%2)]         (bf16)
 *   kp == 4 (bf16 quads):  panel[(k/4)*4w + 4x + (k%4)]         (bf16)
 * i.e. for bf16 pairs each 32-bit lane holds the pair (k, k+1) that one
 * vdpbf16ps multiplies and adds; quads are the 2x4 / 4x2 blocks of BFMMLA
 * (gemm_neon_bf16.c). Lanes past the valid count and the odd k
 * past kc are zero, so edge tiles need no special case in the inner loop.
 *
 * Small path: when M or N is tiny (decode with M = 1, LoRA rank 8) packing the
 * big operand would cost as much as the multiply, so it is streamed once in
 * place. The tiny operand is converted to an f32 buffer x[S][ldx] (S rows
 * padded with zeros to a multiple of AT_GEMM_SMALL_PAD, ldx a multiple of
 * 16, zero past K) and one of two primitives runs:
 *   dot:   out[r*ors + s*oss] = sum_k x[s][k] * y[r*ldy + k]     (y rows along k)
 *   axpy:  out[s*lds + l]     = sum_k x[s][k] * y[k*ldy + l]     (y rows along l)
 * where y is the big operand in its own dtype. For one row of x (decode)
 * dot reads one row of y at a time: a thread then reads one sequential
 * stream, and a model's weights come from memory (they do not fit in L3).
 * Zen 4, Qwen2.5-0.5B f16 decode: 26.9-27.6 tok/s, 99% of the copy
 * bandwidth, against 18.9-22.0 with 4 rows side by side (bench/infer). With
 * y resident in L3 (bench/gemm's decode rows repeat one matrix) 4 rows were
 * faster for bf16 (121 against 83-110 GFLOP/s), but that is not decoding.
 *
 * Outer-product path: when K is tiny and M, N are not (LoRA's rank-r update
 * (x·Aᵀ)·Bᵀ, its backward du·A), C is the big thing: packing panels and
 * cutting k into blocks only add passes over C. Both operands are converted
 * to f32 once (a[i][k], b[k][j], b's rows zero-padded to a multiple of
 * AT_GEMM_OUTER_PAD lanes) and one primitive writes each tile of C once:
 *   outer: C[i*ldc + j] = alpha * sum_k a[i*lda + k] * b[k*ldb + j] + beta * C[..]
 * for i < R, j < L, K <= AT_GEMM_OUTER_K, C f32 or bf16 (beta 0 does not
 * read C). The driver hands it chunks of L whose K rows of b fit in L1. */
#ifndef AT_DEVICE_CPU_GEMM_KERNELS_H
#define AT_DEVICE_CPU_GEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "device/dtype.h"

#define AT_GEMM_SMALL_PAD 8

/* How the axpy primitive walks y: lanes in chunks of AT_GEMM_AXPY_LC (the
 * chunk of out, S rows x LC f32 values, stays in L1/L2 while all of K
 * passes), and within a chunk at_gemm_axpy_kb(S) rows of y side by side.
 * Few rows for a small S: the step is bound by reading y, and each row read
 * at once is one more stream for the hardware prefetchers to follow (64 of
 * them left it waiting on memory: decode ran at 0.06x oneDNN); reloading
 * the out chunk from L1 between passes is cheap. More rows for a larger S,
 * where the FMAs bound the step and each reload of out is paid per row of x. */
#define AT_GEMM_AXPY_LC 1024
static inline int at_gemm_axpy_kb(int S) { return S <= 2 ? 8 : 64; }

/* Packs n lanes by kc values into ceil(n / w) consecutive panels of w lanes
 * (each kc rounded up to kp, times w values); source element (x, k) is
 * src[x*sx + k*sk] of type t (f32, bf16 or f16); lanes past n are zero.
 * round: round values to bf16 precision (f32 panels computing "in bf16"). */
typedef void (*at_gemm_pack_fn)(void *dst, const void *src, at_dtype t, int64_t sx, int64_t sk, int w, int64_t n,
                                int64_t kc, int round);
/* C[m x n] (m <= mr, n <= nr) = alpha * Apanel . Bpanel + beta * C, C of type
 * ct (f32 or bf16) with row stride ldc; beta == 0 does not read C. */
typedef void (*at_gemm_kernel_fn)(int64_t kc, const void *ap, const void *bp, void *c, at_dtype ct, int64_t ldc,
                                  int m, int n, float alpha, float beta);
/* A low-rank term added to an f32 tile of C once all of K is in it
 * (at_cpu_gemm_lowrank, gemm.h): C[i][j] += Σ_k u[i·ldu + k] · vt[k·ldvt + j]
 * for i < m, j < n, k < r, u and vt offset to the tile's rows and columns
 * (the caller's scale is in vt). */
typedef struct {
    const float *u, *vt;
    int64_t ldu, ldvt;
    int r;
} at_gemm_lowrank;
typedef void (*at_gemm_lowrank_fn)(float *c, int64_t ldc, int m, int n, const float *u, int64_t ldu,
                                   const float *vt, int64_t ldvt, int r);
typedef void (*at_gemm_dot_fn)(int S, int64_t K, const float *x, int64_t ldx, int64_t R, const void *y, at_dtype yt,
                               int64_t ldy, int round, float *out, int64_t ors, int64_t oss);
typedef void (*at_gemm_axpy_fn)(int S, int64_t K, const float *x, int64_t ldx, int64_t L, const void *y,
                                at_dtype yt, int64_t ldy, int round, float *out, int64_t lds);

typedef struct {
    const char *name;
    int mr, nr;     /* register tile: rows of C (broadcast side) x columns (vector side);
                     * nr divides 64 (cpu_qmatmul.c's column unit) */
    int kp;         /* 1: f32 panels; 2: bf16 pair panels */
    int mc, kc, nc; /* cache blocks (mc % mr == 0, nc % nr == 0, kc % kp == 0) */
    int l1_ref, l2_ref; /* KiB of L1d and L2 of the core mc and kc were measured on; on a
                         * core with less the driver cuts them (at_gemm_sized_for_caches);
                         * 0: never cut */
    at_gemm_pack_fn pack;
    at_gemm_kernel_fn kernel;
    at_gemm_lowrank_fn lowrank; /* read from the level's f32 engine for every product (gemm.c's
                                   lowrank_fn); NULL: gemm.c's portable loop */
} at_gemm_blocked;

typedef void (*at_gemm_outer_fn)(int64_t R, int64_t L, int K, const float *a, int64_t lda, const float *b,
                                 int64_t ldb, void *c, at_dtype ct, int64_t ldc, float alpha, float beta);

#define AT_GEMM_OUTER_K 64
#define AT_GEMM_OUTER_PAD 64

typedef struct {
    at_gemm_dot_fn dot;
    at_gemm_axpy_fn axpy;
    at_gemm_outer_fn outer;
} at_gemm_small;

/* Bytes per value of e's panels: bf16 (kp > 1) or f32. */
static inline size_t at_gemm_panel_esize(const at_gemm_blocked *e) { return e->kp > 1 ? 2 : 4; }

/* Portable pieces in gemm.c that the ISA files reuse: the packing routine
 * (f32 panels) and the write-back of an f32 tile acc[m][ld] into C. */
void at_gemm_pack_portable(void *dst, const void *src, at_dtype t, int64_t sx, int64_t sk, int w, int64_t n,
                           int64_t kc, int round);
void at_gemm_store_tile(const float *acc, int ld, void *c, at_dtype ct, int64_t ldc, int m, int n, float alpha,
                        float beta);

/* The packers' prefetch for the part of a source row they read next (bytes
 * at s, lanes contiguous): the same lanes `ahead` bytes further along the
 * row into L1, and those of the row `next` bytes away (the next group of
 * rows the packer reads side by side) into the outer caches; 0 skips
 * either. A group of rows is one contiguous block, and asking only along
 * the current rows left the start of every group to miss to memory:
 * packing a 4864x896 bf16 weight from memory on a Zen 4 core went from 6-12
 * to 17-24 GB/s with the next group's lines asked for. */
static inline void at_gemm_prefetch_row(const char *s, int bytes, size_t ahead, size_t next)
{
    for (int g = 0; g < bytes; g += 64) {
        if (ahead) __builtin_prefetch(s + ahead + g, 0, 3);
        if (next) __builtin_prefetch(s + next + g, 0, 1);
    }
}

/* e's cache blocks for a core with l1d_bytes of L1d and l2_bytes of L2 (0:
 * unknown, nothing cut): the rule is gemm.c's, tested in tests/test_gemm.c. */
at_gemm_blocked at_gemm_sized_for_caches(const at_gemm_blocked *e, long l1d_bytes, long l2_bytes);

/* For the ISA files' packers: pack_body(dst, src, t, sx, sk, W, n, kc, r)
 * with W the compile-time panel width MR or NR when w is one of them, so
 * that the loops over lanes unroll and a transpose stays in registers (the
 * caller's names: dst, src, sx, sk, w, n, kc, and its MR, NR, pack_body). */
#define AT_GEMM_PACK_BY_WIDTH(t, r)                                                                                    \
    do {                                                                                                               \
        if (w == MR) pack_body(dst, src, t, sx, sk, MR, n, kc, r);                                                     \
        else if (w == NR) pack_body(dst, src, t, sx, sk, NR, n, kc, r);                                                \
        else pack_body(dst, src, t, sx, sk, w, n, kc, r);                                                              \
    } while (0)

/* Defined in the ISA files; only used after at_cpu_isa_level() allows it. */
extern const at_gemm_blocked at_gemm_f32_avx2;
extern const at_gemm_blocked at_gemm_f32_avx512;
extern const at_gemm_blocked at_gemm_bf16_avx512bf16;
extern const at_gemm_small at_gemm_small_avx2;
extern const at_gemm_small at_gemm_small_avx512;
extern const at_gemm_small at_gemm_small_avx512bf16; /* dot on bf16 rows with vdpbf16ps */
void at_gemm_outer_avx512(int64_t R, int64_t L, int K, const float *a, int64_t lda, const float *b, int64_t ldb,
                          void *c, at_dtype ct, int64_t ldc, float alpha, float beta); /* its outer, shared */
/* aarch64 (gemm_neon.c) */
extern const at_gemm_blocked at_gemm_f32_neon;
extern const at_gemm_small at_gemm_small_neon;
extern const at_gemm_blocked at_gemm_bf16_neon_bf16; /* gemm_neon_bf16.c: BFMMLA, kp = 4 */
/* at_cpu_gemm_acc_bf16 (gemm.h) on vdpbf16ps. */
void at_gemm_acc_bf16_avx512bf16(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                                 int64_t ldb, int64_t M, int64_t N, int64_t K);
/* at_cpu_gemm_acc_bf16_pairs and the pair packers (gemm.h) on vdpbf16ps. */
void at_gemm_acc_bf16_pairs_avx512bf16(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *b,
                                       int64_t ldb, int64_t M, int64_t N, int64_t kp, int acc);
void at_gemm_bf16_pairs_in_rows_avx512bf16(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows,
                                           int64_t cols);
void at_gemm_bf16_pairs_of_rows_avx512bf16(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows,
                                           int64_t cols);
/* Frees the calling thread's scratch of at_gemm_small_avx512bf16. */
void at_gemm_bf16_release(void);

#endif
