/* CPU kernel of the batched matmul: a loop over at_cpu_gemm (see ops/ops.h). */
#ifndef AT_DEVICE_CPU_CPU_MATMUL_H
#define AT_DEVICE_CPU_CPU_MATMUL_H

#include "device/backend.h"

at_status at_cpu_matmul(at_tensor *c, const at_tensor *a, const at_tensor *b, int trans_a, int trans_b, float alpha,
                        float beta);

#endif
