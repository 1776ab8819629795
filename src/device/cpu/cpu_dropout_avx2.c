/* AVX2 dropout chunk (see cpu_dropout.h): cpu_dropout_avx512.c's hash and
 * shortcuts, bit for bit, on 4 uint64 lanes. AVX2 has no 64-bit multiply
 * (vpmullq) and no unsigned compare, so:
 *   a·m mod 2⁶⁴ = lo(a)·lo(m) + ((hi(a)·lo(m) + lo(a)·hi(m)) << 32),
 *     three 32x32->64 multiplies (vpmuludq);
 *   z >= thresh ⇔ (z ^ 2⁶³) > ((thresh − 1) ^ 2⁶³) as signed (thresh >= 2⁴⁰).
 * Two vectors of counters hold elements 0, 2, 4, 6 and 1, 3, 5, 7 of a group
 * of 8, so that blending their compare results' 32-bit halves (even ones
 * from the first, odd from the second) gives the 8 floats' mask in order.
 * On a Zen 5 held to AVX2 the scalar hash (at_rng_hash_uniform per value)
 * took 5% of a Qwen2.5-0.5B LoRA step and dropout ~9% in all. */
#include "device/cpu/cpu_dropout.h"

#include <immintrin.h>

#define K1 0xd1342543de82ef95ull
#define G 0x9e3779b97f4a7c15ull
#define M1 0xbf58476d1ce4e5b9ull
#define M2 0x94d049bb133111ebull
#define SIGN 0x8000000000000000ull
#define PREFETCH 256 /* values ahead (1 KiB), as the AVX-512 chunk */

/* a·m mod 2⁶⁴ per lane, m given as its low (m_lo) and high (m_hi) halves in
 * the low 32 bits of each lane. */
static inline __m256i mul64(__m256i a, __m256i m_lo, __m256i m_hi)
{
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), m_lo), _mm256_mul_epu32(a, m_hi));
    return _mm256_add_epi64(_mm256_mul_epu32(a, m_lo), _mm256_slli_epi64(cross, 32));
}

/* All-ones in the lanes whose counters times K1 are ctr and are kept. */
static inline __m256i keep4(__m256i ctr, __m256i vseed, __m256i tbias)
{
    const __m256i g = _mm256_set1_epi64x((long long)G), sign = _mm256_set1_epi64x((long long)SIGN);
    const __m256i m1l = _mm256_set1_epi64x((long long)(M1 & 0xffffffffu)), m1h = _mm256_set1_epi64x((long long)(M1 >> 32));
    const __m256i m2l = _mm256_set1_epi64x((long long)(M2 & 0xffffffffu)), m2h = _mm256_set1_epi64x((long long)(M2 >> 32));
    __m256i z = _mm256_add_epi64(_mm256_xor_si256(vseed, ctr), g);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m1l, m1h);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m2l, m2h);
    return _mm256_cmpgt_epi64(_mm256_xor_si256(z, sign), tbias);
}

void at_cpu_dropout_chunk_avx2(float *y, const float *x, int64_t n, uint64_t seed, uint64_t first, uint64_t thresh,
                               float keep)
{
    const __m256i vseed = _mm256_set1_epi64x((long long)seed),
                  tbias = _mm256_set1_epi64x((long long)((thresh - 1) ^ SIGN));
    const __m256i step = _mm256_set1_epi64x((long long)(8 * K1));
    const __m256 vk = _mm256_set1_ps(keep);
    const __m256i c0 = _mm256_set1_epi64x((long long)(first * K1));
    /* lane j of even: (first + 2j)·K1; of odd: (first + 2j + 1)·K1 */
    __m256i even = _mm256_add_epi64(c0, _mm256_set_epi64x((long long)(6 * K1), (long long)(4 * K1),
                                                          (long long)(2 * K1), 0));
    __m256i odd = _mm256_add_epi64(even, _mm256_set1_epi64x((long long)K1));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_prefetch((const char *)(x + i + PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(y + i + PREFETCH), _MM_HINT_T0);
        __m256i m = _mm256_blend_epi32(keep4(even, vseed, tbias), keep4(odd, vseed, tbias), 0xaa);
        _mm256_storeu_ps(y + i, _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vk), _mm256_castsi256_ps(m)));
        even = _mm256_add_epi64(even, step);
        odd = _mm256_add_epi64(odd, step);
    }
    if (i < n) { /* the last 1-7 values, through a zeroed copy */
        float bx[8] = {0}, by[8];
        for (int64_t j = i; j < n; j++) bx[j - i] = x[j];
        __m256i m = _mm256_blend_epi32(keep4(even, vseed, tbias), keep4(odd, vseed, tbias), 0xaa);
        _mm256_storeu_ps(by, _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(bx), vk), _mm256_castsi256_ps(m)));
        for (int64_t j = i; j < n; j++) y[j] = by[j - i];
    }
}
