/* AVX2+FMA GEMM microkernel on f32 panels: a 6x16 tile in 12 ymm
 * accumulators, per k two B vectors and six broadcasts of A. Packing is the
 * driver's portable code. Called only when at_cpu_isa_level() >= AT_ISA_AVX2.
 * Layouts: gemm_kernels.h. */
#include "device/cpu/gemm_kernels.h"

#include <immintrin.h>

#define MR 6
#define NR 16

static void kernel_f32(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m, int n,
                       float alpha, float beta)
{
    const float *ap = ap_, *bp = bp_;
#define Z(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps();
    Z(0) Z(1) Z(2) Z(3) Z(4) Z(5)
#undef Z
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#define F(i)                                                                                                           \
    {                                                                                                                  \
        __m256 a = _mm256_broadcast_ss(ap + i);                                                                        \
        c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);                                                                     \
        c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);                                                                     \
    }
        F(0) F(1) F(2) F(3) F(4) F(5)
#undef F
        ap += MR;
        bp += NR;
    }
    if (ct == AT_F32 && m == MR && n == NR) {
        __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
        float *cr = c;
#define S(i)                                                                                                           \
    {                                                                                                                  \
        float *p = cr + i * ldc;                                                                                       \
        __m256 r0 = _mm256_mul_ps(va, c##i##0), r1 = _mm256_mul_ps(va, c##i##1);                                        \
        if (beta != 0.0f) {                                                                                            \
            r0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(p), r0);                                                          \
            r1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(p + 8), r1);                                                      \
        }                                                                                                              \
        _mm256_storeu_ps(p, r0);                                                                                       \
        _mm256_storeu_ps(p + 8, r1);                                                                                   \
    }
        S(0) S(1) S(2) S(3) S(4) S(5)
#undef S
        return;
    }
    float t[MR * NR];
#define T(i)                                                                                                           \
    _mm256_storeu_ps(t + i * NR, c##i##0);                                                                             \
    _mm256_storeu_ps(t + i * NR + 8, c##i##1);
    T(0) T(1) T(2) T(3) T(4) T(5)
#undef T
    at_gemm_store_tile(t, NR, c, ct, ldc, m, n, alpha, beta);
}

const at_gemm_blocked at_gemm_f32_avx2 = {
    .name = "avx2", .mr = MR, .nr = NR, .kp = 1, .mc = 24 * MR, .kc = 256, .nc = 128 * NR,
    .pack = at_gemm_pack_portable, .kernel = kernel_f32,
};
