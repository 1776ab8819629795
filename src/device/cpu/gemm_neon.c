/* Advanced SIMD (NEON) GEMM microkernel on f32 panels, for aarch64. Packing
 * is the portable routine's (gemm.c). Called only when at_cpu_isa_level() >=
 * AT_ISA_NEON. Layouts: gemm_kernels.h.
 *
 * Tile 6 x 16 (16 divides the qmatmul's column unit, 64): 24 of the 32 q
 * registers accumulate (6 rows x 4 vectors of 4 columns), 4 hold the B row and
 * 2 the 6 values of A, whose lanes FMLA (by element) broadcasts itself.
 * Per k: 6 loads and 24 FMLA (96 FMAs), 0.0625 loads per FMA. */
#include "device/cpu/gemm_kernels.h"

#include <arm_neon.h>

#define MR 6
#define NR 16

static void kernel_f32(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m, int n,
                       float alpha, float beta)
{
    const float *ap = ap_, *bp = bp_;
    float32x4_t acc[MR][4];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < kc; k++) {
        float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4), b2 = vld1q_f32(bp + 8), b3 = vld1q_f32(bp + 12);
        float32x4_t a0 = vld1q_f32(ap);
        float32x2_t a1 = vld1_f32(ap + 4);
        /* acc[i][j] += a[i] * b_j, a[i] from lane i of a0 (i < 4) or i - 4 of a1 */
#define ROW(i, fma, av, lane)                                                                                          \
    acc[i][0] = fma(acc[i][0], b0, av, lane);                                                                          \
    acc[i][1] = fma(acc[i][1], b1, av, lane);                                                                          \
    acc[i][2] = fma(acc[i][2], b2, av, lane);                                                                          \
    acc[i][3] = fma(acc[i][3], b3, av, lane);
        ROW(0, vfmaq_laneq_f32, a0, 0) ROW(1, vfmaq_laneq_f32, a0, 1) ROW(2, vfmaq_laneq_f32, a0, 2)
        ROW(3, vfmaq_laneq_f32, a0, 3) ROW(4, vfmaq_lane_f32, a1, 0) ROW(5, vfmaq_lane_f32, a1, 1)
#undef ROW
        ap += MR;
        bp += NR;
    }
    if (ct == AT_F32 && m == MR && n == NR) {
        float *cr = c;
        for (int i = 0; i < MR; i++) {
            float *p = cr + i * ldc;
            for (int j = 0; j < 4; j++) {
                float32x4_t r = vmulq_n_f32(acc[i][j], alpha);
                if (beta != 0.0f) r = vfmaq_n_f32(r, vld1q_f32(p + 4 * j), beta);
                vst1q_f32(p + 4 * j, r);
            }
        }
        return;
    }
    float t[MR * NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) vst1q_f32(t + i * NR + 4 * j, acc[i][j]);
    at_gemm_store_tile(t, NR, c, ct, ldc, m, n, alpha, beta);
}

const at_gemm_blocked at_gemm_f32_neon = {
    .name = "neon", .mr = MR, .nr = NR, .kp = 1, .mc = 24 * MR, .kc = 256, .nc = 128 * NR,
    .pack = at_gemm_pack_portable, .kernel = kernel_f32,
};
