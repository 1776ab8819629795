/* CPU matmul with a quantized weight (Q8_0, Q4_0, NF4; device/quant.h):
 *
 *   forward        C = alpha · op(A) · Wᵀ + beta · C   (trans_b = 1: x · Wᵀ)
 *   input backward C = alpha · op(A) · W  + beta · C   (trans_b = 0: dy · W)
 *
 * W is a 2-D weight [out, in] quantized along its rows (in a multiple of the
 * block size). It is never dequantized whole: the GEMM engine's blocked loop
 * (gemm_kernels.h) runs with a B packer that dequantizes, with the ISA's
 * SIMD, one register panel of W (NR rows × KC values, or KC rows × 64
 * values) into a small f32 tile and packs that as the engine packs any B.
 * A is packed once per cache block as in a plain GEMM, so the cost above a
 * bf16/f32 GEMM of the same shape is one dequantization of each weight value
 * per NC×KC block. The compute format is the one at_matmul documents for
 * the inputs: bf16 when A is bf16 (the dequantized W rounded to bf16),
 * f32 otherwise. The forward of up to 8 rows of A (decode) skips the
 * packing: each row of W is read once and dotted with the rows of A; with
 * AVX2 and Q8_0 / Q4_0 weights those rows are quantized to int8 first and
 * the dots are integer (as llama.cpp decodes: the weights stay exact, not
 * rounded to bf16, and A's rounding error is bounded below, at_cpu_qgemv).
 * Without AVX2 the weight is dequantized a panel (64 rows or columns) at a
 * time into f32 and handed to at_cpu_gemm. */
#ifndef AT_DEVICE_CPU_CPU_QMATMUL_H
#define AT_DEVICE_CPU_CPU_QMATMUL_H

#include <stdint.h>
#include "device/backend.h"

/* Same contract as at_cpu_matmul (ops/ops.h at_matmul) with b quantized:
 * b 2-D (leading dimensions of 1 allowed), c f32 or bf16, a f32/bf16/f16
 * with any batch. Returns AT_ERR_INVALID for an NF4 weight without a valid
 * header or a row length that is not a multiple of the block, AT_ERR_NOMEM
 * when the work buffers cannot be had. */
at_status at_cpu_qmatmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b,
                         float alpha, float beta);

/* The dequantizers of one instruction set: y gets the f32 values of nblk
 * consecutive blocks (32 values for q8_0 / q4_0, 64 for NF4, whose block
 * scales absmax[] are already decoded, see at_nf4_absmax). */
typedef struct {
    const char *name;
    void (*q8_0)(float *y, const uint8_t *blocks, int64_t nblk);
    void (*q4_0)(float *y, const uint8_t *blocks, int64_t nblk);
    void (*nf4)(float *y, const uint8_t *nibbles, const float *absmax, int64_t nblk);
} at_cpu_qdeq;

/* The table for at_cpu_isa_level(): scalar (the quant.c row helpers), AVX2
 * or AVX-512. */
const at_cpu_qdeq *at_cpu_qdeq_get(void);

/* Defined in cpu_qmatmul_avx2.c / cpu_qmatmul_avx512.c; used only when the
 * ISA level allows. */
extern const at_cpu_qdeq at_cpu_qdeq_avx2;
extern const at_cpu_qdeq at_cpu_qdeq_avx512;
extern const at_cpu_qdeq at_cpu_qdeq_neon; /* aarch64: cpu_qmatmul_neon.c */

/* The decode kernels of one instruction set (the forward of M <= 8 rows):
 *   gemv: out[m] = sum_k x[m·K + k] · w[k] for m < M, w one row of W read in
 *         place as K / 32 Q8_0 or Q4_0 blocks (t), each value dequantized in
 *         registers as the dequantizers do it;
 *   dotm: the same over a row already dequantized to f32 (NF4 rows);
 * each weight value rounded to bf16 first when round (computing in bf16).
 * With Q8_0 / Q4_0 weights the forward of M <= 8 rows runs on int8
 * activations instead, as llama.cpp does (bound by reading W, a decode step
 * then spends no time converting weights to f32):
 *   quant_x: each block of 32 values of x (n of them) as int8 q and a scale
 *         d = max|x| / 127 (0 for a block of zeros), q = rint(x / d) in
 *         [-127, 127], so |x − d·q| <= d/2 (plus f32 rounding of 1/d);
 *   gemv_i8: out[m] = sum over blocks b of d_w[b] · xd[m][b] · (the exact
 *         integer dot of the block's int8 weights and activations), xq and
 *         xd being quant_x's output for row m at xq + m·K, xd + m·K/32.
 *         For Q4_0 weights xc (K/4 per row, at xc + m·K/4) holds −8 × the
 *         sum of each group of 4 int8 values of x (at_cpu_qgemv_xc): the
 *         kernels multiply x by the unsigned nibbles n (0..15) and add it,
 *         since x·(n − 8) = x·n − 8·Σx, exactly in integers. Unused (may be
 *         NULL) for Q8_0.
 * Its result differs from the f32 product by at most
 * sum_b xd_b / 2 · sum_{i in b} |w_i| plus f32 accumulation.
 * K is a multiple of 32; 1 <= M <= 8. */
