/* Random numbers that can be saved and restored exactly (checkpoints resume
 * the same data order and dropout masks).
 *
 * at_rng is xoshiro256** (Blackman & Vigna) seeded through splitmix64; its
 * whole state is the four words in s[], so copying the struct saves it.
 * at_rng_hash_uniform is counter-based (splitmix64 of seed and index): the
 * value for element i does not depend on how the work was split across
 * threads, which keeps masks reproducible at any thread count. */
#ifndef AT_BASE_RNG_H
#define AT_BASE_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} at_rng;

void at_rng_seed(at_rng *r, uint64_t seed);
uint64_t at_rng_next(at_rng *r);
/* Uniform in [0, 1) with 24 random bits (float) or 53 (double). */
float at_rng_uniform(at_rng *r);
double at_rng_uniform_double(at_rng *r);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint64_t at_rng_below(at_rng *r, uint64_t n);
/* Standard normal (Box-Muller). */
double at_rng_normal(at_rng *r);
/* Fisher-Yates shuffle of n int64 indices. */
void at_rng_shuffle(at_rng *r, int64_t *v, int64_t n);

/* splitmix64 finalizer of (seed, index): a uniform float in [0, 1). */
float at_rng_hash_uniform(uint64_t seed, uint64_t index);

/* Dropout's uniform float in [0, 1) for counter c (ops.h's at_dropout): two
 * counters per hash. c and c ^ 1 share h = at_rng_mix(seed, c >> 1); an even
 * c takes h's low 32 bits, an odd c its high 32, and of those the top 24
 * give k·2⁻²⁴. A hash per counter was the costliest part of LoRA dropout
 * (a mask for every adapted layer's input, forward and backward): on an
 * AVX2 CPU, without 64-bit multiplies, 3% of a LoRA training step. */
float at_rng_dropout_uniform(uint64_t seed, uint64_t c);

/* The counter of element i of a tensor laid out in runs (the dropout and
 * noise operations, ops.h): offset + (i / run)·pitch + i % run, or offset + i
 * when run is 0. */
static inline uint64_t at_rng_run_counter(uint64_t offset, int64_t i, int64_t run, uint64_t pitch)
{
    return run > 0 ? offset + (uint64_t)(i / run) * pitch + (uint64_t)(i % run) : offset + (uint64_t)i;
}
/* The same hash's whole 64 bits: a seed derived from (seed, index), for
 * streams that must not overlap (one per layer and module of a dropout). */
uint64_t at_rng_mix(uint64_t seed, uint64_t index);

#endif
