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

/* p[0..4) = alpha·v + beta·p (p not read when beta is 0) */
static inline void store4(float *p, float32x4_t v, float alpha, float beta)
{
    float32x4_t r = vmulq_n_f32(v, alpha);
    if (beta != 0.0f) r = vfmaq_n_f32(r, vld1q_f32(p), beta);
    vst1q_f32(p, r);
}

static void kernel_f32(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m, int n,
                       float alpha, float beta)
{
    const float *ap = ap_, *bp = bp_;
    /* named accumulators: an array of them is kept in memory by GCC (its
     * address escapes to the stores at the end), costing 12 stores per k */
#define Z(i) float32x4_t c##i##0 = vdupq_n_f32(0), c##i##1 = c##i##0, c##i##2 = c##i##0, c##i##3 = c##i##0;
    Z(0) Z(1) Z(2) Z(3) Z(4) Z(5)
#undef Z
    for (int64_t k = 0; k < kc; k++) {
        float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4), b2 = vld1q_f32(bp + 8), b3 = vld1q_f32(bp + 12);
        float32x4_t a0 = vld1q_f32(ap);
        float32x2_t a1 = vld1_f32(ap + 4);
        /* c_ij += a[i] * b_j, a[i] from lane i of a0 (i < 4) or i - 4 of a1 */
#define ROW(i, fma, av, lane)                                                                                          \
    c##i##0 = fma(c##i##0, b0, av, lane);                                                                              \
    c##i##1 = fma(c##i##1, b1, av, lane);                                                                              \
    c##i##2 = fma(c##i##2, b2, av, lane);                                                                              \
    c##i##3 = fma(c##i##3, b3, av, lane);
        ROW(0, vfmaq_laneq_f32, a0, 0) ROW(1, vfmaq_laneq_f32, a0, 1) ROW(2, vfmaq_laneq_f32, a0, 2)
        ROW(3, vfmaq_laneq_f32, a0, 3) ROW(4, vfmaq_lane_f32, a1, 0) ROW(5, vfmaq_lane_f32, a1, 1)
#undef ROW
        ap += MR;
        bp += NR;
    }
    if (ct == AT_F32 && m == MR && n == NR) { /* a whole f32 tile: straight from the registers */
        float *cr = c;
#define S(i)                                                                                                           \
    store4(cr + i * ldc, c##i##0, alpha, beta);                                                                        \
    store4(cr + i * ldc + 4, c##i##1, alpha, beta);                                                                    \
    store4(cr + i * ldc + 8, c##i##2, alpha, beta);                                                                    \
    store4(cr + i * ldc + 12, c##i##3, alpha, beta);
        S(0) S(1) S(2) S(3) S(4) S(5)
#undef S
        return;
    }
    float t[MR * NR];
#define T(i)                                                                                                           \
    vst1q_f32(t + i * NR, c##i##0);                                                                                    \
    vst1q_f32(t + i * NR + 4, c##i##1);                                                                                \
    vst1q_f32(t + i * NR + 8, c##i##2);                                                                                \
    vst1q_f32(t + i * NR + 12, c##i##3);
    T(0) T(1) T(2) T(3) T(4) T(5)
#undef T
    at_gemm_store_tile(t, NR, c, ct, ldc, m, n, alpha, beta);
}

const at_gemm_blocked at_gemm_f32_neon = {
    .name = "neon", .mr = MR, .nr = NR, .kp = 1, .mc = 24 * MR, .kc = 256, .nc = 128 * NR,
    .pack = at_gemm_pack_portable, .kernel = kernel_f32,
};
