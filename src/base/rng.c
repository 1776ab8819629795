#include "base/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void at_rng_seed(at_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

uint64_t at_rng_next(at_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float at_rng_uniform(at_rng *r) { return (float)(at_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

double at_rng_uniform_double(at_rng *r) { return (double)(at_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t at_rng_below(at_rng *r, uint64_t n)
{
    /* Rejection sampling: draw until the value falls in the largest multiple of n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = at_rng_next(r);
    } while (x >= limit);
    return x % n;
}

double at_rng_normal(at_rng *r)
{
    double u1 = at_rng_uniform_double(r), u2 = at_rng_uniform_double(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void at_rng_shuffle(at_rng *r, int64_t *v, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)at_rng_below(r, (uint64_t)i + 1);
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

uint64_t at_rng_mix(uint64_t seed, uint64_t index)
{
    uint64_t x = seed ^ (index * 0xd1342543de82ef95ull);
    return splitmix64(&x);
}

float at_rng_hash_uniform(uint64_t seed, uint64_t index)
{
    return (float)(at_rng_mix(seed, index) >> 40) * (1.0f / 16777216.0f);
}

float at_rng_dropout_uniform(uint64_t seed, uint64_t c)
{
    uint64_t h = at_rng_mix(seed, c >> 1);
    uint32_t w = (c & 1) ? (uint32_t)(h >> 32) : (uint32_t)h;
    return (float)(w >> 8) * (1.0f / 16777216.0f);
}
