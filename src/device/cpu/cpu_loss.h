/* CPU kernel of the fused cross-entropy (see ops/ops.h). */
#ifndef AT_DEVICE_CPU_CPU_LOSS_H
#define AT_DEVICE_CPU_CPU_LOSS_H

#include "device/backend.h"

at_status at_cpu_cross_entropy(at_tensor *row_loss, at_tensor *dlogits, const at_tensor *logits,
                               const at_tensor *labels, float grad_scale);

#endif
