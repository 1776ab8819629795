/* AVX512_BF16 GEMM pieces: packing into bf16 pair panels (converting f32 and
 * f16 operands to bf16 on the way, round to nearest even) and the 14x32
 * microkernel on vdpbf16ps, which multiplies the pairs (k, k+1) of A and B
 * and adds both products to an f32 accumulator. Called only when
 * at_cpu_isa_level() == AT_ISA_AVX512_BF16. Layouts: gemm_kernels.h. */
#include "device/cpu/gemm_kernels.h"

#include <immintrin.h>
#include <stdlib.h>

#include "device/cpu/gemm.h"
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

static inline __m512 row16_bf16(const char *p, at_dtype t, int64_t left, int round)
{
    (void)round;
    return _mm512_castsi512_ps(load32_bf16(p, t, left));
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
                    /* the rows come from memory: two panels ahead, and the next 16 rows */
                    size_t ahead = pi + 2 < np ? 2 * w * es : 0, next = 2 * p + 17 < kc ? (size_t)(16 * sk) * es : 0;
                    at_gemm_prefetch_row(r0 + (size_t)x0 * es, w * (int)es, ahead, next);
                    if (r1) at_gemm_prefetch_row(r1 + (size_t)x0 * es, w * (int)es, ahead, next);
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
    pack_transposed(dst, src, t, sx, w, n, kc, kcp, 2, round, row16_bf16);
}

static void kernel_bf16(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m, int n,
                        float alpha, float beta)
{
    const int32_t *ap = ap_;
    const __m512i *bp = bp_;
    int64_t kcp = (kc + 1) / 2;
    AT_TILE_BEGIN
    for (int64_t p = 0; p < kcp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 1);
#define F(i)                                                                                                           \
    {                                                                                                                  \
        __m512bh a = (__m512bh)_mm512_set1_epi32(ap[i]);                                                               \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, a, b0);                                                                    \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, a, b1);                                                                    \
    }
        AT_R14(F)
#undef F
        ap += MR;
        bp += 2;
    }
    AT_TILE_END
}

