/* NEON pieces shared by cpu_qmatmul_neon.c and cpu_qmatmul_neon_dotprod.c
 * (static inline; aarch64 only): a block's scale and bytes, and the int8
 * decode GEMV, whose block dot the including file supplies as
 * AT_NEON_DOT32(x0, x1, w0, w1) (int32x4_t lanes summing x·w over the 32
 * int8 pairs of a block), defined before this header is included. */
#ifndef AT_DEVICE_CPU_CPU_QMATMUL_NEON_INL_H
#define AT_DEVICE_CPU_CPU_QMATMUL_NEON_INL_H

#include <arm_neon.h>
#include <string.h>

#include "device/cpu/cpu_qmatmul.h"
#include "device/quant.h"

static inline float f16_scale(const uint8_t *p)
{
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* The 32 values of one Q8_0 / Q4_0 block as signed bytes: Q8_0's as stored,
 * Q4_0's nibbles (low ones are values 0-15, high ones 16-31) minus 8. */
static inline void block_bytes(const int fmt, const uint8_t *blk, int8x16_t *q0, int8x16_t *q1)
{
    if (fmt == AT_Q8_0) {
        *q0 = vld1q_s8((const int8_t *)blk + 2);
        *q1 = vld1q_s8((const int8_t *)blk + 18);
    } else {
        uint8x16_t q = vld1q_u8(blk + 2);
        *q0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
        *q1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
    }
}

static inline __attribute__((always_inline)) void gemv_i8_body(const int MM, const int fmt, int64_t K,
                                                               const int8_t *xq, const float *xd,
                                                               const uint8_t *blk, float *out)
{
    float32x4_t acc[8];
    for (int m = 0; m < MM; m++) acc[m] = vdupq_n_f32(0.0f);
    const int64_t nb = K / 32;
    const size_t bb = fmt == AT_Q8_0 ? 2 + AT_QK8_0 : 2 + AT_QK4_0 / 2;
    for (int64_t b = 0; b < nb; b++, blk += bb) {
        int8x16_t w0, w1;
        block_bytes(fmt, blk, &w0, &w1);
        float dw = f16_scale(blk);
        for (int m = 0; m < MM; m++) {
            const int8_t *xr = xq + m * K + 32 * b;
            int32x4_t s = AT_NEON_DOT32(vld1q_s8(xr), vld1q_s8(xr + 16), w0, w1);
            acc[m] = vfmaq_n_f32(acc[m], vcvtq_f32_s32(s), dw * xd[m * nb + b]);
        }
    }
    for (int m = 0; m < MM; m++) out[m] = vaddvq_f32(acc[m]);
}

static void neon_gemv_i8(int M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xc, at_dtype t,
                         const uint8_t *blocks, float *out)
{
    (void)xc; /* the nibbles are made signed here (vsub) */
#define G(MM)                                                                                                          \
    if (t == AT_Q8_0) gemv_i8_body(MM, AT_Q8_0, K, xq, xd, blocks, out);                                              \
    else gemv_i8_body(MM, AT_Q4_0, K, xq, xd, blocks, out);
    AT_QGEMV_BY_M(G)
#undef G
}

#endif
