/* Advanced SIMD (NEON) build of the vector primitives, aarch64 only. */
#define AT_SIMD_TABLE at_cpu_simd_neon
#define AT_SIMD_NAME "neon"
#include "device/cpu/cpu_simd_impl.h"
