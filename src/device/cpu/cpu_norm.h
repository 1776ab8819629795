/* CPU kernels of RMSNorm forward and backward (see ops/ops.h). */
#ifndef AT_DEVICE_CPU_CPU_NORM_H
#define AT_DEVICE_CPU_CPU_NORM_H

#include "device/backend.h"

at_status at_cpu_rmsnorm_forward(at_tensor *y, at_tensor *rstd, const at_tensor *x, const at_tensor *w, float eps);
at_status at_cpu_rmsnorm_backward(at_tensor *dx, at_tensor *dw, const at_tensor *dy, const at_tensor *x,
                                  const at_tensor *w, const at_tensor *rstd);

#endif
