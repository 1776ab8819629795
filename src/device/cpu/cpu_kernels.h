/* The CPU kernels of every backend operation (see ops/ops.h for the math and
 * shapes). Arguments are already checked by the dispatcher: host tensors of
 * valid shapes and dtypes. Each picks its ISA path at run time. */
#ifndef AT_DEVICE_CPU_KERNELS_H
#define AT_DEVICE_CPU_KERNELS_H

#include "device/backend.h"

/* The table of CPU kernels (static storage). */
const at_backend_ops *at_cpu_ops(void);

#endif
