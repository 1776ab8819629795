/* AVX-512 GEMM pieces for f32 panels: packing (with conversion from bf16 /
 * f16 and optional rounding to bf16), the 14x32 microkernel, and the small
 * path's dot / axpy primitives. Compiled with -mavx512f/bw/vl/dq; called
 * only when at_cpu_isa_level() >= AT_ISA_AVX512. Layouts: gemm_kernels.h. */
#include "device/cpu/gemm_kernels.h"

#include <immintrin.h>

#include "device/cpu/gemm_avx512_inl.h"

#define MR 14
#define NR 32

static inline __m512 row16_f32(const char *p, at_dtype t, int64_t left, int round)
{
    return load16r(p, t, mask16(left), round);
}

static inline __attribute__((always_inline)) void pack_body(void *dst_, const void *src_, const at_dtype t,
                                                            int64_t sx, int64_t sk, const int w, int64_t n,
                                                            int64_t kc, const int round)
{
    float *dst = dst_;
    const char *src = src_;
    size_t es = t == AT_F32 ? 4 : 2;
    int64_t np = (n + w - 1) / w, pstride = kc * w;
    if (sx == 1) {
        /* lanes contiguous: 16 source rows at a time, left to right, a
         * panel's 16 k at a time. (Down a whole panel first would touch a
         * new page per row; along whole rows first would write to every
         * panel in turn, panels a multiple of 4 KiB apart that evict each
         * other from L1.) */
        for (int64_t k0 = 0; k0 < kc; k0 += 16) {
            int64_t k1 = kc - k0 < 16 ? kc : k0 + 16;
            for (int64_t pi = 0; pi < np; pi++) {
                int64_t x0 = pi * w;
                float *d = dst + pi * pstride;
                for (int64_t k = k0; k < k1; k++) {
                    const char *s = src + (size_t)(k * sk + x0) * es;
                    /* the rows come from memory: two panels ahead, and the next 16 rows */
                    at_gemm_prefetch_row(s, w * (int)es, pi + 2 < np ? 2 * w * es : 0,
                                         k + 16 < kc ? (size_t)(16 * sk) * es : 0);
                    for (int g = 0; g < w; g += 16)
                        _mm512_mask_storeu_ps(d + k * w + g, mask16(w - g),
                                              load16r(s + g * es, t, mask16(n - x0 - g), round));
                }
            }
        }
        return;
    }
    /* k contiguous: transpose 16 lanes x 16 k at a time */
    pack_transposed(dst, src, t, sx, w, n, kc, kc, 1, round, row16_f32);
}

/* One copy of pack_body per source type and rounding, and for f32 and bf16
 * sources per panel width of the kernel, as in gemm_avx2.c (f32 packing on
 * a Zen 5: 13-17 GB/s before, 22-27 after). */

static void pack_f32(void *dst, const void *src, at_dtype t, int64_t sx, int64_t sk, int w, int64_t n, int64_t kc,
                     int round)
{
    if (t == AT_F32 && round) pack_body(dst, src, AT_F32, sx, sk, w, n, kc, 1);
    else if (t == AT_F32) AT_GEMM_PACK_BY_WIDTH(AT_F32, 0);
    else if (t == AT_BF16) AT_GEMM_PACK_BY_WIDTH(AT_BF16, 0);
    else if (round) pack_body(dst, src, AT_F16, sx, sk, w, n, kc, 1);
    else pack_body(dst, src, AT_F16, sx, sk, w, n, kc, 0);
}

/* The 14x32 microkernel: 28 zmm accumulators, per k two B vectors and 14
 * broadcasts of A (frame: AT_TILE_BEGIN/END in gemm_avx512_inl.h). */
static void kernel_f32(int64_t kc, const void *ap_, const void *bp_, void *c, at_dtype ct, int64_t ldc, int m, int n,
                       float alpha, float beta)
{
    const float *ap = ap_, *bp = bp_;
    AT_TILE_BEGIN
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#define F(i)                                                                                                           \
    {                                                                                                                  \
        __m512 a = _mm512_set1_ps(ap[i]);                                                                              \
        c##i##0 = _mm512_fmadd_ps(a, b0, c##i##0);                                                                     \
        c##i##1 = _mm512_fmadd_ps(a, b1, c##i##1);                                                                     \
    }
        AT_R14(F)
#undef F
        ap += MR;
        bp += NR;
    }
    AT_TILE_END
}

