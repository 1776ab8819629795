/* AVX2 dequantizers of the quantized matmul (see cpu_qmatmul.h); bit-identical
 * to device/quant.c's (one rounding per value). NF4's code book is two
 * 8-entry halves: vpermps looks up the low 3 bits of the index in both and
 * bit 3 picks the half. */
#include "device/cpu/cpu_qmatmul.h"

#include <immintrin.h>
#include <string.h>

#include "device/cpu/gemm_avx2_inl.h"
#include "device/quant.h"

static inline float f16_scale(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline void store8(float *y, __m128i bytes8, __m256 d, int is_signed, int bias)
{
    __m256i v = is_signed ? _mm256_cvtepi8_epi32(bytes8) : _mm256_cvtepu8_epi32(bytes8);
    if (bias) v = _mm256_sub_epi32(v, _mm256_set1_epi32(bias));
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(v), d));
}

static void q8_0(float *y, const uint8_t *blk, int64_t nblk)
{
    for (int64_t b = 0; b < nblk; b++, blk += 2 + AT_QK8_0, y += AT_QK8_0) {
        __m256 d = _mm256_set1_ps(f16_scale(blk));
        __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + 2));
        __m128i q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
        store8(y, q0, d, 1, 0);
        store8(y + 8, _mm_srli_si128(q0, 8), d, 1, 0);
        store8(y + 16, q1, d, 1, 0);
        store8(y + 24, _mm_srli_si128(q1, 8), d, 1, 0);
    }
}

static void q4_0(float *y, const uint8_t *blk, int64_t nblk)
{
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nblk; b++, blk += 2 + AT_QK4_0 / 2, y += AT_QK4_0) {
        __m256 d = _mm256_set1_ps(f16_scale(blk));
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2));
        __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        store8(y, lo, d, 0, 8);
        store8(y + 8, _mm_srli_si128(lo, 8), d, 0, 8);
        store8(y + 16, hi, d, 0, 8);
        store8(y + 24, _mm_srli_si128(hi, 8), d, 0, 8);
    }
}

/* code[idx] for 8 indices in 0..15 */
static inline __m256 lookup16(__m256i idx, __m256 lut_lo, __m256 lut_hi)
{
    __m256 lo = _mm256_permutevar8x32_ps(lut_lo, idx), hi = _mm256_permutevar8x32_ps(lut_hi, idx);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

static void nf4(float *y, const uint8_t *nib, const float *absmax, int64_t nblk)
{
    const __m256 lut_lo = _mm256_loadu_ps(at_nf4_code), lut_hi = _mm256_loadu_ps(at_nf4_code + 8);
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nblk; b++, nib += AT_NF4_BLOCK / 2, y += AT_NF4_BLOCK) {
        __m256 s = _mm256_set1_ps(absmax[b]);
        for (int h = 0; h < 2; h++) {
            /* byte i holds value 2i (high nibble) and 2i+1 (low nibble) */
            __m128i v = _mm_loadu_si128((const __m128i *)(nib + 16 * h));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4), lo = _mm_and_si128(v, m4);
            __m128i i0 = _mm_unpacklo_epi8(hi, lo), i1 = _mm_unpackhi_epi8(hi, lo);
            float *o = y + 32 * h;
            _mm256_storeu_ps(o, _mm256_mul_ps(lookup16(_mm256_cvtepu8_epi32(i0), lut_lo, lut_hi), s));
            _mm256_storeu_ps(o + 8,
                             _mm256_mul_ps(lookup16(_mm256_cvtepu8_epi32(_mm_srli_si128(i0, 8)), lut_lo, lut_hi), s));
            _mm256_storeu_ps(o + 16, _mm256_mul_ps(lookup16(_mm256_cvtepu8_epi32(i1), lut_lo, lut_hi), s));
            _mm256_storeu_ps(o + 24,
                             _mm256_mul_ps(lookup16(_mm256_cvtepu8_epi32(_mm_srli_si128(i1, 8)), lut_lo, lut_hi), s));
        }
    }
}

const at_cpu_qdeq at_cpu_qdeq_avx2 = {.name = "avx2", .q8_0 = q8_0, .q4_0 = q4_0, .nf4 = nf4};

/* ---- decode: M (<= 8) rows of x against one row of W, W streamed once ----
 * Each weight value is made exactly as the dequantizers above make it (and
 * rounded to bf16 when computing in bf16), then multiplied in f32. A block
 * of 32 is four vectors: even ones accumulate in acc[m][0], odd in [1]. */
