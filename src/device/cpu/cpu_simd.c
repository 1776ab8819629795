/* Baseline (x86-64 / any target) build of the vector primitives, and the
 * run-time choice among the builds. */
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
#endif
    return &at_cpu_simd_scalar;
}
