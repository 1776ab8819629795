/* bf16 GEMM microkernel on BFMMLA (ARMv8.6 BF16), for aarch64 CPUs that have
 * it (Neoverse V1/V2/N2, Apple M2 and later, Graviton 3/4). Called only when
 * at_cpu_isa_level() == AT_ISA_NEON_BF16. Layouts: gemm_kernels.h, with
 * kp = 4: BFMMLA multiplies a 2x4 block of A (two rows of four k, one q
 * register) by a 4x2 block of B (two columns of four k) and adds the 2x2
 * result to four f32 lanes [r0c0 r0c1 r1c0 r1c1]. So a panel holds, for each
 * group of four k, its w lanes one after the other, four bf16 values each:
 *   panel[((k/4)·w + x)·4 + k%4]                                   (bf16)
 * and one 16-byte load gives two lanes' four k. Lanes past n and k past kc
 * are zero.
 *
 * Tile 10 x 8: 20 accumulators (5 row pairs x 4 column pairs), 4 registers
 * of B and 5 of A: 29 of the 32 q registers (12 x 8 needs 34: GCC loads all
 * of A first and spills three accumulators per k group). Per group of four
 * k: 9 loads and 20 BFMMLA (320 multiply-adds), 0.028 loads per FMA.
 *
 * Numerics: the product of two bf16 values is exact in f32. BFMMLA (FEAT_BF16
 * without EBF16) sums a lane's four products and the accumulator ignoring
 * the FPCR: each addition is rounded to odd (an error below one f32 ulp,
 * where an FMA's is half an ulp) and denormal inputs and results are
 * flushed to zero. So the bound on the accumulation is 2·K·2^-24 of
 * sum |a·b| instead of the FMA chain's K·2^-24. (test_gemm's tolerance, 1e-5
 * of that sum, is below either worst case for its large K; with random
 * signs the errors grow as sqrt(K), and the largest seen under qemu is 0.03
 * of the tolerance, as for the f32 kernels.)
 */
#include "device/cpu/gemm_kernels.h"

#include <arm_neon.h>
#include <string.h>

#include "device/cpu/gemm_neon_inl.h"

#define MR 10
#define NR 8
#define KP 4

static inline float load1(const char *p, at_dtype t, int64_t i)
{
    if (t == AT_F32) return ((const float *)p)[i];
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t == AT_BF16 ? at_bf16_to_f32(h) : at_f16_to_f32(h);
}

/* Packs as the header says, converting f32 and f16 values to bf16 (round to
 * nearest even: the compute format's rounding, so `round` adds nothing). */
static void pack_bf16(void *dst_, const void *src_, at_dtype t, int64_t sx, int64_t sk, int w, int64_t n, int64_t kc,
                      int round)
{
    (void)round;
    uint16_t *dst = dst_;
    const char *src = src_;
    int64_t kg = (kc + KP - 1) / KP;
    for (int64_t x0 = 0; x0 < n; x0 += w, dst += kg * KP * w) {
        for (int64_t g = 0; g < kg; g++) {
            uint16_t *d = dst + g * KP * w;
            for (int x = 0; x < w; x++) {
                for (int j = 0; j < KP; j++) {
                    int64_t k = g * KP + j;
                    uint16_t v = 0;
                    if (x0 + x < n && k < kc) {
                        int64_t i = (x0 + x) * sx + k * sk;
                        v = t == AT_BF16 ? ((const uint16_t *)src)[i] : at_f32_to_bf16(load1(src, t, i));
                    }
                    d[x * KP + j] = v;
                }
            }
        }
    }
}

/* The rows of two accumulators of adjacent column pairs j, j+1:
 * row 0 = [a0 a1 b0 b1], row 1 = [a2 a3 b2 b3]. */
static inline float32x4_t row_lo(float32x4_t a, float32x4_t b)
{
    return vreinterpretq_f32_f64(vzip1q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b)));
}
static inline float32x4_t row_hi(float32x4_t a, float32x4_t b)
{
    return vreinterpretq_f32_f64(vzip2q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b)));
}

static void kernel_bf16(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m,
                        int n, float alpha, float beta)
{
    const bfloat16_t *ap = ap_, *bp = bp_;
    /* c<i><j>: rows 2i, 2i+1 x columns 2j, 2j+1 (named: see gemm_neon.c) */
#define Z(i) float32x4_t c##i##0 = vdupq_n_f32(0), c##i##1 = c##i##0, c##i##2 = c##i##0, c##i##3 = c##i##0;
    Z(0) Z(1) Z(2) Z(3) Z(4)
#undef Z
    for (int64_t g = 0; g < kc; g += KP) {
        bfloat16x8_t b0 = vld1q_bf16(bp), b1 = vld1q_bf16(bp + 8), b2 = vld1q_bf16(bp + 16), b3 = vld1q_bf16(bp + 24);
#define ROW(i)                                                                                                         \
    {                                                                                                                  \
        bfloat16x8_t a = vld1q_bf16(ap + 8 * i);                                                                       \
        c##i##0 = vbfmmlaq_f32(c##i##0, a, b0);                                                                        \
        c##i##1 = vbfmmlaq_f32(c##i##1, a, b1);                                                                        \
        c##i##2 = vbfmmlaq_f32(c##i##2, a, b2);                                                                        \
        c##i##3 = vbfmmlaq_f32(c##i##3, a, b3);                                                                        \
    }
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4)
#undef ROW
        ap += MR * KP;
        bp += NR * KP;
    }
    if (ct == AT_F32 && m == MR && n == NR) { /* a whole f32 tile: straight from the registers */
        float *cr = c;
#define S(i)                                                                                                           \
    store4(cr + (2 * i) * ldc, row_lo(c##i##0, c##i##1), alpha, beta);                                                \
    store4(cr + (2 * i) * ldc + 4, row_lo(c##i##2, c##i##3), alpha, beta);                                            \
    store4(cr + (2 * i + 1) * ldc, row_hi(c##i##0, c##i##1), alpha, beta);                                            \
    store4(cr + (2 * i + 1) * ldc + 4, row_hi(c##i##2, c##i##3), alpha, beta);
        S(0) S(1) S(2) S(3) S(4)
#undef S
        return;
    }
    float t[MR * NR];
#define T(i)                                                                                                           \
    vst1q_f32(t + (2 * i) * NR, row_lo(c##i##0, c##i##1));                                                            \
    vst1q_f32(t + (2 * i) * NR + 4, row_lo(c##i##2, c##i##3));                                                        \
    vst1q_f32(t + (2 * i + 1) * NR, row_hi(c##i##0, c##i##1));                                                        \
    vst1q_f32(t + (2 * i + 1) * NR + 4, row_hi(c##i##2, c##i##3));
    T(0) T(1) T(2) T(3) T(4)
#undef T
    at_gemm_store_tile(t, NR, c, ct, ldc, m, n, alpha, beta);
}

/* Block sizes: the f32 kernel's in bytes (kc 512 values of 2 bytes). */
const at_gemm_blocked at_gemm_bf16_neon_bf16 = {
    .name = "neon+bf16", .mr = MR, .nr = NR, .kp = KP, .mc = 12 * MR, .kc = 512, .nc = 256 * NR,
    .pack = pack_bf16, .kernel = kernel_bf16,
};
