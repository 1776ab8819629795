/* The int8 decode of the quantized matmul with SDOT (ARMv8.2 dot product:
 * four int8 products summed into each int32 lane in one instruction), for
 * aarch64 CPUs that have it; the rest of the table is the NEON level's.
 * Same contract and the same float arithmetic as cpu_qmatmul_neon.c's. */
#include <arm_neon.h>

/* two SDOTs: each int32 lane sums four products */
#define AT_NEON_DOT32(x0, x1, w0, w1) vdotq_s32(vdotq_s32(vdupq_n_s32(0), (x0), (w0)), (x1), (w1))
#include "device/cpu/cpu_qmatmul_neon_inl.h"

const at_cpu_qgemv at_cpu_qgemv_neon_dotprod = {
    .gemv = at_cpu_gemv_f32_neon, .dotm = at_cpu_dotm_neon, .quant_x = at_cpu_quant_x_neon, .gemv_i8 = neon_gemv_i8};