static inline __attribute__((always_inline)) void gemv_fma(const int MM, float *const *xs, int64_t k, const __m256 v[4],
                                                           __m256 acc[8][2])
{
    for (int m = 0; m < MM; m++)
        for (int i = 0; i < 4; i++)
            acc[m][i & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[m] + k + 8 * i), v[i], acc[m][i & 1]);
}

static inline __attribute__((always_inline)) void gemv_body(const int MM, const int fmt, const int round, int64_t K,
                                                            const float *x, const uint8_t *blk, float *out)
{
    __m256 acc[8][2];
    float *xs[8];
    for (int m = 0; m < MM; m++) {
        acc[m][0] = acc[m][1] = _mm256_setzero_ps();
        xs[m] = (float *)x + m * K;
    }
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int64_t k = 0; k < K; k += 32) {
        __m256 d = _mm256_set1_ps(f16_scale(blk)), v[4];
        __m128i q0, q1;
        if (fmt == AT_Q8_0) {
            q0 = _mm_loadu_si128((const __m128i *)(blk + 2));
            q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
            blk += 2 + AT_QK8_0;
        } else {
            __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2));
            q0 = _mm_and_si128(q, m4);
            q1 = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
            blk += 2 + AT_QK4_0 / 2;
        }
        for (int i = 0; i < 4; i++) {
            /* values 8i..8i+7: bytes 0-7 or 8-15 of q0 (i < 2) or q1 */
            __m128i b = i & 2 ? q1 : q0;
            if (i & 1) b = _mm_srli_si128(b, 8);
            __m256i w = fmt == AT_Q8_0 ? _mm256_cvtepi8_epi32(b) : _mm256_sub_epi32(_mm256_cvtepu8_epi32(b), eight);
            v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(w), d);
            if (round) v[i] = round_bf16(v[i]);
        }
        gemv_fma(MM, xs, k, v, acc);
    }
    for (int m = 0; m < MM; m++) out[m] = hsum(_mm256_add_ps(acc[m][0], acc[m][1]));
}

/* x rows of a row already dequantized to f32 (NF4). */
static inline __attribute__((always_inline)) void dotm_body(const int MM, const int round, int64_t K, const float *x,
                                                            const float *row, float *out)
{
    __m256 acc[8][2];
    float *xs[8];
    for (int m = 0; m < MM; m++) {
        acc[m][0] = acc[m][1] = _mm256_setzero_ps();
        xs[m] = (float *)x + m * K;
    }
    for (int64_t k = 0; k < K; k += 32) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(row + k + 8 * i);
            if (round) v[i] = round_bf16(v[i]);
        }
        gemv_fma(MM, xs, k, v, acc);
    }
    for (int m = 0; m < MM; m++) out[m] = hsum(_mm256_add_ps(acc[m][0], acc[m][1]));
}

static void gemv(int M, int64_t K, const float *x, at_dtype t, const uint8_t *blocks, int round, float *out)
{
#define G(MM)                                                                                                          \
    if (t == AT_Q8_0) round ? gemv_body(MM, AT_Q8_0, 1, K, x, blocks, out) : gemv_body(MM, AT_Q8_0, 0, K, x, blocks, out); \
    else round ? gemv_body(MM, AT_Q4_0, 1, K, x, blocks, out) : gemv_body(MM, AT_Q4_0, 0, K, x, blocks, out);
    AT_QGEMV_BY_M(G)
#undef G
}

static void dotm(int M, int64_t K, const float *x, const float *row, int round, float *out)
{
#define D(MM) round ? dotm_body(MM, 1, K, x, row, out) : dotm_body(MM, 0, K, x, row, out);
    AT_QGEMV_BY_M(D)
#undef D
}

/* ---- decode with int8 activations (see cpu_qmatmul.h) ----
 * Also the AVX-512 level's kernels: the weight row is read 32 values (one
 * block) at a time, which a 256-bit register holds. */

void at_cpu_quant_x_avx2(int64_t n, const float *x, int8_t *q, float *d)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / 32; b++, x += 32, q += 32) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h), db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid));
        /* packs works within 128-bit lanes: bytes come out in dword order 0 4 1 5 2 6 3 7 */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, order));
    }
}

