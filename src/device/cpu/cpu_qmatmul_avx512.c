/* AVX-512 dequantizers of the quantized matmul (see cpu_qmatmul.h). Every
 * value is computed exactly as device/quant.c computes it (an int or a code
 * book entry converted to f32, times the block scale: one rounding), so the
 * results are bit-identical to at_dequantize. NF4's 16-entry code book fits
 * one register, and vpermps looks up 16 values at a time. */
#include "device/cpu/cpu_qmatmul.h"

#include <immintrin.h>
#include <string.h>

#include "device/cpu/gemm_avx512_inl.h"
#include "device/quant.h"

static inline float f16_scale(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static void q8_0(float *y, const uint8_t *blk, int64_t nblk)
{
    for (int64_t b = 0; b < nblk; b++, blk += 2 + AT_QK8_0, y += AT_QK8_0) {
        __m512 d = _mm512_set1_ps(f16_scale(blk));
        __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + 2));
        __m128i q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d));
    }
}

static void q4_0(float *y, const uint8_t *blk, int64_t nblk)
{
    const __m128i m4 = _mm_set1_epi8(15);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t b = 0; b < nblk; b++, blk += 2 + AT_QK4_0 / 2, y += AT_QK4_0) {
        __m512 d = _mm512_set1_ps(f16_scale(blk));
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2));
        __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        __m512i vlo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(lo), eight);
        __m512i vhi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(hi), eight);
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(vlo), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(vhi), d));
    }
}

static void nf4(float *y, const uint8_t *nib, const float *absmax, int64_t nblk)
{
    const __m512 code = _mm512_loadu_ps(at_nf4_code);
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nblk; b++, nib += AT_NF4_BLOCK / 2, y += AT_NF4_BLOCK) {
        __m512 s = _mm512_set1_ps(absmax[b]);
        for (int h = 0; h < 2; h++) {
            /* 16 bytes = 32 values; byte i holds value 2i (high) and 2i+1 (low) */
            __m128i v = _mm_loadu_si128((const __m128i *)(nib + 16 * h));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4), lo = _mm_and_si128(v, m4);
            __m128i i0 = _mm_unpacklo_epi8(hi, lo), i1 = _mm_unpackhi_epi8(hi, lo);
            __m512 c0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(i0), code);
            __m512 c1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(i1), code);
            _mm512_storeu_ps(y + 32 * h, _mm512_mul_ps(c0, s));
            _mm512_storeu_ps(y + 32 * h + 16, _mm512_mul_ps(c1, s));
        }
    }
}

const at_cpu_qdeq at_cpu_qdeq_avx512 = {.name = "avx512", .q8_0 = q8_0, .q4_0 = q4_0, .nf4 = nf4};

/* ---- decode: M (<= 8) rows of x against one row of W, W streamed once ----
 * Each weight value is made exactly as the dequantizers above make it (and
 * rounded to bf16 when computing in bf16), then multiplied in f32. */

static inline __attribute__((always_inline)) void gemv_fma(const int MM, float *const *xs, int64_t k, __m512 v0,
                                                           __m512 v1, __m512 acc[8][2])
{
    for (int m = 0; m < MM; m++) {
        acc[m][0] = _mm512_fmadd_ps(_mm512_loadu_ps(xs[m] + k), v0, acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(_mm512_loadu_ps(xs[m] + k + 16), v1, acc[m][1]);
    }
}

static inline __attribute__((always_inline)) void gemv_body(const int MM, const int fmt, const int round, int64_t K,
                                                            const float *x, const uint8_t *blk, float *out)
{
    __m512 acc[8][2];
    float *xs[8];
    for (int m = 0; m < MM; m++) {
        acc[m][0] = acc[m][1] = _mm512_setzero_ps();
        xs[m] = (float *)x + m * K;
    }
    const __m128i m4 = _mm_set1_epi8(15);
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t k = 0; k < K; k += 32) {
        __m512 d = _mm512_set1_ps(f16_scale(blk)), v0, v1;
        if (fmt == AT_Q8_0) {
            v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
            v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
            blk += 2 + AT_QK8_0;
        } else {
            __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2));
            __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
            v0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(lo), eight));
            v1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(hi), eight));
            blk += 2 + AT_QK4_0 / 2;
        }
        v0 = _mm512_mul_ps(v0, d);
        v1 = _mm512_mul_ps(v1, d);
        if (round) {
            v0 = round_bf16(v0);
            v1 = round_bf16(v1);
        }
        gemv_fma(MM, xs, k, v0, v1, acc);
    }
    for (int m = 0; m < MM; m++) out[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
}