const at_gemm_blocked at_gemm_f32_avx512 = {
    .name = "avx512", .mr = MR, .nr = NR, .kp = 1, .mc = 8 * MR, .kc = 1024, .nc = 32 * NR,
    .l1_ref = 48, .l2_ref = 1024, /* a Zen 5 (gemm.c) */
    .pack = pack_f32, .kernel = kernel_f32, .lowrank = at_gemm_lowrank_avx512,
};

/* ---- small path ----
 * The tiles below are generic in their sizes (RR, SS, NV: compile-time
 * constants after inlining), their accumulators named variables (see
 * AT_R4S8 in gemm_avx512_inl.h). */

/* RR (<= 4) rows of y against SS (<= 8) rows of x, dot products along k;
 * only the first sv of the SS results per row are stored. The next RR rows
 * are prefetched as these are read: each row is a short stream (a few KB)
 * that the hardware prefetchers would only pick up halfway. */
static inline __attribute__((always_inline)) void dot_tile(const int RR, const int SS, int64_t K, const float *x,
                                                           int64_t ldx, const char *y, at_dtype yt, int64_t ldy,
                                                           int round, float *out, int64_t ors, int64_t oss, int sv)
{
    size_t es = yt == AT_F32 ? 4 : 2;
#define DECL(r, s) __m512 c##r##s = _mm512_setzero_ps();
    AT_R4S8(DECL)
#undef DECL
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 km = mask16(K - k);
        __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
#define LY(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        y##r = load16r(y + (size_t)(r * ldy + k) * es, yt, km, round);                                                 \
        _mm_prefetch(y + (size_t)((RR + r) * ldy + k) * es, _MM_HINT_T0);                                              \
    }
        AT_R4(LY)
#undef LY
#define FM(r, s)                                                                                                       \
    if (RR > r && SS > s) c##r##s = _mm512_fmadd_ps(_mm512_loadu_ps(x + s * ldx + k), y##r, c##r##s);
        AT_R4S8(FM)
#undef FM
    }
#define RED(r, s)                                                                                                      \
    if (RR > r && SS > s && s < sv) out[r * ors + s * oss] = _mm512_reduce_add_ps(c##r##s);
    AT_R4S8(RED)
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
        if (sv <= 1) { RUN(1, 1) } /* one row at a time: gemm_kernels.h */
        else if (sv <= 2) { RUN(4, 2) }
        else if (sv <= 4) { RUN(4, 4) }
        else { RUN(2, 8) }
#undef RUN
    }
}

/* out[s][0..lv) (+)= sum over kb rows k of x[s][k] * y[k][..] for SS (<= 8)
 * rows of x and NV (<= 4) vectors of 16 lanes; the first k block starts
 * from zero, later ones add to out. axpy_body says how kb and the lanes are
 * cut. Prefetched: with a few rows (decode, kb 8) the same lanes of the
 * next kb rows (the next pass); with many (ahead: LoRA's dA = duᵀ·x, kb 64)
 * the next tile's lanes of these rows, since the next pass comes only after
 * a sweep of all lanes through 64 rows, which L1 does not hold (+13-19% on
 * 8x896x512 against that, same run). */
