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
 * f32 otherwise. The forward of up to 4 rows of A (decode) skips the
 * packing: each row of W is dequantized once and dotted with the rows of A.
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

#endif
