/* CPU kernel of the counter-based dropout (LoRA dropout); see ops/ops.h. */
#ifndef AT_DEVICE_CPU_CPU_DROPOUT_H
#define AT_DEVICE_CPU_CPU_DROPOUT_H

#include "device/backend.h"

at_status at_cpu_dropout(at_tensor *y, const at_tensor *x, float p, uint64_t seed, uint64_t offset);

#endif
