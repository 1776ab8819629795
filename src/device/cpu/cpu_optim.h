/* CPU kernels of the AdamW step and the sum of squares (gradient norms); see ops/ops.h. */
#ifndef AT_DEVICE_CPU_CPU_OPTIM_H
#define AT_DEVICE_CPU_CPU_OPTIM_H

#include "device/backend.h"

at_status at_cpu_adamw(at_tensor *param, const at_tensor *grad, at_tensor *m, at_tensor *v,
                       const at_adamw_params *p);
at_status at_cpu_sumsq(at_tensor *out, const at_tensor *x);

#endif
