/* CPU kernels of the counter-based dropout (LoRA dropout) and of NEFTune's
 * uniform noise (at_cpu_dropout, at_cpu_add_uniform_noise: cpu_kernels.h;
 * math in ops/ops.h), and their AVX-512 and AVX2 inner loops. */
#ifndef AT_DEVICE_CPU_CPU_DROPOUT_H
#define AT_DEVICE_CPU_CPU_DROPOUT_H

#include <stdint.h>

/* One chunk of f32 values: y[i] = x[i] · keep when counter first + i is
 * kept, else 0 (y may be x); first is even. Kept means
 * at_rng_dropout_uniform(seed, first + i) >= p, which is the same as the
 * counter's 32-bit word of the hash >= thresh = ceil(p · 2²⁴) << 8 (0 < p < 1
 * in f32, so thresh < 2³²). Defined in cpu_dropout_avx512.c and
 * cpu_dropout_avx2.c; call only when at_cpu_isa_level() is at least the
 * function's level. */
void at_cpu_dropout_chunk_avx512(float *y, const float *x, int64_t n, uint64_t seed, uint64_t first,
                                 uint32_t thresh, float keep);
void at_cpu_dropout_chunk_avx2(float *y, const float *x, int64_t n, uint64_t seed, uint64_t first, uint32_t thresh,
                               float keep);

#endif
