/* CPU kernels of the counter-based dropout (LoRA dropout) and of NEFTune's
 * uniform noise (at_cpu_dropout, at_cpu_add_uniform_noise: cpu_kernels.h;
 * math in ops/ops.h), and their AVX-512 inner loop. */
#ifndef AT_DEVICE_CPU_CPU_DROPOUT_H
#define AT_DEVICE_CPU_CPU_DROPOUT_H

#include <stdint.h>

/* One chunk of f32 values: y[i] = x[i] · keep when element first + i is kept,
 * else 0 (y may be x). Kept means at_rng_hash_uniform(seed, first + i) >= p,
 * which is the same as its hash's top 24 bits >= ceil(p · 2²⁴), passed as
 * thresh = ceil(p · 2²⁴) << 40. Defined in cpu_dropout_avx512.c; call only
 * when at_cpu_isa_level() >= AT_ISA_AVX512. */
void at_cpu_dropout_chunk_avx512(float *y, const float *x, int64_t n, uint64_t seed, uint64_t first,
                                 uint64_t thresh, float keep);

#endif
