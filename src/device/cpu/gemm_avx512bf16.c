/* AVX512_BF16 GEMM pieces: packing into bf16 pair panels (converting f32 and
 * f16 operands to bf16 on the way, round to nearest even) and the 14x32
 * microkernel on vdpbf16ps, which multiplies the pairs (k, k+1) of A and B
 * and adds both products to an f32 accumulator. Called only when
 * at_cpu_isa_level() == AT_ISA_AVX512_BF16. Layouts: gemm_kernels.h. */
#include "device/cpu/gemm_kernels.h"

#include <immintrin.h>
#include <stdlib.h>

#include "device/cpu/gemm_avx512_inl.h"

#define MR 14
#define NR 32

static inline __mmask32 mask32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xffffffffu : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1);
}

/* 32 consecutive values of type t at p (only the first n) as 32 bf16. */
static inline __m512i load32_bf16(const char *p, at_dtype t, int64_t n)
{
    if (t == AT_BF16) return _mm512_maskz_loadu_epi16(mask32(n), p);
    size_t es = t == AT_F32 ? 4 : 2;
    __m512 lo = load16(p, t, mask16(n)), hi = load16(p + 16 * es, t, mask16(n - 16));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* 16 lanes of two rows as interleaved bf16 pairs: word i = (r0[i], r1[i]). */
static inline __m512i pair16(const char *r0, const char *r1, at_dtype t, __mmask16 m)
{
    __m512i v;
    if (t == AT_BF16) {
        __m256i lo = _mm256_maskz_loadu_epi16(m, r0);
        __m256i hi = r1 ? _mm256_maskz_loadu_epi16(m, r1) : _mm256_setzero_si256();
        v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    } else {
        __m512 f0 = load16(r0, t, m), f1 = r1 ? load16(r1, t, m) : _mm512_setzero_ps();
        v = (__m512i)_mm512_cvtne2ps_pbh(f1, f0);
    }
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, v);
}

static void pack_bf16(void *dst_, const void *src_, at_dtype t, int64_t sx, int64_t sk, int w, int64_t n, int64_t kc,
                      int round)
{
    (void)round; /* converting to bf16 rounds already */
    float *dst = dst_; /* one 32-bit lane per (pair, x) */
    const char *src = src_;
    size_t es = t == AT_F32 ? 4 : 2;
    int64_t kcp = (kc + 1) / 2, np = (n + w - 1) / w, pstride = kcp * w;
    if (sx == 1) {
        /* lanes contiguous: 16 source rows (8 pairs) at a time, left to
         * right, a panel at a time (as in pack_f32 of gemm_avx512.c) */
        for (int64_t p0 = 0; p0 < kcp; p0 += 8) {
            int64_t p1 = kcp - p0 < 8 ? kcp : p0 + 8;
            for (int64_t pi = 0; pi < np; pi++) {
                int64_t x0 = pi * w;
                float *d = dst + pi * pstride;
                for (int64_t p = p0; p < p1; p++) {
                    const char *r0 = src + (size_t)(2 * p * sk) * es;
                    const char *r1 = 2 * p + 1 < kc ? r0 + (size_t)sk * es : NULL;
                    for (int g = 0; g < w; g += 16) {
                        size_t off = (size_t)(x0 + g) * es;
                        __m512i v = pair16(r0 + off, r1 ? r1 + off : NULL, t, mask16(n - x0 - g));
                        _mm512_mask_storeu_epi32(d + p * w + g, mask16(w - g), v);
                    }
                }
            }
        }
        return;
    }
    /* k contiguous: each 32-bit word of a row already is a pair; transpose */
    for (int64_t pi = 0; pi < np; pi++, dst += pstride) {
        int64_t x0 = pi * w;
        for (int g = 0; g < w; g += 16) {
            __mmask16 wm = mask16(w - g);
            for (int64_t p0 = 0; p0 < kcp; p0 += 16) {
                int64_t k0 = 2 * p0;
                __m512 r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = x0 + g + i < n ? _mm512_castsi512_ps(load32_bf16(
                                                src + (size_t)((x0 + g + i) * sx + k0) * es, t, kc - k0))
                                          : _mm512_setzero_ps();
                transpose16(r);
                int pl = kcp - p0 < 16 ? (int)(kcp - p0) : 16;
                for (int i = 0; i < pl; i++) _mm512_mask_storeu_ps(dst + (p0 + i) * w + g, wm, r[i]);
            }
        }
    }
}

static void kernel_bf16(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m, int n,
                        float alpha, float beta)
{
    const int32_t *ap = ap_;
    const __m512i *bp = bp_;
    int64_t kcp = (kc + 1) / 2;
    size_t es = ct == AT_F32 ? 4 : 2;
    for (int i = 0; i < m; i++) {
        _mm_prefetch((const char *)c + (size_t)(i * ldc) * es, _MM_HINT_T0);
        _mm_prefetch((const char *)c + (size_t)(i * ldc) * es + 64, _MM_HINT_T0);
    }
#define Z(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
    Z(0) Z(1) Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11) Z(12) Z(13)
#undef Z
    for (int64_t p = 0; p < kcp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 1);
#define F(i)                                                                                                           \
    {                                                                                                                  \
        __m512bh a = (__m512bh)_mm512_set1_epi32(ap[i]);                                                               \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, a, b0);                                                                    \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, a, b1);                                                                    \
    }
        F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13)
#undef F
        ap += MR;
        bp += 2;
    }
    __m512 va = _mm512_set1_ps(alpha);
    __mmask16 m0 = mask16(n), m1 = mask16(n - 16);
    char *cr = c;
