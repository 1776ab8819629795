/* AVX2+FMA GEMM pieces on f32 panels: packing (with conversion from bf16 /
 * f16 and optional rounding to bf16), the 6x16 microkernel (12 of the 16 ymm
 * registers accumulate), and the small path's dot / axpy primitives for
 * decode and LoRA shapes. Called only when at_cpu_isa_level() >= AT_ISA_AVX2.
 * Layouts: gemm_kernels.h. AVX2 has no masked 16-bit loads: partial vectors
 * (tails of k or of lanes) go through a zeroed stack copy. */
#include "device/cpu/gemm_avx2_inl.h"
#include "device/cpu/gemm_kernels.h"

#include <immintrin.h>
#include <string.h>

#define MR 6
#define NR 16

/* 8 values of type t at p as f32 (all 8 are read). */
static inline __m256 load8_full(const char *p, at_dtype t)
{
    if (t == AT_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (t == AT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The first `left` (clamped to 0..8) values of type t at p; the rest 0. */
static inline __attribute__((always_inline)) __m256 load8(const char *p, at_dtype t, int64_t left, int round)
{
    __m256 v;
    if (left >= 8) v = load8_full(p, t);
    else {
        char tmp[32] = {0};
        if (left > 0) memcpy(tmp, p, (size_t)left * (t == AT_F32 ? 4 : 2));
        v = load8_full(tmp, t);
    }
    return round ? round_bf16(v) : v;
}

static inline __m256i mask8(int64_t n)
{
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    n = n < 0 ? 0 : n > 8 ? 8 : n;
    return _mm256_loadu_si256((const __m256i *)(m + 8 - n));
}

static inline void store8(float *d, int64_t n, __m256 v)
{
    if (n >= 8) _mm256_storeu_ps(d, v);
    else _mm256_maskstore_ps(d, mask8(n), v);
}

/* In-register transpose of 8 rows of 8 floats. */
static inline void transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        s[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
    }
}

/* The n (<= 8 used) lanes of a packed row at d. A partial row may be
 * stored whole where the spill lands in the following rows of the same
 * panel (spill_ok: the first lanes of a row, and 8 values from there still
 * in the panel), which the packer writes after this one: AMD's masked
 * stores are microcoded, and made the 6-wide panels of A the slowest part
 * of packing. */
static inline void store_lanes(float *d, int64_t n, int spill_ok, __m256 v)
{
    if (n < 8 && spill_ok) _mm256_storeu_ps(d, v);
    else store8(d, n, v);
}

static inline __attribute__((always_inline)) void pack_body(float *dst, const char *src, const at_dtype t,
                                                            int64_t sx, int64_t sk, const int w, int64_t n,
                                                            int64_t kc, const int round)
{
    size_t es = t == AT_F32 ? 4 : 2;
    int64_t np = (n + w - 1) / w, pstride = kc * w;
    if (sx == 1) {
        /* lanes contiguous: copy rows of w lanes, converting; 16 source rows
         * at a time, left to right, a panel's 16 k at a time (as
         * gemm_avx512.c's pack_f32, which says why), prefetching two panels
         * or 4 lines ahead, and the next 16 rows */
        size_t ahead = 2 * w * es < 256 ? 256 : 2 * w * es;
        for (int64_t k0 = 0; k0 < kc; k0 += 16) {
            int64_t k1 = kc - k0 < 16 ? kc : k0 + 16;
            for (int64_t pi = 0; pi < np; pi++) {
                int64_t x0 = pi * w;
                float *d = dst + pi * pstride;
                for (int64_t k = k0; k < k1; k++) {
                    const char *s = src + (size_t)(k * sk + x0) * es;
                    at_gemm_prefetch_row(s, w * (int)es, pi + 2 < np ? ahead : 0,
                                         k + 16 < kc ? (size_t)(16 * sk) * es : 0);
                    for (int g = 0; g < w; g += 8)
                        store_lanes(d + k * w + g, w - g, g == 0 && k * w + 8 <= kc * w,
                                    load8(s + g * es, t, n - x0 - g, round));
                }
            }
        }
        return;
    }
    /* k contiguous: transpose 8 lanes x 8 k at a time */
    for (int64_t pi = 0; pi < np; pi++, dst += pstride) {
        int64_t x0 = pi * w;
        for (int g = 0; g < w; g += 8) {
            int step = w - g < 8 ? w - g : 8; /* to the next group of rows */
            for (int64_t k0 = 0; k0 < kc; k0 += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) {
                    const char *row = src + (size_t)((x0 + g + i) * sx + k0 * sk) * es;
                    r[i] = g + i < w && x0 + g + i < n ? load8(row, t, kc - k0, round) : _mm256_setzero_ps();
                    /* short streams side by side: the next 8 rows' same
                     * line (at_gemm_prefetch_row says why) */
                    if (g + i < w && x0 + g + i + step < n && !(k0 * (int64_t)es & 63))
                        _mm_prefetch(row + (size_t)(step * sx) * es, _MM_HINT_T2);
                }
                transpose8(r);
                int kl = kc - k0 < 8 ? (int)(kc - k0) : 8;
                for (int i = 0; i < kl; i++)
                    store_lanes(dst + (k0 + i) * w + g, w - g, g == 0 && (k0 + i) * w + 8 <= kc * w, r[i]);
            }
        }
    }
}

/* One copy of pack_body per source type and rounding, and for f32 and bf16
 * sources (the f32 GEMMs and training's bf16 weights) per panel width of
 * the kernel, so that the loops over lanes unroll and the transpose stays
 * in registers. With the copy's order above, f32 packing on a Zen 5 went
 * from 10 / 5 / 12 GB/s (A transposed, B copied, B transposed) to 18 / 21 /
 * 22, a few percent of a training-shape GEMM (the pack was ~10% of it). */

static void pack_f32(void *dst, const void *src, at_dtype t, int64_t sx, int64_t sk, int w, int64_t n, int64_t kc,
                     int round)
{
    if (sx != 1 && sk != 1) { /* neither side contiguous (not made by the driver) */
        at_gemm_pack_portable(dst, src, t, sx, sk, w, n, kc, round);
        return;
    }
    if (t == AT_F32 && round) pack_body(dst, src, AT_F32, sx, sk, w, n, kc, 1);
    else if (t == AT_F32) AT_GEMM_PACK_BY_WIDTH(AT_F32, 0);
    else if (t == AT_BF16) AT_GEMM_PACK_BY_WIDTH(AT_BF16, 0);
    else if (round) pack_body(dst, src, AT_F16, sx, sk, w, n, kc, 1);
    else pack_body(dst, src, AT_F16, sx, sk, w, n, kc, 0);
}

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

/* The low-rank term of up to 6 rows (gemm_kernels.h) in tiles of RR rows x
 * 16 columns, the last columns masked (only they: AMD's masked stores are
 * slow). Each element's term is summed from 0 in k order, then added to C;
 * the 2·RR sums of a tile run side by side. One row and 8 columns at a time
 * made each sum a chain of r dependent multiply-adds, 3-4x slower per FLOP
 * than the product the term follows (2.3% of the small shape's LoRA step at
 * AVX2, 1.4% in tiles). */
static inline __attribute__((always_inline)) void lowrank_rows(const int RR, float *c, int64_t ldc, int n,
                                                               const float *u, int64_t ldu, const float *vt,
                                                               int64_t ldvt, int r)
{
    for (int j = 0; j < n; j += 16) {
        int w = n - j, full0 = w >= 8, full1 = w >= 16;
        __m256i mk0 = mask8(w), mk1 = mask8(w - 8);
#define Z(i) __m256 t##i##0 = _mm256_setzero_ps(), t##i##1 = _mm256_setzero_ps();
        Z(0) Z(1) Z(2) Z(3) Z(4) Z(5)
#undef Z
        for (int k = 0; k < r; k++) {
            const float *v = vt + k * ldvt + j;
            __m256 v0 = full0 ? _mm256_loadu_ps(v) : _mm256_maskload_ps(v, mk0);
            __m256 v1 = full1 ? _mm256_loadu_ps(v + 8) : w > 8 ? _mm256_maskload_ps(v + 8, mk1) : _mm256_setzero_ps();
#define F(i)                                                                                                           \
    if (RR > i) {                                                                                                      \
        __m256 s = _mm256_set1_ps(u[i * ldu + k]);                                                                     \
        t##i##0 = _mm256_fmadd_ps(s, v0, t##i##0);                                                                     \
        t##i##1 = _mm256_fmadd_ps(s, v1, t##i##1);                                                                     \
    }
            F(0) F(1) F(2) F(3) F(4) F(5)
#undef F
        }
#define S(i)                                                                                                           \
    if (RR > i) {                                                                                                      \
        float *ci = c + i * ldc + j;                                                                                   \
        if (full1) {                                                                                                   \
            _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), t##i##0));                                         \
            _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), t##i##1));                                 \
        } else {                                                                                                       \
            if (full0) _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), t##i##0));                              \
            else _mm256_maskstore_ps(ci, mk0, _mm256_add_ps(_mm256_maskload_ps(ci, mk0), t##i##0));                    \
            if (w > 8) _mm256_maskstore_ps(ci + 8, mk1, _mm256_add_ps(_mm256_maskload_ps(ci + 8, mk1), t##i##1));      \
        }                                                                                                              \
    }
        S(0) S(1) S(2) S(3) S(4) S(5)
#undef S
    }
}

static void lowrank_avx2(float *c, int64_t ldc, int m, int n, const float *u, int64_t ldu, const float *vt,
                         int64_t ldvt, int r)
{
    for (int i = 0; i < m; i += MR) {
        float *ci = c + i * ldc;
        const float *ui = u + i * ldu;
        switch (m - i < MR ? m - i : MR) {
        case 1: lowrank_rows(1, ci, ldc, n, ui, ldu, vt, ldvt, r); break;
        case 2: lowrank_rows(2, ci, ldc, n, ui, ldu, vt, ldvt, r); break;
        case 3: lowrank_rows(3, ci, ldc, n, ui, ldu, vt, ldvt, r); break;
        case 4: lowrank_rows(4, ci, ldc, n, ui, ldu, vt, ldvt, r); break;
        case 5: lowrank_rows(5, ci, ldc, n, ui, ldu, vt, ldvt, r); break;
        default: lowrank_rows(6, ci, ldc, n, ui, ldu, vt, ldvt, r); break;
        }
    }
}

const at_gemm_blocked at_gemm_f32_avx2 = {
    .name = "avx2", .mr = MR, .nr = NR, .kp = 1, .mc = 12 * MR, .kc = 1024, .nc = 64 * NR,
    .l1_ref = 48, .l2_ref = 1024, /* a Zen 5 */
    .pack = pack_f32, .kernel = kernel_f32, .lowrank = lowrank_avx2,
};

/* ---- small path (contract: gemm_kernels.h) ----
 * The same tiles as gemm_avx512.c's with 8 lanes, sized so that accumulators
 * and operands fit the 16 ymm registers; accumulators are named variables
 * (an array of them would live in memory). */
#define R4(M) M(0) M(1) M(2) M(3)
#define S8(M, r) M(r, 0) M(r, 1) M(r, 2) M(r, 3) M(r, 4) M(r, 5) M(r, 6) M(r, 7)
#define R4S8(M) S8(M, 0) S8(M, 1) S8(M, 2) S8(M, 3)

/* RR (<= 4) rows of y against SS (<= 8) rows of x (RR·SS <= 8), dot products
 * along k; only the first sv of the SS results per row are stored. x rows
 * are zero-padded to a multiple of 16, so they are read whole. The next RR
 * rows are prefetched (gemm_avx512.c's dot_tile says why). */
static inline __attribute__((always_inline)) void dot_tile(const int RR, const int SS, int64_t K, const float *x,
                                                           int64_t ldx, const char *y, const at_dtype yt,
                                                           int64_t ldy, const int round, float *out, int64_t ors,
                                                           int64_t oss, int sv)
{
    size_t es = yt == AT_F32 ? 4 : 2;
#define DECL(r, s) __m256 c##r##s = _mm256_setzero_ps();
    R4S8(DECL)
#undef DECL
    for (int64_t k = 0; k < K; k += 8) {
        __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
#define LY(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        y##r = load8(y + (size_t)(r * ldy + k) * es, yt, K - k, round);                                                \
        if (!(k & 15)) _mm_prefetch(y + (size_t)((RR + r) * ldy + k) * es, _MM_HINT_T0);                               \
    }
        R4(LY)
#undef LY
#define FM(r, s)                                                                                                       \
    if (RR > r && SS > s) c##r##s = _mm256_fmadd_ps(_mm256_loadu_ps(x + s * ldx + k), y##r, c##r##s);
        R4S8(FM)
#undef FM
    }
#define RED(r, s)                                                                                                      \
    if (RR > r && SS > s && s < sv) out[r * ors + s * oss] = hsum(c##r##s);
    R4S8(RED)
#undef RED
}

/* One row of x (decode's GEMV) against R rows of y, one row at a time
 * (gemm_kernels.h says why). Two accumulators, for k mod 16 below and above
 * 8: with one, each multiply-add waited on the last (4 cycles on Zen 4, 8
 * values each), and a core read f16 weights at 16 GB/s where two reach
 * 21-24, and two cores 30-31 where they reach 32-40 (1x4864x896 from memory).
 * So a value of out sums its products in another order than in dot_tile's
 * several rows of x; both are exact products added in f32. */
static inline __attribute__((always_inline)) void dot_row(int64_t K, const float *x, int64_t R, const char *y,
                                                          const at_dtype yt, int64_t ldy, const int round,
                                                          float *out, int64_t ors)
{
    size_t es = yt == AT_F32 ? 4 : 2;
    for (int64_t r = 0; r < R; r++, y += (size_t)ldy * es) {
        __m256 lo = _mm256_setzero_ps(), hi = lo;
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) {
            if (!((k * (int64_t)es) & 63)) _mm_prefetch(y + (size_t)(ldy + k) * es, _MM_HINT_T0); /* the next row */
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(y + (size_t)k * es, yt, 8, round), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load8(y + (size_t)(k + 8) * es, yt, 8, round), hi);
        }
        for (; k < K; k += 8) lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(y + (size_t)k * es, yt, K - k, round), lo);
        out[r * ors] = hsum(_mm256_add_ps(lo, hi));
    }
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
        if (sv <= 1) dot_row(K, xs, R, y, yt, ldy, round, os, ors);
        else if (sv <= 2) { RUN(4, 2) }
        else if (sv <= 4) { RUN(2, 4) }
        else { RUN(1, 8) }