typedef struct {
    void (*gemv)(int M, int64_t K, const float *x, at_dtype t, const uint8_t *blocks, int round, float *out);
    void (*dotm)(int M, int64_t K, const float *x, const float *row, int round, float *out);
    void (*quant_x)(int64_t n, const float *x, int8_t *q, float *d);
    void (*gemv_i8)(int M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xc, at_dtype t,
                    const uint8_t *blocks, float *out);
} at_cpu_qgemv;
/* xc[i] = −8 · (q[4i] + q[4i+1] + q[4i+2] + q[4i+3]) for i < n / 4. */
void at_cpu_qgemv_xc(int64_t n, const int8_t *q, int32_t *xc);
extern const at_cpu_qgemv at_cpu_qgemv_avx2;
extern const at_cpu_qgemv at_cpu_qgemv_avx512;
/* aarch64: NEON (cpu_qmatmul_neon.c) and NEON with SDOT for the int8 decode
 * (cpu_qmatmul_neon_dotprod.c, which shares the rest) */
extern const at_cpu_qgemv at_cpu_qgemv_neon;
extern const at_cpu_qgemv at_cpu_qgemv_neon_dotprod;
void at_cpu_gemv_f32_neon(int M, int64_t K, const float *x, at_dtype t, const uint8_t *blocks, int round, float *out);
void at_cpu_dotm_neon(int M, int64_t K, const float *x, const float *row, int round, float *out);
void at_cpu_quant_x_neon(int64_t n, const float *x, int8_t *q, float *d);
/* AVX-512 with AVX512_VNNI: its own gemv_i8 (two blocks per register). */
extern const at_cpu_qgemv at_cpu_qgemv_avx512vnni;
/* The int8-activation kernels of both levels without VNNI
 * (cpu_qmatmul_avx2.c; a block of 32 fills a 256-bit register). */
void at_cpu_quant_x_avx2(int64_t n, const float *x, int8_t *q, float *d);
void at_cpu_gemv_i8_avx2(int M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xc, at_dtype t,
                         const uint8_t *blocks, float *out);
/* out[m] = block b alone (blk points at it) of gemv_i8's sum, m < M. */
void at_cpu_gemv_i8_block_avx2(int M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xc, at_dtype t,
                               const uint8_t *blk, int64_t b, float *out);

/* Whether the decode path (M <= 8 rows, Q8_0 / Q4_0 weights) runs on int8
 * activations at the current ISA level, so that its bound above applies. */
int at_cpu_qmatmul_int8_decode(void);

/* In inference (the calling thread marked by at_cpu_qmatmul_inference:
 * nothing differentiates through the products, so forward and backward
 * cannot disagree), the forward of more rows (prefill) with Q8_0 / Q4_0
 * weights and f32 activations (not transposed) runs on int8 activations as
 * well at the AVX2 level, where integer dots outrun f32 FMAs on dequantized
 * weights (llama.cpp does the same): op(A)'s rows quantized once by
 * quant_x, the same exact integer block dots and per-block scales as
 * gemv_i8, so the same bound. Training (QLoRA) keeps the f32 arithmetic of
 * the dequantized weight. Packed 8 rows of W at a time:
 *   qpack8: rows[l] (l < 8; NULL: a row of zeros) -> wp (K · 8 bytes;
 *           K · 16 for Q8_0: the values and their magnitudes), wd
 *           (K / 32 · 8 scales), laid out for qgemm8 (cpu_qmatmul_avx2.c);
 *   qgemm8: out[m·8 + l] = sum over blocks b of wd · xd[m][b] · (integer
 *           dot of row l's block and x's), m < M; xs[m·K/32 + b] = −8 ×
 *           the sum of x's int8 block (Q4_0; unused for Q8_0).
 * Whether that path runs, in inference, for activations of dtype a at the
 * current level: */
int at_cpu_qmatmul_int8_prefill(at_dtype a);
/* Marks the calling thread's quantized products as inference (on = 1) or
 * not (0, the default); returns the previous mark. */
int at_cpu_qmatmul_inference(int on);
void at_cpu_qpack8_avx2(at_dtype t, const uint8_t *const rows[8], int64_t K, uint8_t *wp, float *wd);
void at_cpu_qgemm8_avx2(at_dtype t, int64_t M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xs,
                        const uint8_t *wp, const float *wd, float *out);

/* For the ISA files: runs call(MM) with MM the compile-time constant equal
 * to M (1..8), so that each copy of a kernel keeps its accumulators in
 * registers. */
#define AT_QGEMV_BY_M(call)                                                                                            \
    switch (M) {                                                                                                       \
    case 1: call(1); break;                                                                                            \
    case 2: call(2); break;                                                                                            \
    case 3: call(3); break;                                                                                            \
    case 4: call(4); break;                                                                                            \
    case 5: call(5); break;                                                                                            \
    case 6: call(6); break;                                                                                            \
    case 7: call(7); break;                                                                                            \
    default: call(8); break;                                                                                           \
    }

/* Frees the calling thread's work buffers of the quantized matmuls (see
 * at_cpu_gemm_release_buffers, which calls this). */
void at_cpu_qmatmul_release_buffers(void);

#endif
