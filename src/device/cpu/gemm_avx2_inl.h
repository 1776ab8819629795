/* AVX2 helpers shared by gemm_avx2.c and cpu_qmatmul_avx2.c (static inline;
 * include only from files compiled with the AVX2 flags). */
#ifndef AT_DEVICE_CPU_GEMM_AVX2_INL_H
#define AT_DEVICE_CPU_GEMM_AVX2_INL_H

#include <immintrin.h>

/* Rounds f32 lanes to the nearest bf16 value (ties to even), NaN kept quiet. */
static inline __m256 round_bf16(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* The sum of the 8 lanes. */
static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