#define S(i)                                                                                                           \
    if (i < m) store_row(cr + (size_t)(i * ldc) * es, ct, c##i##0, c##i##1, m0, m1, va, beta);
    S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11) S(12) S(13)
#undef S
}

const at_gemm_blocked at_gemm_bf16_avx512bf16 = {
    .name = "avx512+bf16", .mr = MR, .nr = NR, .kp = 2, .mc = 16 * MR, .kc = 1024, .nc = 64 * NR,
    .pack = pack_bf16, .kernel = kernel_bf16,
};

/* ---- small path: the dot form on bf16 rows ----
 * When the big operand is bf16 along k (a bf16 weight in the decode and
 * LoRA shapes), vdpbf16ps takes its pairs as stored, two products per lane.
 * x (f32 values that are exact in bf16, gemm.c rounds them) is converted
 * once per call into a per-thread buffer of bf16 rows. Everything else goes
 * to the AVX-512 f32 primitives. */

static _Thread_local uint16_t *xb_buf;
static _Thread_local size_t xb_cap;

void at_gemm_bf16_release(void)
{
    free(xb_buf);
    xb_buf = NULL;
    xb_cap = 0;
}

#define AT_B8(M, r) M(r, 0) M(r, 1) M(r, 2) M(r, 3) M(r, 4) M(r, 5) M(r, 6) M(r, 7)
#define AT_B4x8(M) AT_B8(M, 0) AT_B8(M, 1) AT_B8(M, 2) AT_B8(M, 3)

/* RR (<= 4) bf16 rows of y against SS (<= 8) bf16 rows of xb (ldxb, a
 * multiple of 32, zero past K), dot products along k. */
static inline __attribute__((always_inline)) void dotb_tile(const int RR, const int SS, int64_t K,
                                                            const uint16_t *xb, int64_t ldxb, const uint16_t *y,
                                                            int64_t ldy, float *out, int64_t ors, int64_t oss, int sv)
{
#define DECL(r, s) __m512 c##r##s = _mm512_setzero_ps();
    AT_B4x8(DECL)
#undef DECL
    for (int64_t k = 0; k < K; k += 32) {
        __mmask32 km = mask32(K - k);
        __m512i y0 = _mm512_setzero_si512(), y1 = y0, y2 = y0, y3 = y0;
#define LY(r)                                                                                                          \
    if (RR > r) y##r = _mm512_maskz_loadu_epi16(km, y + r * ldy + k);
        LY(0) LY(1) LY(2) LY(3)
#undef LY
#define DP(r, s)                                                                                                       \
    if (RR > r && SS > s)                                                                                              \
        c##r##s = _mm512_dpbf16_ps(c##r##s, (__m512bh)_mm512_loadu_si512(xb + s * ldxb + k), (__m512bh)y##r);
        AT_B4x8(DP)
#undef DP
    }
#define RED(r, s)                                                                                                      \
    if (RR > r && SS > s && s < sv) out[r * ors + s * oss] = _mm512_reduce_add_ps(c##r##s);
    AT_B4x8(RED)
#undef RED
}

static void dot_bf16(int S, int64_t K, const float *x, int64_t ldx, int64_t R, const void *y_, at_dtype yt,
                     int64_t ldy, int round, float *out, int64_t ors, int64_t oss)
{
    int64_t spad = (S + AT_GEMM_SMALL_PAD - 1) / AT_GEMM_SMALL_PAD * AT_GEMM_SMALL_PAD, ldxb = (K + 31) / 32 * 32;
    size_t need = (size_t)(spad * ldxb) * 2;
    if (yt == AT_BF16 && need > xb_cap) {
        free(xb_buf);
        xb_buf = aligned_alloc(64, (need + 63) / 64 * 64);
        xb_cap = xb_buf ? need : 0;
    }
    if (yt != AT_BF16 || !xb_buf) {
        at_gemm_small_avx512.dot(S, K, x, ldx, R, y_, yt, ldy, round, out, ors, oss);
        return;
    }
    for (int64_t s = 0; s < spad; s++) /* x's rows past S are zero (gemm_kernels.h) */
        for (int64_t k = 0; k < ldxb; k += 32) {
            __m512 lo = _mm512_maskz_loadu_ps(mask16(K - k), x + s * ldx + k);
            __m512 hi = _mm512_maskz_loadu_ps(mask16(K - k - 16), x + s * ldx + k + 16);
            _mm512_storeu_si512(xb_buf + s * ldxb + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    const uint16_t *y = y_;
    for (int s0 = 0; s0 < S; s0 += 8) {
        int sv = S - s0 < 8 ? S - s0 : 8;
        const uint16_t *xs = xb_buf + s0 * ldxb;
        float *os = out + s0 * oss;
        int64_t r = 0;
#define RUN(RR, SS)                                                                                                    \
    for (; r + RR <= R; r += RR) dotb_tile(RR, SS, K, xs, ldxb, y + r * ldy, ldy, os + r * ors, ors, oss, sv);         \
    for (; r < R; r++) dotb_tile(1, SS, K, xs, ldxb, y + r * ldy, ldy, os + r * ors, ors, oss, sv);
        if (sv <= 1) { RUN(4, 1) }
        else if (sv <= 2) { RUN(4, 2) }
        else if (sv <= 4) { RUN(4, 4) }
        else { RUN(2, 8) }
#undef RUN
    }
}

static void axpy_bf16(int S, int64_t K, const float *x, int64_t ldx, int64_t L, const void *y, at_dtype yt,
                      int64_t ldy, int round, float *out, int64_t lds)
{
    at_gemm_small_avx512.axpy(S, K, x, ldx, L, y, yt, ldy, round, out, lds);
}

const at_gemm_small at_gemm_small_avx512bf16 = {.dot = dot_bf16, .axpy = axpy_bf16};