static inline __attribute__((always_inline)) void axpy_tile(const int SS, const int NV, int kb, const float *x,
                                                            int64_t ldx, const char *y, at_dtype yt, int64_t ldy,
                                                            int round, float *out, int64_t lds, int first, int sv,
                                                            int64_t lv, const int ahead)
{
    size_t es = yt == AT_F32 ? 4 : 2;
    __mmask16 m0 = mask16(lv), m1 = mask16(lv - 16), m2 = mask16(lv - 32), m3 = mask16(lv - 48);
    __m512 c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33, c40, c41, c42, c43, c50,
        c51, c52, c53, c60, c61, c62, c63, c70, c71, c72, c73;
#define DECL(s, v)                                                                                                     \
    c##s##v = NV > v && SS > s && !first && s < sv ? _mm512_maskz_loadu_ps(m##v, out + s * lds + 16 * v)              \
                                                   : _mm512_setzero_ps();
#define DECLV(s) DECL(s, 0) DECL(s, 1) DECL(s, 2) DECL(s, 3)
    DECLV(0) DECLV(1) DECLV(2) DECLV(3) DECLV(4) DECLV(5) DECLV(6) DECLV(7)
#undef DECL
#undef DECLV
    for (int kk = 0; kk < kb; kk++) {
        const char *yk = y + (size_t)(kk * ldy) * es;
        __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
#define LY(v)                                                                                                          \
    if (NV > v) {                                                                                                      \
        y##v = load16r(yk + 16 * v * es, yt, m##v, round);                                                             \
        _mm_prefetch(yk + (size_t)(ahead ? 16 * NV + 16 * v : kb * ldy + 16 * v) * es, _MM_HINT_T0);                   \
    }
        AT_R4(LY)
#undef LY
#define FM(s)                                                                                                          \
    if (SS > s) {                                                                                                      \
        __m512 xb = _mm512_set1_ps(x[s * ldx + kk]);                                                                   \
        if (NV > 0) c##s##0 = _mm512_fmadd_ps(xb, y0, c##s##0);                                                        \
        if (NV > 1) c##s##1 = _mm512_fmadd_ps(xb, y1, c##s##1);                                                        \
        if (NV > 2) c##s##2 = _mm512_fmadd_ps(xb, y2, c##s##2);                                                        \
        if (NV > 3) c##s##3 = _mm512_fmadd_ps(xb, y3, c##s##3);                                                        \
    }
        FM(0) FM(1) FM(2) FM(3) FM(4) FM(5) FM(6) FM(7)
#undef FM
    }
#define ST(s, v)                                                                                                       \
    if (SS > s && NV > v && s < sv) _mm512_mask_storeu_ps(out + s * lds + 16 * v, m##v, c##s##v);
#define STV(s) ST(s, 0) ST(s, 1) ST(s, 2) ST(s, 3)
    STV(0) STV(1) STV(2) STV(3) STV(4) STV(5) STV(6) STV(7)
#undef ST
#undef STV
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
        int kbmax = at_gemm_axpy_kb(sv);
        for (int64_t l0 = 0; l0 < L; l0 += AT_GEMM_AXPY_LC) {
            int64_t lc = L - l0 < AT_GEMM_AXPY_LC ? L - l0 : AT_GEMM_AXPY_LC;
            for (int64_t k0 = 0; k0 < K; k0 += kbmax) {
                int kb = K - k0 < kbmax ? (int)(K - k0) : kbmax;
                const char *yk = y + (size_t)(k0 * ldy + l0) * es;
#define RUN(SS, NV, AHEAD)                                                                                             \
    for (int64_t l = 0; l < lc; l += 16 * NV)                                                                          \
        axpy_tile(SS, NV, kb, xs + k0, ldx, yk + l * es, yt, ldy, round, os + l0 + l, lds, k0 == 0, sv, lc - l, AHEAD);
                if (sv <= 1) { RUN(1, 4, 0) }
                else if (sv <= 2) { RUN(2, 4, 0) }
                else if (sv <= 4) { RUN(4, 4, 1) }
                else { RUN(8, 3, 1) }
#undef RUN
            }
        }
    }
}

/* One copy of each body per source dtype and rounding, so that the inner
 * loops carry no test of either. (Rounding a bf16 value is a no-op.) */
#define AT_BY_TYPE(body, ...)                                                                                          \
    do {                                                                                                               \
        if (yt == AT_F32 && round) body(__VA_ARGS__, AT_F32, ldy, 1);                                                  \
        else if (yt == AT_F32) body(__VA_ARGS__, AT_F32, ldy, 0);                                                      \
        else if (yt == AT_BF16) body(__VA_ARGS__, AT_BF16, ldy, 0);                                                    \
        else if (round) body(__VA_ARGS__, AT_F16, ldy, 1);                                                             \
        else body(__VA_ARGS__, AT_F16, ldy, 0);                                                                        \
    } while (0)
#define DOT(...) dot_body(__VA_ARGS__, out, ors, oss)
#define AXPY(...) axpy_body(__VA_ARGS__, out, lds)

static void dot_avx512(int S, int64_t K, const float *x, int64_t ldx, int64_t R, const void *y, at_dtype yt,
                       int64_t ldy, int round, float *out, int64_t ors, int64_t oss)
{
    AT_BY_TYPE(DOT, S, K, x, ldx, R, y);
}

static void axpy_avx512(int S, int64_t K, const float *x, int64_t ldx, int64_t L, const void *y, at_dtype yt,
                        int64_t ldy, int round, float *out, int64_t lds)
{
    AT_BY_TYPE(AXPY, S, K, x, ldx, L, y);
}
#undef DOT
#undef AXPY
#undef AT_BY_TYPE

