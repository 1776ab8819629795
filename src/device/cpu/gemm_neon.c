/* Advanced SIMD (NEON) GEMM pieces for aarch64: the microkernel on f32
 * panels (packing is the portable routine's, gemm.c) and the small path's
 * dot / axpy primitives for decode and LoRA shapes (the big operand f32,
 * bf16 or f16, widened in registers). Called only when at_cpu_isa_level()
 * >= AT_ISA_NEON. Layouts: gemm_kernels.h.
 *
 * Tile 6 x 16 (16 divides the qmatmul's column unit, 64): 24 of the 32 q
 * registers accumulate (6 rows x 4 vectors of 4 columns), 4 hold the B row and
 * 2 the 6 values of A, whose lanes FMLA (by element) broadcasts itself.
 * Per k: 6 loads and 24 FMLA (96 FMAs), 0.0625 loads per FMA. */
#include "device/cpu/gemm_kernels.h"

#include <arm_neon.h>

#include "device/cpu/gemm_neon_inl.h"

#define MR 6
#define NR 16

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

/* ---- small path (contract: gemm_kernels.h) ----
 * The tiles of gemm_avx2.c's with 4 lanes and up to twice the accumulators
 * (32 q registers). Accumulators are named variables, guarded by the tile's
 * compile-time sizes: an array of them is kept in memory by GCC once the
 * loops over it are not all unrolled (a spill per FMA). */
#define L8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define L4(M) M(0) M(1) M(2) M(3)
#define P8(M, a) M(a, 0) M(a, 1) M(a, 2) M(a, 3) M(a, 4) M(a, 5) M(a, 6) M(a, 7)
#define P4(M, a) M(a, 0) M(a, 1) M(a, 2) M(a, 3)
#define ALL88(M) P8(M, 0) P8(M, 1) P8(M, 2) P8(M, 3) P8(M, 4) P8(M, 5) P8(M, 6) P8(M, 7)
#define ALL84(M) P4(M, 0) P4(M, 1) P4(M, 2) P4(M, 3) P4(M, 4) P4(M, 5) P4(M, 6) P4(M, 7)

/* RR (<= 8) rows of y against SS (<= 8) rows of x (RR·SS <= 8), dot products
 * along k in 4 lanes; only the first sv of the SS results per row are
 * stored. x rows are zero-padded to a multiple of 16, so they are read
 * whole; y's tail of k goes through load4's zeroed copy. */
static inline __attribute__((always_inline)) void dot_tile(const int RR, const int SS, int64_t K, const float *x,
                                                           int64_t ldx, const char *y, const at_dtype yt,
                                                           int64_t ldy, const int round, float *out, int64_t ors,
                                                           int64_t oss, int sv)
{
    size_t es = yt == AT_F32 ? 4 : 2;
#define DECL(r, s) float32x4_t c##r##s = vdupq_n_f32(0.0f);
    ALL88(DECL)
#undef DECL
#define FM(r, s)                                                                                                       \
    if (RR > r && SS > s) c##r##s = vfmaq_f32(c##r##s, vld1q_f32(x + s * ldx + k), y##r);
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        float32x4_t y0 = vdupq_n_f32(0.0f), y1 = y0, y2 = y0, y3 = y0, y4 = y0, y5 = y0, y6 = y0, y7 = y0;
#define LY(r)                                                                                                          \
    if (RR > r) y##r = load4_full(y + (size_t)(r * ldy + k) * es, yt);                                                \
    if (RR > r && round) y##r = round_bf16(y##r);
        L8(LY)
#undef LY
        ALL88(FM)
    }
    if (k < K) {
        float32x4_t y0 = vdupq_n_f32(0.0f), y1 = y0, y2 = y0, y3 = y0, y4 = y0, y5 = y0, y6 = y0, y7 = y0;
#define LY(r)                                                                                                          \
    if (RR > r) y##r = load4(y + (size_t)(r * ldy + k) * es, yt, K - k, round);
        L8(LY)
#undef LY
        ALL88(FM)
    }
#undef FM
#define RED(r, s)                                                                                                      \
    if (RR > r && SS > s && s < sv) out[r * ors + s * oss] = vaddvq_f32(c##r##s);
    ALL88(RED)
#undef RED
}

static inline __attribute__((always_inline)) void dot_body(int S, int64_t K, const float *x, int64_t ldx, int64_t R,
                                                           const void *y_, const at_dtype yt, int64_t ldy,
                                                           const int round, float *out, int64_t ors, int64_t oss)
{
    const char *y = y_;
    size_t es = yt == AT_F32 ? 4 : 2;
    for (int s0 = 0; s0 < S; s0 += 8) {
        int sv = S - s0 < 8 ? S - s0 : 8;
        const float *xs = x + s0 * ldx;
        float *os = out + s0 * oss;
        int64_t r = 0;
#define RUN(RR, SS)                                                                                                    \
    for (; r + RR <= R; r += RR)                                                                                       \
        dot_tile(RR, SS, K, xs, ldx, y + (size_t)(r * ldy) * es, yt, ldy, round, os + r * ors, ors, oss, sv);         \
    for (; r < R; r++) dot_tile(1, SS, K, xs, ldx, y + (size_t)(r * ldy) * es, yt, ldy, round, os + r * ors, ors, oss, sv);
        if (sv <= 1) { RUN(8, 1) }
        else if (sv <= 2) { RUN(4, 2) }
        else if (sv <= 4) { RUN(2, 4) }
        else { RUN(1, 8) }
#undef RUN
    }
}

#define AXPY_KB 64

