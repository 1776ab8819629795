/* Baseline build of the vector primitives, and the run-time choice among the
 * builds. On x86-64 the baseline is SSE2; on aarch64 NEON is baseline too, so
 * this file is compiled there without vectors (AT_SIMD_PLAIN, and CMake adds
 * -fno-tree-vectorize) and cpu_simd_neon.c is the NEON build. */
#if defined(__aarch64__)
#define AT_SIMD_PLAIN 1
#endif
#define AT_SIMD_TABLE at_cpu_simd_scalar
#define AT_SIMD_NAME "scalar"
#include "device/cpu/cpu_simd_impl.h"

#include "device/cpu/cpu_features.h"

const at_cpu_simd *at_cpu_simd_get(void)
{
#if defined(__x86_64__)
    at_cpu_isa level = at_cpu_isa_level();
    if (level >= AT_ISA_AVX512) return &at_cpu_simd_avx512;
    if (level >= AT_ISA_AVX2) return &at_cpu_simd_avx2;
#elif defined(__aarch64__)
    if (at_cpu_isa_level() >= AT_ISA_NEON) return &at_cpu_simd_neon;
#endif
    return &at_cpu_simd_scalar;
}
