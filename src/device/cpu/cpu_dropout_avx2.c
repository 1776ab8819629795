/* AVX2 dropout chunk (see cpu_dropout.h): cpu_dropout_avx512.c's hash and
 * shortcuts, bit for bit, on 4 uint64 lanes, one hash per pair of counters.
 * AVX2 has no 64-bit multiply (vpmullq) and no unsigned compare, so:
 *   a·m mod 2⁶⁴ = lo(a)·lo(m) + ((hi(a)·lo(m) + lo(a)·hi(m)) << 32),
 *     three 32x32->64 multiplies (vpmuludq);
 *   w >= thresh ⇔ max(w, thresh) == w, unsigned 32-bit lanes (vpmaxud).
 * Lane j's hash h belongs to counters first + 2j (its low 32 bits) and
 * first + 2j + 1 (its high 32), which are where the 32-bit lanes of the
 * register put them: the compare gives the 8 floats' mask in order. On a
 * Zen 5 held to AVX2 the scalar hash (at_rng_hash_uniform per value) took 5%
 * of a Qwen2.5-0.5B LoRA step and dropout ~9% in all; this chunk with a hash
 * per counter 2.1%; with one per pair the small shape's step ran 1.1% faster. */
#include "device/cpu/cpu_dropout.h"

#include <immintrin.h>

#define K1 0xd1342543de82ef95ull
#define G 0x9e3779b97f4a7c15ull
#define M1 0xbf58476d1ce4e5b9ull
#define M2 0x94d049bb133111ebull
#define PREFETCH 256 /* values ahead (1 KiB), as the AVX-512 chunk */

/* a·m mod 2⁶⁴ per lane, m given as its low (m_lo) and high (m_hi) halves in
 * the low 32 bits of each lane. */
static inline __m256i mul64(__m256i a, __m256i m_lo, __m256i m_hi)
{
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), m_lo), _mm256_mul_epu32(a, m_hi));
    return _mm256_add_epi64(_mm256_mul_epu32(a, m_lo), _mm256_slli_epi64(cross, 32));
}

/* All-ones in the 32-bit lanes (counters first + 2j, first + 2j + 1 for the
 * pair ctr = (first / 2 + j)·K1 of 64-bit lane j) that are kept. */
static inline __m256i keep8(__m256i ctr, __m256i vseed, __m256i vthresh)
{
    const __m256i g = _mm256_set1_epi64x((long long)G);
    const __m256i m1l = _mm256_set1_epi64x((long long)(M1 & 0xffffffffu)), m1h = _mm256_set1_epi64x((long long)(M1 >> 32));
    const __m256i m2l = _mm256_set1_epi64x((long long)(M2 & 0xffffffffu)), m2h = _mm256_set1_epi64x((long long)(M2 >> 32));
    __m256i z = _mm256_add_epi64(_mm256_xor_si256(vseed, ctr), g);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m1l, m1h);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m2l, m2h);
    z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
    return _mm256_cmpeq_epi32(_mm256_max_epu32(z, vthresh), z);
}

void at_cpu_dropout_chunk_avx2(float *y, const float *x, int64_t n, uint64_t seed, uint64_t first, uint32_t thresh,
                               float keep)
{
    const __m256i vseed = _mm256_set1_epi64x((long long)seed), vthresh = _mm256_set1_epi32((int)thresh);
    const __m256i step = _mm256_set1_epi64x((long long)(4 * K1));
    const __m256 vk = _mm256_set1_ps(keep);
    /* lane j: the pair first / 2 + j, times K1 */
    __m256i ctr = _mm256_add_epi64(_mm256_set1_epi64x((long long)((first >> 1) * K1)),
                                   _mm256_set_epi64x((long long)(3 * K1), (long long)(2 * K1), (long long)K1, 0));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_prefetch((const char *)(x + i + PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(y + i + PREFETCH), _MM_HINT_T0);
        __m256i m = keep8(ctr, vseed, vthresh);
        _mm256_storeu_ps(y + i, _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vk), _mm256_castsi256_ps(m)));
        ctr = _mm256_add_epi64(ctr, step);
    }
    if (i < n) { /* the last 1-7 values, through a zeroed copy */
        float bx[8] = {0}, by[8];
        for (int64_t j = i; j < n; j++) bx[j - i] = x[j];
        __m256i m = keep8(ctr, vseed, vthresh);
        _mm256_storeu_ps(by, _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(bx), vk), _mm256_castsi256_ps(m)));
        for (int64_t j = i; j < n; j++) y[j] = by[j - i];
    }
}