const at_gemm_blocked at_gemm_bf16_avx512bf16 = {
    .name = "avx512+bf16", .mr = MR, .nr = NR, .kp = 2, .mc = 16 * MR, .kc = 1024, .nc = 64 * NR,
    .l1_ref = 32, .l2_ref = 1024, /* a Zen 4 (gemm.c) */
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

/* RR (<= 4) bf16 rows of y against SS (<= 8) bf16 rows of xb (ldxb, a
 * multiple of 32, zero past K), dot products along k; the next RR rows are
 * prefetched (gemm_avx512.c's dot_tile says why). */
static inline __attribute__((always_inline)) void dotb_tile(const int RR, const int SS, int64_t K,
                                                            const uint16_t *xb, int64_t ldxb, const uint16_t *y,
                                                            int64_t ldy, float *out, int64_t ors, int64_t oss, int sv)
{
#define DECL(r, s) __m512 c##r##s = _mm512_setzero_ps();
    AT_R4S8(DECL)
#undef DECL
    for (int64_t k = 0; k < K; k += 32) {
        __mmask32 km = mask32(K - k);
        __m512i y0 = _mm512_setzero_si512(), y1 = y0, y2 = y0, y3 = y0;
#define LY(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        y##r = _mm512_maskz_loadu_epi16(km, y + r * ldy + k);                                                          \
        _mm_prefetch((const char *)(y + (RR + r) * ldy + k), _MM_HINT_T0);                                             \
    }
        AT_R4(LY)
#undef LY
#define DP(r, s)                                                                                                       \
    if (RR > r && SS > s)                                                                                              \
        c##r##s = _mm512_dpbf16_ps(c##r##s, (__m512bh)_mm512_loadu_si512(xb + s * ldxb + k), (__m512bh)y##r);
        AT_R4S8(DP)
#undef DP
    }
#define RED(r, s)                                                                                                      \
    if (RR > r && SS > s && s < sv) out[r * ors + s * oss] = _mm512_reduce_add_ps(c##r##s);
    AT_R4S8(RED)
#undef RED
}

static void dot_bf16(int S, int64_t K, const float *x, int64_t ldx, int64_t R, const void *y_, at_dtype yt,
                     int64_t ldy, int round, float *out, int64_t ors, int64_t oss)
{
    int64_t spad = (S + AT_GEMM_SMALL_PAD - 1) / AT_GEMM_SMALL_PAD * AT_GEMM_SMALL_PAD, ldxb = (K + 31) / 32 * 32;
    size_t need = (size_t)(spad * ldxb) * 2;
    if (yt == AT_BF16 && need > xb_cap) {
        at_cpu_thread_buffers_held();
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
        if (sv <= 1) { RUN(1, 1) } /* one row at a time: gemm_kernels.h */
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

/* K is tiny on this path: f32 FMAs on the bf16-rounded operands give the
 * products vdpbf16ps would (a product of two bf16 values is exact in f32). */
const at_gemm_small at_gemm_small_avx512bf16 = {.dot = dot_bf16, .axpy = axpy_bf16, .outer = at_gemm_outer_avx512};

/* ---- attention's tiles: C += round_bf16(A) · round_bf16(B) (gemm.h) ----
 * In blocks of at most 64 rows x 64 columns x 64 k: B's block as pairs
 * (k, k+1) of each column, bp[p][n]; A's block as pairs of each row stored
 * pair-major, ap[p][m], so that a tile's rows at one pair are adjacent. An 8
 * x 32 tile of C accumulates in 16 registers over the block's pairs. */

#define ACC_B 64

/* dst[p][ld] (p < ceil(kb / 2), lanes < n) = pairs of rows 2p, 2p + 1 of
 * src (rows rs apart, n contiguous values each); lanes past n are 0. */
static void pack_row_pairs(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t kb, int64_t n)
{
    for (int64_t p = 0; 2 * p < kb; p++) {
        const float *r0 = src + 2 * p * rs, *r1 = 2 * p + 1 < kb ? r0 + rs : NULL;
        for (int64_t x = 0; x < n; x += 16)
            _mm512_storeu_si512(dst + p * ld + x, pair16((const char *)(r0 + x), r1 ? (const char *)(r1 + x) : NULL,
                                                         AT_F32, mask16(n - x)));
    }
}

/* dst[p][ld] (p < ceil(kb / 2), lanes m < mb) = pairs (k 2p, 2p + 1) of rows m
 * of src, each row's kb values contiguous, rows rs apart: 16 rows x 16
 * pairs transposed in registers. */
static void pack_col_pairs(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t kb, int64_t mb)
{
    for (int64_t m0 = 0; m0 < mb; m0 += 16)
        for (int64_t k0 = 0; k0 < kb; k0 += 32) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                const float *row = src + (m0 + i) * rs + k0;
                __m512i v = _mm512_setzero_si512();
                if (m0 + i < mb) {
                    __m512 lo = _mm512_maskz_loadu_ps(mask16(kb - k0), row);
                    __m512 hi = _mm512_maskz_loadu_ps(mask16(kb - k0 - 16), row + 16);
                    v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
                }
                r[i] = _mm512_castsi512_ps(v);
            }
            transpose16(r);
            for (int i = 0; i < 16 && 2 * (k0 / 2 + i) < kb; i++)
                _mm512_storeu_ps((float *)(dst + (k0 / 2 + i) * ld + m0), r[i]);
        }
}

/* Rows [0, RR) x columns [0, n) (n <= 32) of C (+)= the pair panels a, b
 * (lda, ldb words per pair) over kp pairs; acc 0 ignores C's old values. */
static inline __attribute__((always_inline)) void acc_tile(const int RR, float *c, int64_t ldc, const uint32_t *ap,
                                                           int64_t lda, const uint32_t *bp, int64_t ldb, int64_t kp,
                                                           int64_t n, int acc)
{
    __mmask16 m0 = mask16(n), m1 = mask16(n - 16);
#define LD(r)                                                                                                          \
    __m512 c##r##0 = RR > r && acc ? _mm512_maskz_loadu_ps(m0, c + r * ldc) : _mm512_setzero_ps();                     \
    __m512 c##r##1 = RR > r && acc ? _mm512_maskz_loadu_ps(m1, c + r * ldc + 16) : _mm512_setzero_ps();
    LD(0) LD(1) LD(2) LD(3) LD(4) LD(5) LD(6) LD(7)
#undef LD
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * ldb);
        __m512bh b1 = (__m512bh)(n > 16 ? _mm512_loadu_si512(bp + p * ldb + 16) : _mm512_setzero_si512());
        const uint32_t *a = ap + p * lda;
#define F(r)                                                                                                           \
    if (RR > r) {                                                                                                      \
        __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r]);                                                          \
        c##r##0 = _mm512_dpbf16_ps(c##r##0, av, b0);                                                                  \
        c##r##1 = _mm512_dpbf16_ps(c##r##1, av, b1);                                                                  \
    }
        F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#undef F
    }