/* The 32 values of a block as bytes: q8_0's signed values; q4_0's unsigned
 * nibbles n (the value is n − 8; low nibbles are values 0..15, high ones
 * 16..31). */
static inline __attribute__((always_inline)) __m256i block_bytes(const int fmt, const uint8_t *blk)
{
    if (fmt == AT_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2)), m4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

/* Per block, lanes of 4 values: q8_0 multiplies |x| (unsigned) by w carrying
 * x's sign; q4_0 the unsigned nibbles by x, plus xc's −8·Σx of the lane
 * (cpu_qmatmul.h). maddubs's pairs stay below int16's limit: 2·127·127. */
static inline __attribute__((always_inline)) void i8_block(const int MM, const int fmt, int64_t K, const int8_t *xq,
                                                           const float *xd, const int32_t *xc, const uint8_t *blk,
                                                           int64_t b, __m256 *acc)
{
    const int64_t nb = K / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i w = block_bytes(fmt, blk);
    __m256 dw = _mm256_set1_ps(f16_scale(blk));
    for (int m = 0; m < MM; m++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + m * K + 32 * b)), s;
        if (fmt == AT_Q8_0) s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x)), ones);
        else
            s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones),
                                 _mm256_loadu_si256((const __m256i *)(xc + m * (K / 4) + 8 * b)));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + m * nb + b)), acc[m]);
    }
}

/* Two accumulators per row (even and odd blocks), so that one row's chain
 * of dependent FMAs does not set the pace. */
static inline __attribute__((always_inline)) void gemv_i8_body(const int MM, const int fmt, int64_t K,
                                                               const int8_t *xq, const float *xd, const int32_t *xc,
                                                               const uint8_t *blk, float *out)
{
    __m256 acc0[8], acc1[8];
    for (int m = 0; m < MM; m++) acc0[m] = acc1[m] = _mm256_setzero_ps();
    const int64_t nb = K / 32;
    const size_t bb = fmt == AT_Q8_0 ? 2 + AT_QK8_0 : 2 + AT_QK4_0 / 2;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, blk += 2 * bb) {
        i8_block(MM, fmt, K, xq, xd, xc, blk, b, acc0);
        i8_block(MM, fmt, K, xq, xd, xc, blk + bb, b + 1, acc1);
    }
    if (b < nb) i8_block(MM, fmt, K, xq, xd, xc, blk, b, acc0);
    for (int m = 0; m < MM; m++) out[m] = hsum(_mm256_add_ps(acc0[m], acc1[m]));
}

void at_cpu_gemv_i8_block_avx2(int M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xc, at_dtype t,
                               const uint8_t *blk, int64_t b, float *out)
{
    __m256 acc[8];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    if (t == AT_Q8_0) i8_block(M, AT_Q8_0, K, xq, xd, xc, blk, b, acc);
    else i8_block(M, AT_Q4_0, K, xq, xd, xc, blk, b, acc);
    for (int m = 0; m < M; m++) out[m] = hsum(acc[m]);
}

void at_cpu_gemv_i8_avx2(int M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xc, at_dtype t,
                         const uint8_t *blocks, float *out)
{
#define G(MM)                                                                                                          \
    if (t == AT_Q8_0) gemv_i8_body(MM, AT_Q8_0, K, xq, xd, xc, blocks, out);                                          \
    else gemv_i8_body(MM, AT_Q4_0, K, xq, xd, xc, blocks, out);
    AT_QGEMV_BY_M(G)
#undef G
}

/* ---- prefill with int8 activations: 8 rows of W in the 8 lanes ----
 * Packed, the 8 rows' block b is 8 registers: register j holds, in lane l,
 * values 4j..4j+3 of row l (an 8 x 8 transpose of 32-bit groups), so that
 * one broadcast group of x multiplies 8 rows at once and the lanes of the
 * sum are 8 columns of C; scales (wd) are the 8 rows' d_w of the block. */

