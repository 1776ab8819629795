/* The int8 decode of the quantized matmul with SDOT (ARMv8.2 dot product:
 * four int8 products summed into each int32 lane in one instruction), for
 * aarch64 CPUs that have it; the rest of the table is the NEON level's.
 * Same contract and the same float arithmetic as cpu_qmatmul_neon.c's. */
#include "device/cpu/cpu_qmatmul.h"

#include <arm_neon.h>
#include <string.h>

#include "device/quant.h"

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
        if (fmt == AT_Q8_0) {
            w0 = vld1q_s8((const int8_t *)blk + 2);
            w1 = vld1q_s8((const int8_t *)blk + 18);
        } else { /* low nibbles are values 0-15, high ones 16-31, each minus 8 */
            uint8x16_t q = vld1q_u8(blk + 2);
            w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
            w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
        }
        __fp16 h;
        memcpy(&h, blk, 2);
        float dw = (float)h;
        for (int m = 0; m < MM; m++) {
            const int8_t *xr = xq + m * K + 32 * b;
            int32x4_t s = vdotq_s32(vdotq_s32(vdupq_n_s32(0), vld1q_s8(xr), w0), vld1q_s8(xr + 16), w1);
            acc[m] = vfmaq_n_f32(acc[m], vcvtq_f32_s32(s), dw * xd[m * nb + b]);
        }
    }
    for (int m = 0; m < MM; m++) out[m] = vaddvq_f32(acc[m]);
}

static void gemv_i8(int M, int64_t K, const int8_t *xq, const float *xd, at_dtype t, const uint8_t *blocks,
                    float *out)
{
#define G(MM)                                                                                                          \
    if (t == AT_Q8_0) gemv_i8_body(MM, AT_Q8_0, K, xq, xd, blocks, out);                                              \
    else gemv_i8_body(MM, AT_Q4_0, K, xq, xd, blocks, out);
    AT_QGEMV_BY_M(G)
#undef G
}

const at_cpu_qgemv at_cpu_qgemv_neon_dotprod = {
    .gemv = at_cpu_gemv_f32_neon, .dotm = at_cpu_dotm_neon, .quant_x = at_cpu_quant_x_neon, .gemv_i8 = gemv_i8};
