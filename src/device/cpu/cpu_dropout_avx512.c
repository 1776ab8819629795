/* AVX-512 dropout chunk (see cpu_dropout.h): the splitmix64 hash of
 * at_rng_dropout_uniform on 8 uint64 lanes at a time (vpmullq, AVX512DQ),
 * bit for bit the scalar one, each lane for a pair of counters:
 *   x = seed ^ ((c >> 1)·K1);  z = x + G;  z = (z ^ z>>30)·M1;
 *   z = (z ^ z>>27)·M2;  h = z ^ z>>31;  w = c even ? lo32(h) : hi32(h);
 *   u = (w >> 8)·2⁻²⁴;  keep when u >= p.
 * (c >> 1)·K1 for consecutive pairs is a running sum (step K1, mod 2⁶⁴),
 * and keep ⇔ w >= thresh with thresh = ceil(p·2²⁴) << 8, an unsigned
 * compare of 32-bit lanes, which hold the counters in order (lane j's h:
 * lanes 2j and 2j + 1). Kept values are x·keep (one f32 multiply, as the
 * scalar path). The loop prefetches x and y a kilobyte ahead: the hash
 * keeps it busy enough that the hardware prefetchers fall behind, and on
 * the intermediate-size rows of a training step (512 x 4864 f32, 10 MB) it
 * ran at 1.5-2.2 G values/s without, 6.4 with (Zen 5, one thread, a hash per
 * counter; the hash alone 8.5, a plain copy 5.6). */
#include "device/cpu/cpu_dropout.h"

#include <immintrin.h>

#define K1 0xd1342543de82ef95ull
#define G 0x9e3779b97f4a7c15ull
#define M1 0xbf58476d1ce4e5b9ull
#define M2 0x94d049bb133111ebull
#define PREFETCH 256 /* values ahead (1 KiB) */

/* Keep bits of the 16 counters of the 8 pairs whose (c >> 1)·K1 are ctr. */
static inline __mmask16 keep16(__m512i ctr, __m512i vseed, __m512i thresh)
{
    const __m512i g = _mm512_set1_epi64((long long)G), m1 = _mm512_set1_epi64((long long)M1),
                  m2 = _mm512_set1_epi64((long long)M2);
    __m512i z = _mm512_add_epi64(_mm512_xor_si512(vseed, ctr), g);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), m1);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
    return _mm512_cmpge_epu32_mask(z, thresh);
}

void at_cpu_dropout_chunk_avx512(float *y, const float *x, int64_t n, uint64_t seed, uint64_t first,
                                 uint32_t thresh, float keep)
{
    const __m512i vseed = _mm512_set1_epi64((long long)seed), vt = _mm512_set1_epi32((int)thresh);
    const __m512i step = _mm512_set1_epi64((long long)(8 * K1));
    const __m512 vk = _mm512_set1_ps(keep);
    /* lane j: the pair first / 2 + j, times K1 */
    __m512i ctr = _mm512_add_epi64(_mm512_set1_epi64((long long)((first >> 1) * K1)),
                                   _mm512_set_epi64((long long)(7 * K1), (long long)(6 * K1), (long long)(5 * K1),
                                                    (long long)(4 * K1), (long long)(3 * K1), (long long)(2 * K1),
                                                    (long long)K1, 0));
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)(x + i + PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(y + i + PREFETCH), _MM_HINT_T0);
        __mmask16 m = keep16(ctr, vseed, vt);
        _mm512_storeu_ps(y + i, _mm512_maskz_mul_ps(m, _mm512_loadu_ps(x + i), vk));
        ctr = _mm512_add_epi64(ctr, step);
    }
    if (i < n) {
        __mmask16 t = (__mmask16)((1u << (n - i)) - 1);
        __mmask16 m = keep16(ctr, vseed, vt);
        _mm512_mask_storeu_ps(y + i, t, _mm512_maskz_mul_ps(m & t, _mm512_maskz_loadu_ps(t, x + i), vk));
    }
}