#undef RUN
    }
}

/* Prefetched as in gemm_avx512.c (ahead: the next tile's lanes).
 * out[s][0..lv) (+)= sum over kb rows k of x[s][k] * y[k][..]
 * for SS (<= 8) rows of x and NV (<= 4) vectors of 8 lanes (SS·NV <= 8); the
 * first k block starts from zero, later ones add to out. */
static inline __attribute__((always_inline)) void axpy_tile(const int SS, const int NV, int kb, const float *x,
                                                            int64_t ldx, const char *y, const at_dtype yt,
                                                            int64_t ldy, const int round, float *out, int64_t lds,
                                                            int first, int sv, int64_t lv, const int ahead,
                                                            const int full)
{
    size_t es = yt == AT_F32 ? 4 : 2;
    __m256i m0 = mask8(lv), m1 = mask8(lv - 8), m2 = mask8(lv - 16), m3 = mask8(lv - 24);
#define DECL(v, s)                                                                                                     \
    __m256 c##s##v = NV > v && SS > s && !first && s < sv                                                              \
                         ? (full ? _mm256_loadu_ps(out + s * lds + 8 * v)                                              \
                                 : _mm256_maskload_ps(out + s * lds + 8 * v, m##v))                                    \
                         : _mm256_setzero_ps();
    R4S8(DECL) /* here the list's first index is the vector, the second the row of x */
#undef DECL
    for (int kk = 0; kk < kb; kk++) {
        const char *yk = y + (size_t)(kk * ldy) * es;
        __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0;
#define LY(v)                                                                                                          \
    if (NV > v) {                                                                                                      \
        y##v = load8(yk + 8 * v * es, yt, full ? 8 : lv - 8 * v, round);                                               \
        if (!(v & 1)) _mm_prefetch(yk + (size_t)(ahead ? 8 * NV + 8 * v : kb * ldy + 8 * v) * es, _MM_HINT_T0);        \
    }
        R4(LY)
#undef LY
#define FM(v, s)                                                                                                       \
    if (SS > s && NV > v) c##s##v = _mm256_fmadd_ps(_mm256_broadcast_ss(x + s * ldx + kk), y##v, c##s##v);
        R4S8(FM)
#undef FM
    }
#define ST(v, s)                                                                                                       \
    if (SS > s && NV > v && s < sv) {                                                                                  \
        if (full) _mm256_storeu_ps(out + s * lds + 8 * v, c##s##v);                                                    \
        else _mm256_maskstore_ps(out + s * lds + 8 * v, m##v, c##s##v);                                                \
    }
    R4S8(ST)
#undef ST
}

/* Lanes and rows of y cut as in gemm_avx512.c (at_gemm_axpy_kb, gemm_kernels.h). */
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
/* a tile of all its lanes without masks (+4-10% on LoRA's dA 8x896x512 per
 * core: the masks' registers and maskload/maskstore cost), an edge one with */
#define TILE(SS, NV, x_, o_, sv_, l, AHEAD)                                                                             \
    do {                                                                                                               \
        if (lc - (l) >= 8 * NV)                                                                                        \
            axpy_tile(SS, NV, kb, x_, ldx, yk + (l) * es, yt, ldy, round, o_, lds, k0 == 0, sv_, lc - (l), AHEAD, 1);  \
        else axpy_tile(SS, NV, kb, x_, ldx, yk + (l) * es, yt, ldy, round, o_, lds, k0 == 0, sv_, lc - (l), AHEAD, 0); \
    } while (0)
#define RUN(SS, NV, AHEAD)                                                                                             \
    for (int64_t l = 0; l < lc; l += 8 * NV) TILE(SS, NV, xs + k0, os + l0 + l, sv, l, AHEAD);
                if (sv <= 1) { RUN(1, 4, 0) }
                else if (sv <= 2) { RUN(2, 4, 0) }
                else if (sv <= 4) { RUN(4, 2, 1) }
                else { /* rows 0-3 and 4-7 of x in turn over the same 16 lanes, which L1 holds: 8x1
                        * was bound by its 9 loads per 8 FMAs (+14% on 8x896x512, same run); 4x3
                        * tiles (12 accumulators) ran at 0.6x of these */
                    for (int64_t l = 0; l < lc; l += 16) {
                        TILE(4, 2, xs + k0, os + l0 + l, 4, l, 1);
                        TILE(4, 2, xs + 4 * ldx + k0, os + 4 * lds + l0 + l, sv - 4, l, 1);
                    }
                }
#undef RUN
#undef TILE
            }
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

static void dot_avx2(int S, int64_t K, const float *x, int64_t ldx, int64_t R, const void *y, at_dtype yt, int64_t ldy,
                     int round, float *out, int64_t ors, int64_t oss)
{
    BY_TYPE(DOT, S, K, x, ldx, R, y);
}

static void axpy_avx2(int S, int64_t K, const float *x, int64_t ldx, int64_t L, const void *y, at_dtype yt,
                      int64_t ldy, int round, float *out, int64_t lds)
{
    BY_TYPE(AXPY, S, K, x, ldx, L, y);
}

/* ---- outer-product path (gemm_kernels.h) ----
 * A tile is RR (<= 6) rows of C by 16 lanes, as the 6x16 microkernel: 12
 * accumulators, per k two loads of b and RR broadcasts of a. A full f32 tile
 * is written in place; edges and bf16 C go through at_gemm_store_tile. */
#define R6(M) M(0) M(1) M(2) M(3) M(4) M(5)
static inline __attribute__((always_inline)) void outer_tile(const int RR, int K, const float *a, int64_t lda,
                                                             const float *b, int64_t ldb, char *c, at_dtype ct,
                                                             int64_t ldc, float alpha, float beta, int64_t lv)
{
#define DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = c##r##0;
    R6(DECL)
#undef DECL
    for (int k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(b + k * ldb), b1 = _mm256_loadu_ps(b + k * ldb + 8);
#define FM(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        __m256 ab = _mm256_broadcast_ss(a + r * lda + k);                                                              \
        c##r##0 = _mm256_fmadd_ps(ab, b0, c##r##0);                                                                    \
        c##r##1 = _mm256_fmadd_ps(ab, b1, c##r##1);                                                                    \
    }
        R6(FM)
#undef FM
    }
    if (ct == AT_F32 && lv >= 16) { /* at_gemm_store_tile's values, bit for bit (gemm_avx512.c says why) */
        __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#define ST1(r, v)                                                                                                      \
    {                                                                                                                  \
        float *p = (float *)c + r * ldc + 8 * v;                                                                       \
        __m256 t = alpha == 1.0f ? c##r##v : _mm256_mul_ps(va, c##r##v);                                               \
        if (beta == 1.0f) t = _mm256_add_ps(t, _mm256_loadu_ps(p));                                                    \
        else if (beta != 0.0f) t = _mm256_add_ps(t, _mm256_mul_ps(vb, _mm256_loadu_ps(p)));                            \
        _mm256_storeu_ps(p, t);                                                                                        \
    }
#define ST(r)                                                                                                          \
    if (RR > r) {                                                                                                      \
        ST1(r, 0) ST1(r, 1)                                                                                            \
    }
        R6(ST)
#undef ST1
#undef ST
        return;
    }
    float t[6 * 16];
#define T(r)                                                                                                           \
    if (RR > r) {                                                                                                      \
        _mm256_storeu_ps(t + r * 16, c##r##0);                                                                         \
        _mm256_storeu_ps(t + r * 16 + 8, c##r##1);                                                                     \
    }
    R6(T)
#undef T
    at_gemm_store_tile(t, 16, c, ct, ldc, RR, lv < 16 ? (int)lv : 16, alpha, beta);
}

static void outer_avx2(int64_t R, int64_t L, int K, const float *a, int64_t lda, const float *b, int64_t ldb,
                       void *c_, at_dtype ct, int64_t ldc, float alpha, float beta)
{
    char *c = c_;
    size_t es = ct == AT_F32 ? 4 : 2;
    int64_t i = 0;
#define RUN(RR)                                                                                                        \
    for (int64_t l = 0; l < L; l += 16)                                                                                \
        outer_tile(RR, K, a + i * lda, lda, b + l, ldb, c + (size_t)(i * ldc + l) * es, ct, ldc, alpha, beta, L - l);
    for (; i + 6 <= R; i += 6) { RUN(6) }
    switch (R - i) {
    case 5: RUN(5) break;
    case 4: RUN(4) break;
    case 3: RUN(3) break;
    case 2: RUN(2) break;
    case 1: RUN(1) break;
    default: break;
    }
#undef RUN
}
#undef R6

const at_gemm_small at_gemm_small_avx2 = {.dot = dot_avx2, .axpy = axpy_avx2, .outer = outer_avx2};