/* ---- outer-product path (gemm_kernels.h) ----
 * A tile is RR rows of C by 64 lanes: RR x 4 zmm accumulators, per k four
 * loads of b and RR broadcasts of a. C is written (and, with beta, read)
 * once, a row's 256 bytes at a time, so each of the RR rows is a sequential
 * stream along the lanes. Tiles of 4 rows: 7-11% faster than 6 at K 8 and
 * 2-6% at K 32-64 (same-run A/B, 512x896), as fewer streams of C are open
 * at once; 2 rows were 30% slower. */
static inline __attribute__((always_inline)) void outer_tile(const int RR, int K, const float *a, int64_t lda,
                                                             const float *b, int64_t ldb, char *c, at_dtype ct,
                                                             int64_t ldc, float alpha, float beta, int64_t lv)
{
    size_t es = ct == AT_F32 ? 4 : 2;
#define DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
    AT_R4(DECL)
#undef DECL
    for (int k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        __m512 b0 = _mm512_loadu_ps(bk), b1 = _mm512_loadu_ps(bk + 16), b2 = _mm512_loadu_ps(bk + 32),
               b3 = _mm512_loadu_ps(bk + 48);
#define FM(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        __m512 ab = _mm512_set1_ps(a[r * lda + k]);                                                                    \
        c##r##0 = _mm512_fmadd_ps(ab, b0, c##r##0);                                                                    \
        c##r##1 = _mm512_fmadd_ps(ab, b1, c##r##1);                                                                    \
        c##r##2 = _mm512_fmadd_ps(ab, b2, c##r##2);                                                                    \
        c##r##3 = _mm512_fmadd_ps(ab, b3, c##r##3);                                                                    \
    }
        AT_R4(FM)
#undef FM
    }
    __m512 va = _mm512_set1_ps(alpha);
    if (ct == AT_F32 && lv >= 64) {
        /* a full f32 tile: plain stores of the values store_row gives the
         * edges, bit for bit (an element must not depend on where the
         * tiles fall: a batch of other rows changes that, and training on
         * 2 ranks must match 1, test_mpi); only exact steps skipped */
        __m512 vb = _mm512_set1_ps(beta);
#define FULL1(r, v)                                                                                                    \
    {                                                                                                                  \
        float *p = (float *)c + r * ldc + 16 * v;                                                                      \
        __m512 t = alpha == 1.0f ? c##r##v : _mm512_mul_ps(va, c##r##v);                                               \
        if (beta == 1.0f) t = _mm512_add_ps(t, _mm512_loadu_ps(p));                                                    \
        else if (beta != 0.0f) t = _mm512_fmadd_ps(vb, _mm512_loadu_ps(p), t);                                         \
        _mm512_storeu_ps(p, t);                                                                                        \
    }
#define FULL(r)                                                                                                        \
    if (RR > r) {                                                                                                      \
        FULL1(r, 0) FULL1(r, 1) FULL1(r, 2) FULL1(r, 3)                                                                \
    }
        AT_R4(FULL)
#undef FULL1
#undef FULL
        return;
    }
    __mmask16 m0 = mask16(lv), m1 = mask16(lv - 16), m2 = mask16(lv - 32), m3 = mask16(lv - 48);
#define ST(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        char *cr = c + (size_t)(r * ldc) * es;                                                                         \
        store_row(cr, ct, c##r##0, c##r##1, m0, m1, va, beta);                                                         \
        if (lv > 32) store_row(cr + 32 * es, ct, c##r##2, c##r##3, m2, m3, va, beta);                                  \
   }
    AT_R4(ST)
#undef ST
}

void at_gemm_outer_avx512(int64_t R, int64_t L, int K, const float *a, int64_t lda, const float *b, int64_t ldb,
                          void *c_, at_dtype ct, int64_t ldc, float alpha, float beta)
{
    char *c = c_;
    size_t es = ct == AT_F32 ? 4 : 2;
    int64_t i = 0;
#define RUN(RR)                                                                                                        \
    for (int64_t l = 0; l < L; l += 64)                                                                                \
        outer_tile(RR, K, a + i * lda, lda, b + l, ldb, c + (size_t)(i * ldc + l) * es, ct, ldc, alpha, beta, L - l);
    for (; i + 4 <= R; i += 4) { RUN(4) }
    switch (R - i) {
    case 3: RUN(3) break;
    case 2: RUN(2) break;
    case 1: RUN(1) break;
    default: break;
    }
#undef RUN
}

const at_gemm_small at_gemm_small_avx512 = {.dot = dot_avx512, .axpy = axpy_avx512, .outer = at_gemm_outer_avx512};
