/* AVX2 + FMA + F16C build of the vector primitives (flags from the file name). */
#if defined(__x86_64__)
#define AT_SIMD_TABLE at_cpu_simd_avx2
#define AT_SIMD_NAME "avx2"
#include "device/cpu/cpu_simd_impl.h"
#else
typedef int at_cpu_simd_avx2_unused;
#endif
