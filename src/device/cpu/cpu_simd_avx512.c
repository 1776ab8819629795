/* AVX-512 (F, BW, VL, DQ) build of the vector primitives (flags from the file name). */
#if defined(__x86_64__)
#define AT_SIMD_TABLE at_cpu_simd_avx512
#define AT_SIMD_NAME "avx512"
#include "device/cpu/cpu_simd_impl.h"
#else
typedef int at_cpu_simd_avx512_unused;
#endif