/* The first n (clamped to 0..4) lanes of v to d. */
static inline void store_part(float *d, int64_t n, float32x4_t v)
{
    if (n >= 4) vst1q_f32(d, v);
    else if (n > 0) {
        float t[4];
        vst1q_f32(t, v);
        memcpy(d, t, (size_t)n * sizeof(float));
    }
}

/* The first n (clamped to 0..4) floats at p, the rest 0. */
static inline float32x4_t load_part(const float *p, int64_t n)
{
    return load4((const char *)p, AT_F32, n, 0);
}

/* out[s][0..lv) (+)= sum over kb (<= AXPY_KB) rows k of x[s][k] * y[k][..]
 * for SS (<= 8) rows of x and NV (<= 4) vectors of 4 lanes (SS·NV <= 16);
 * the first k block starts from zero, later ones add to out. */
static inline __attribute__((always_inline)) void axpy_tile(const int SS, const int NV, int kb, const float *x,
                                                            int64_t ldx, const char *y, const at_dtype yt,
                                                            int64_t ldy, const int round, float *out, int64_t lds,
                                                            int first, int sv, int64_t lv)
{
    size_t es = yt == AT_F32 ? 4 : 2;
#define DECL(s, v)                                                                                                     \
    float32x4_t c##s##v = NV > v && SS > s && !first && s < sv ? load_part(out + s * lds + 4 * v, lv - 4 * v)          \
                                                               : vdupq_n_f32(0.0f);
    ALL84(DECL)
#undef DECL
#define FM(s, v)                                                                                                       \
    if (SS > s && NV > v) c##s##v = vfmaq_n_f32(c##s##v, y##v, x[s * ldx + kk]);
    if (lv >= 4 * NV) {
        for (int kk = 0; kk < kb; kk++) {
            const char *yk = y + (size_t)(kk * ldy) * es;
            float32x4_t y0 = vdupq_n_f32(0.0f), y1 = y0, y2 = y0, y3 = y0;
#define LY(v)                                                                                                          \
    if (NV > v) y##v = load4_full(yk + 4 * v * es, yt);                                                               \
    if (NV > v && round) y##v = round_bf16(y##v);
            L4(LY)
#undef LY
            ALL84(FM)
        }
    } else { /* the last columns: partial vectors */
        for (int kk = 0; kk < kb; kk++) {
            const char *yk = y + (size_t)(kk * ldy) * es;
            float32x4_t y0 = vdupq_n_f32(0.0f), y1 = y0, y2 = y0, y3 = y0;
#define LY(v)                                                                                                          \
    if (NV > v) y##v = load4(yk + 4 * v * es, yt, lv - 4 * v, round);
            L4(LY)
#undef LY
            ALL84(FM)
        }
    }
#undef FM
#define ST(s, v)                                                                                                       \
    if (SS > s && NV > v && s < sv) store_part(out + s * lds + 4 * v, lv - 4 * v, c##s##v);
    ALL84(ST)
#undef ST
}

static inline __attribute__((always_inline)) void axpy_body(int S, int64_t K, const float *x, int64_t ldx, int64_t L,
                                                            const void *y_, const at_dtype yt, int64_t ldy,
                                                            const int round, float *out, int64_t lds)
{
    const char *y = y_;
    size_t es = yt == AT_F32 ? 4 : 2;
    for (int s0 = 0; s0 < S; s0 += 8) {
        int sv = S - s0 < 8 ? S - s0 : 8;
        const float *xs = x + s0 * ldx;
        float *os = out + s0 * lds;
        for (int64_t k0 = 0; k0 < K; k0 += AXPY_KB) {
            int kb = K - k0 < AXPY_KB ? (int)(K - k0) : AXPY_KB;
            const char *yk = y + (size_t)(k0 * ldy) * es;
#define RUN(SS, NV)                                                                                                    \
    for (int64_t l = 0; l < L; l += 4 * NV)                                                                            \
        axpy_tile(SS, NV, kb, xs + k0, ldx, yk + l * es, yt, ldy, round, os + l, lds, k0 == 0, sv, L - l);
            if (sv <= 2) { RUN(2, 4) }
            else if (sv <= 4) { RUN(4, 4) }
            else { RUN(8, 2) }
#undef RUN
        }
    }
}

/* One copy of each body per source dtype and rounding, so that the inner
 * loops carry no test of either. (Rounding a bf16 value is a no-op.) */
#define BY_TYPE(body, ...)                                                                                             \
    do {                                                                                                               \
        if (yt == AT_F32 && round) body(__VA_ARGS__, AT_F32, ldy, 1);                                                  \
        else if (yt == AT_F32) body(__VA_ARGS__, AT_F32, ldy, 0);                                                      \
        else if (yt == AT_BF16) body(__VA_ARGS__, AT_BF16, ldy, 0);                                                    \
        else if (round) body(__VA_ARGS__, AT_F16, ldy, 1);                                                             \
        else body(__VA_ARGS__, AT_F16, ldy, 0);                                                                        \
    } while (0)
#define DOT(...) dot_body(__VA_ARGS__, out, ors, oss)
#define AXPY(...) axpy_body(__VA_ARGS__, out, lds)

static void dot_neon(int S, int64_t K, const float *x, int64_t ldx, int64_t R, const void *y, at_dtype yt, int64_t ldy,
                     int round, float *out, int64_t ors, int64_t oss)
{
    BY_TYPE(DOT, S, K, x, ldx, R, y);
}

static void axpy_neon(int S, int64_t K, const float *x, int64_t ldx, int64_t L, const void *y, at_dtype yt,
                      int64_t ldy, int round, float *out, int64_t lds)
{
    BY_TYPE(AXPY, S, K, x, ldx, L, y);
}

const at_gemm_small at_gemm_small_neon = {.dot = dot_neon, .axpy = axpy_neon};
