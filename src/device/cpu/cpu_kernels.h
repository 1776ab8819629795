/* The CPU kernels of every backend operation: at_cpu_<op> for each operation
 * of device/op_table.h, with its signature there (see ops/ops.h for the math
 * and shapes). Arguments are already checked by the dispatcher: host tensors
 * of valid shapes and dtypes. Each picks its ISA path at run time. They are
 * defined in cpu_<family>.c (cpu_matmul.c, cpu_norm.c, ...). */
#ifndef AT_DEVICE_CPU_KERNELS_H
#define AT_DEVICE_CPU_KERNELS_H

#include "device/backend.h"

#define AT_CPU_KERNEL_DECLARE_(name) at_status at_cpu_##name(AT_OP_PARAMS(name));
AT_BACKEND_OPS(AT_CPU_KERNEL_DECLARE_)
#undef AT_CPU_KERNEL_DECLARE_

/* The table of CPU kernels (static storage). */
const at_backend_ops *at_cpu_ops(void);

/* The largest store of dS tiles (bytes) the attention backward keeps between
 * its two passes (cpu_attention.c); returns the previous limit. Tests set 0
 * to run the path that forms dS twice. Not thread-safe: set it before use. */
size_t at_cpu_attention_ds_store_limit(size_t bytes);

#endif
