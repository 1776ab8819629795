/* AVX-512 dequantizers of the quantized matmul (see cpu_qmatmul.h). Every
 * value is computed exactly as device/quant.c computes it (an int or a code
 * book entry converted to f32, times the block scale: one rounding), so the
 * results are bit-identical to at_dequantize. NF4's 16-entry code book fits
 * one register, and vpermps looks up 16 values at a time. */
#include "device/cpu/cpu_qmatmul.h"

#include <immintrin.h>
#include <string.h>

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