#define ST(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        _mm512_mask_storeu_ps(c + r * ldc, m0, c##r##0);                                                               \
        _mm512_mask_storeu_ps(c + r * ldc + 16, m1, c##r##1);                                                          \
    }
    ST(0) ST(1) ST(2) ST(3) ST(4) ST(5) ST(6) ST(7)
#undef ST
}

void at_gemm_acc_bf16_pairs_avx512bf16(float *c, int64_t ldc, const uint32_t *a, int64_t lda, const uint32_t *b,
                                       int64_t ldb, int64_t M, int64_t N, int64_t kp, int acc)
{
    for (int64_t j = 0; j < N; j += 32) {
        int64_t n = N - j < 32 ? N - j : 32;
        for (int64_t i = 0; i < M; i += 8) {
            float *ct = c + i * ldc + j;
            const uint32_t *at = a + i, *bt = b + j;
            switch (M - i < 8 ? M - i : 8) {
            case 1: acc_tile(1, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            case 2: acc_tile(2, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            case 3: acc_tile(3, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            case 4: acc_tile(4, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            case 5: acc_tile(5, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            case 6: acc_tile(6, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            case 7: acc_tile(7, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            default: acc_tile(8, ct, ldc, at, lda, bt, ldb, kp, n, acc); break;
            }
        }
    }
}

void at_gemm_bf16_pairs_in_rows_avx512bf16(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows,
                                           int64_t cols)
{
    pack_col_pairs(dst, ld, src, rs, cols, rows);
}

void at_gemm_bf16_pairs_of_rows_avx512bf16(uint32_t *dst, int64_t ld, const float *src, int64_t rs, int64_t rows,
                                           int64_t cols)
{
    pack_row_pairs(dst, ld, src, rs, rows, cols);
}

void at_gemm_acc_bf16_avx512bf16(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                                 int64_t ldb, int64_t M, int64_t N, int64_t K)
{
    _Alignas(64) uint32_t ap[ACC_B / 2 * ACC_B], bp[ACC_B / 2 * ACC_B];
    for (int64_t k0 = 0; k0 < K; k0 += ACC_B) {
        int64_t kb = K - k0 < ACC_B ? K - k0 : ACC_B, kp = (kb + 1) / 2;
        for (int64_t n0 = 0; n0 < N; n0 += ACC_B) {
            int64_t nb = N - n0 < ACC_B ? N - n0 : ACC_B;
            pack_row_pairs(bp, ACC_B, b + k0 * ldb + n0, ldb, kb, nb);
            for (int64_t m0 = 0; m0 < M; m0 += ACC_B) {
                int64_t mb = M - m0 < ACC_B ? M - m0 : ACC_B;
                const float *as = a + m0 * a_rs + k0 * a_cs;
                if (a_cs == 1) pack_col_pairs(ap, ACC_B, as, a_rs, kb, mb);
                else pack_row_pairs(ap, ACC_B, as, a_cs, kb, mb); /* a_rs == 1 (gemm.h) */
                at_gemm_acc_bf16_pairs_avx512bf16(c + m0 * ldc + n0, ldc, ap, ACC_B, bp, ACC_B, mb, nb, kp, 1);
            }
        }
    }
}