/* 8 x 8 transpose of 32-bit elements: r[i] lane e -> r[e] lane i. */
static inline void transpose8(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

void at_cpu_qpack8_avx2(at_dtype t, const uint8_t *const rows[8], int64_t K, uint8_t *wp, float *wd)
{
    const size_t bb = t == AT_Q8_0 ? 2 + AT_QK8_0 : 2 + AT_QK4_0 / 2;
    for (int64_t b = 0; b < K / 32; b++, wp += 256, wd += 8) {
        __m256i r[8];
        for (int l = 0; l < 8; l++) {
            const uint8_t *blk = rows[l] ? rows[l] + (size_t)b * bb : NULL;
            r[l] = !blk ? _mm256_setzero_si256() : t == AT_Q8_0 ? block_bytes(AT_Q8_0, blk) : block_bytes(AT_Q4_0, blk);
            wd[l] = blk ? f16_scale(blk) : 0.0f;
        }
        transpose8(r);
        for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(wp + 32 * j), r[j]);
        if (t == AT_Q8_0) { /* then |w|: the unsigned side of maddubs */
            wp += 256;
            for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(wp + 32 * j), _mm256_abs_epi8(r[j]));
        }
    }
}

/* One block of MM rows of x against the 8 packed rows. q4_0: the nibbles
 * (unsigned) times x, pairs at most 2·15·127, so the 8 registers' sums
 * stay in int16 (8·3810 < 2^15) until one madd; xs adds −8·Σx. q8_0: |w|
 * (packed once) times x carrying w's sign, pairs up to 2·127², widened at
 * once. */
static inline __attribute__((always_inline)) void gemm8_block(const int MM, const int fmt, int64_t K, const int8_t *xq,
                                                              const float *xd, const int32_t *xs, const uint8_t *wp,
                                                              const float *wd, int64_t b, __m256 *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t nb = K / 32;
    __m256i w[8]; /* q4_0: the nibbles; q8_0: |w| (w's signs stay in memory) */
    for (int j = 0; j < 8; j++) w[j] = _mm256_loadu_si256((const __m256i *)(wp + (fmt == AT_Q8_0 ? 256 : 0) + 32 * j));
    __m256 dw = _mm256_loadu_ps(wd);
    for (int m = 0; m < MM; m++) {
        const int8_t *x = xq + m * K + 32 * b;
        __m256i s;
        if (fmt == AT_Q4_0) {
            __m256i s16 = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                int32_t g;
                memcpy(&g, x + 4 * j, 4);
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[j], _mm256_set1_epi32(g)));
            }
            s = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(xs[m * nb + b]));
        } else {
            s = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                int32_t g;
                memcpy(&g, x + 4 * j, 4);
                __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(g), _mm256_loadu_si256((const __m256i *)(wp + 32 * j)));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(w[j], sx), ones));
            }
        }
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + m * nb + b)), acc[m]);
    }
}

#define GEMM8_MR 4

static inline __attribute__((always_inline)) void gemm8_rows(const int MM, const int fmt, int64_t K, const int8_t *xq,
                                                             const float *xd, const int32_t *xs, const uint8_t *wp,
                                                             const float *wd, float *out)
{
    __m256 acc[GEMM8_MR];
    for (int m = 0; m < MM; m++) acc[m] = _mm256_setzero_ps();
    const size_t stride = fmt == AT_Q8_0 ? 512 : 256;
    for (int64_t b = 0; b < K / 32; b++) gemm8_block(MM, fmt, K, xq, xd, xs, wp + stride * b, wd + 8 * b, b, acc);
    for (int m = 0; m < MM; m++) _mm256_storeu_ps(out + 8 * m, acc[m]);
}

void at_cpu_qgemm8_avx2(at_dtype t, int64_t M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xs,
                        const uint8_t *wp, const float *wd, float *out)
{
    const int64_t nb = K / 32;
    int64_t m = 0;
#define R(MM)                                                                                                          \
    (t == AT_Q8_0 ? gemm8_rows(MM, AT_Q8_0, K, xq + m * K, xd + m * nb, NULL, wp, wd, out + 8 * m)                     \
                  : gemm8_rows(MM, AT_Q4_0, K, xq + m * K, xd + m * nb, xs + m * nb, wp, wd, out + 8 * m))
    for (; m + GEMM8_MR <= M; m += GEMM8_MR) R(GEMM8_MR);
    switch (M - m) {
    case 3: R(3); break;
    case 2: R(2); break;
    case 1: R(1); break;
    default: break;
    }
#undef R
}

const at_cpu_qgemv at_cpu_qgemv_avx2 = {
    .gemv = gemv, .dotm = dotm, .quant_x = at_cpu_quant_x_avx2, .gemv_i8 = at_cpu_gemv_i8_avx2};