/* x rows of a row already dequantized to f32 (NF4). */
static inline __attribute__((always_inline)) void dotm_body(const int MM, const int round, int64_t K, const float *x,
                                                            const float *row, float *out)
{
    __m512 acc[8][2];
    float *xs[8];
    for (int m = 0; m < MM; m++) {
        acc[m][0] = acc[m][1] = _mm512_setzero_ps();
        xs[m] = (float *)x + m * K;
    }
    for (int64_t k = 0; k < K; k += 32) {
        __m512 v0 = _mm512_loadu_ps(row + k), v1 = _mm512_loadu_ps(row + k + 16);
        if (round) {
            v0 = round_bf16(v0);
            v1 = round_bf16(v1);
        }
        gemv_fma(MM, xs, k, v0, v1, acc);
    }
    for (int m = 0; m < MM; m++) out[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
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

const at_cpu_qgemv at_cpu_qgemv_avx512 = {
    .gemv = gemv, .dotm = dotm, .quant_x = at_cpu_quant_x_avx2, .gemv_i8 = at_cpu_gemv_i8_avx2};

/* ---- decode with int8 activations on AVX512_VNNI (see cpu_qmatmul.h) ----
 * Two blocks per 512-bit register (lanes 0-7 sum block b, 8-15 block b+1).
 * q8_0: one vpdpbusd multiplies |x| (unsigned) by w carrying x's sign and
 * sums groups of 4 (at most 4·127² per lane). q4_0: the unsigned nibbles
 * (both blocks' 16 bytes broadcast to two 128-bit lanes each, the high
 * nibbles shifted down in the odd lanes: values in order) multiply x
 * directly, the sum starting from xc's −8·Σx. The two blocks' scales are
 * converted together and spread over their lanes by one permute. Two
 * accumulators per row (even and odd pairs); an odd last block goes to the
 * AVX2 kernel's (at_cpu_gemv_i8_block_avx2). */
#define VNNI __attribute__((target("avx512vnni")))

static inline __attribute__((always_inline)) __m512i pair_bytes(const int fmt, const uint8_t *b0, const uint8_t *b1)
{
    if (fmt == AT_Q8_0)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                  _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(b0 + 2)));
    v = _mm512_mask_broadcast_i32x4(v, 0xFF00, _mm_loadu_si128((const __m128i *)(b1 + 2)));
    v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

static inline uint32_t u16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static inline __attribute__((always_inline)) VNNI void i8_pair(const int MM, const int fmt, int64_t K,
                                                              const int8_t *xq, const float *xd, const int32_t *xc,
                                                              const uint8_t *blk, size_t bb, int64_t b, __m512 *acc)
{
    const int64_t nb = K / 32;
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i w = pair_bytes(fmt, blk, blk + bb);
    __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(u16_at(blk) | u16_at(blk + bb) << 16)));
    for (int m = 0; m < MM; m++) {
        __m512i x = _mm512_loadu_si512((const void *)(xq + m * K + 32 * b)), s;
        if (fmt == AT_Q8_0) {
            __m512i sw = _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(x), _mm512_setzero_si512(), w);
            s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sw);
        } else {
            s = _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)(xc + m * (K / 4) + 8 * b)), w, x);
        }
        __m128 d = _mm_mul_ps(dw, _mm_castpd_ps(_mm_load_sd((const double *)(xd + m * nb + b))));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d)),
                                 acc[m]);
    }
}

static inline __attribute__((always_inline)) VNNI void gemv_i8_body(const int MM, const int fmt, int64_t K,
                                                                    const int8_t *xq, const float *xd,
                                                                    const int32_t *xc, const uint8_t *blk,
                                                                    float *out)
{
    __m512 acc0[8], acc1[8];
    for (int m = 0; m < MM; m++) acc0[m] = acc1[m] = _mm512_setzero_ps();
    const int64_t nb = K / 32;
    const size_t bb = fmt == AT_Q8_0 ? 2 + AT_QK8_0 : 2 + AT_QK4_0 / 2;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4, blk += 4 * bb) {
        i8_pair(MM, fmt, K, xq, xd, xc, blk, bb, b, acc0);
        i8_pair(MM, fmt, K, xq, xd, xc, blk + 2 * bb, bb, b + 2, acc1);
    }
    if (b + 2 <= nb) {
        i8_pair(MM, fmt, K, xq, xd, xc, blk, bb, b, acc0);
        b += 2;
        blk += 2 * bb;
    }
    float last[8] = {0};
    if (b < nb) at_cpu_gemv_i8_block_avx2(MM, K, xq, xd, xc, (at_dtype)fmt, blk, b, last);
    for (int m = 0; m < MM; m++) out[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[m], acc1[m])) + last[m];
}

static VNNI void gemv_i8_vnni(int M, int64_t K, const int8_t *xq, const float *xd, const int32_t *xc, at_dtype t,
                              const uint8_t *blocks, float *out)
{
#define G(MM)                                                                                                          \
    if (t == AT_Q8_0) gemv_i8_body(MM, AT_Q8_0, K, xq, xd, xc, blocks, out);                                          \
    else gemv_i8_body(MM, AT_Q4_0, K, xq, xd, xc, blocks, out);
    AT_QGEMV_BY_M(G)
#undef G
}

const at_cpu_qgemv at_cpu_qgemv_avx512vnni = {
    .gemv = gemv, .dotm = dotm, .quant_x = at_cpu_quant_x_avx2, .gemv_i8 = gemv_i8_vnni};
