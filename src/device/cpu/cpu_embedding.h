/* CPU kernels of the embedding lookup and its scatter-add backward (see ops/ops.h). */
#ifndef AT_DEVICE_CPU_CPU_EMBEDDING_H
#define AT_DEVICE_CPU_CPU_EMBEDDING_H

#include "device/backend.h"

at_status at_cpu_embedding_forward(at_tensor *y, const at_tensor *ids, const at_tensor *table);
at_status at_cpu_embedding_backward(at_tensor *dtable, const at_tensor *dy, const at_tensor *ids);

#endif
